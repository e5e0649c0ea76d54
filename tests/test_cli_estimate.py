"""`spyre estimate`: a Hugging Face decoder's latency and memory on the card from its config (timing-only)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_spyre.jobs import estimate

ROOT = Path(__file__).resolve().parents[1]

TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
              "max_position_embeddings": 256, "tie_word_embeddings": True}


def spyre(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != estimate_env()}, **(env or {})}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "torch_spyre.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def estimate_env() -> str:
    from torch_spyre.runtime.timing_only import ENV

    return ENV


def write(tmp_path: Path, data, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.fixture(scope="module")
def tiny_llama_json(tmp_path_factory):
    """``spyre estimate --json`` of TINY_LLAMA at batch 2, prompt 64, on one card and split over two."""
    pytest.importorskip("transformers")
    config = write(tmp_path_factory.mktemp("estimate"), TINY_LLAMA)
    out = {}
    for cards in (1, 2):
        run = spyre("estimate", "--config", config, "--batch", "2", "--prompt", "64", "--new-tokens", "8", "--json",
                    "--cards", str(cards), env={"TORCH_SPYRE_NUM_CARDS": "2"})
        assert run.returncode == 0, run.stderr
        out[cards] = json.loads(run.stdout)
    return out


@pytest.mark.slow
@pytest.mark.models
def test_estimate_of_a_tiny_llama_prints_consistent_json(tiny_llama_json):
    r = tiny_llama_json[1]
    for key in ("prefill_ms", "decode_ms_per_token", "tokens_per_s", "weights_bytes", "kv_bytes_per_token",
                "max_batch_at_prompt"):
        assert r[key] > 0, key
    assert r["tokens_per_s"] == pytest.approx(2 * 1000 / r["decode_ms_per_token"])
    assert r["generate_ms"] == pytest.approx(r["prefill_ms"] + 8 * r["decode_ms_per_token"])
    # Keys and values of 3 layers, 2 KV heads of 32 fp16 values: one 128-byte stick per head and token.
    assert r["kv_bytes_per_token"] == 2 * 3 * 2 * 128
    assert r["kv_bytes_at_prompt"] == r["kv_bytes_per_token"] * 2 * 64
    assert r["max_batch_at_prompt"] == (r["capacity_bytes"] - r["weights_bytes"]) // (r["kv_bytes_per_token"] * 64)
    # Tied embeddings are counted once: embedding 512x128, per layer 4 attention + 3 MLP matrices and two
    # norms, the final norm (fp16; every row here is whole sticks, no padding).
    per_layer = (128 * 128 * 2 + 2 * 64 * 128) + 3 * 128 * 256 + 2 * 128
    assert r["weights_bytes"] == 2 * (512 * 128 + 3 * per_layer + 128)
    # Every layer was launched: the table's kernels add up to the launches, and the cores' busy time
    # is the latency (one stream, nothing else queued).
    for phase, ms in (("prefill", r["prefill_ms"]), ("decode", r["decode_ms_per_token"])):
        lines = [k for k in r["kernels"] if k["phase"] == phase]
        assert sum(k["calls"] for k in lines) == r["launches"][phase]
        assert sum(k["ms_total"] for k in lines) == pytest.approx(ms, rel=1e-9)
        assert sum(k["calls"] for k in lines if k["name"] == "spyre_sdpa") == 3
        assert all(0 < k["roofline_fraction"] <= 1 for k in lines if k["kind"] == "kernel")
    assert "every layer launched" in r["compiled"]
    assert r["cards"] == 1 and r["prefill_collective_ms"] == r["decode_collective_ms"] == 0
    assert r["weights_bytes_total"] == r["weights_bytes"]


@pytest.mark.slow
@pytest.mark.models
def test_two_cards_halve_the_split_weights_and_add_the_modeled_collectives(tiny_llama_json):
    from torch_spyre.card import load_config

    one, two = tiny_llama_json[1], tiny_llama_json[2]
    assert two["cards"] == 2
    # Memory per card: everything but the norms (replicated: 2 per layer and the final one) splits in two; each
    # card holds 1 of the 2 KV heads.
    norms = 2 * (3 * 2 * 128 + 128)
    assert two["weights_bytes"] == (one["weights_bytes"] - norms) // 2 + norms
    assert two["weights_bytes_total"] == 2 * two["weights_bytes"]
    assert two["kv_bytes_per_token"] == one["kv_bytes_per_token"] // 2
    assert two["max_batch_at_prompt"] == (two["capacity_bytes"] - two["weights_bytes"]) // (two["kv_bytes_per_token"] * 64)
    # Time: per phase, the embedding's all-reduce, two all-reduces per layer (3 layers) of the hidden states
    # (tokens x 128 fp16) and a gather of the last position's logits (2 x 1 x 256 fp16: 1024 bytes), on the
    # PCIe peer-to-peer link: a ring all-reduce of B bytes over 2 cards is 2 transfers of B/2.
    cfg = load_config({})
    step = lambda nbytes: cfg.p2p_latency_s + nbytes / cfg.p2p_bandwidth  # noqa: E731
    all_reduce = lambda tokens: 2 * step(tokens * 128 * 2 / 2)  # noqa: E731
    for phase, tokens, key in (("prefill", 2 * 64, "prefill_ms"), ("decode", 2, "decode_ms_per_token")):
        expected = 7 * all_reduce(tokens) + step(2 * 256 * 2)
        assert two[f"{phase}_collective_ms"] == pytest.approx(expected * 1e3, rel=1e-9)
        assert two[f"{phase}_allreduce_ms_per_layer"] == pytest.approx(2 * all_reduce(tokens) * 1e3, rel=1e-9)
        # The latency is the shard's kernels plus the collectives, back to back on one stream.
        kernels = sum(k["ms_total"] for k in two["kernels"] if k["phase"] == phase)
        assert two[key] == pytest.approx(kernels + two[f"{phase}_collective_ms"], rel=1e-9)
        assert kernels > 0
        # Each card does about half the work (flops: 50.5 % in prefill, 51.3 % in decode; norms and rotary
        # tables are replicated). Time is not compared: this tiny shard is fixed-cost bound, and its K/V
        # projections (one 32-wide head) are not whole sticks, so they cannot join the Q projection's matmul
        # group as they do on one card (0.98 ms of kernels against 0.89 ms in prefill).
        work = [sum(k["flops"] * k["calls"] for k in r["kernels"] if k["phase"] == phase) for r in (one, two)]
        assert 0.45 * work[0] < work[1] < 0.55 * work[0], work


def test_the_report_prints_the_figures_and_tables():
    from rich.console import Console

    line = lambda phase, name, calls, us: estimate.KernelLine(phase, name, "kernel", calls, us, calls * us / 1e3,  # noqa: E731
                                                              0.5, "dram-bound", 1e6, 2e6)
    result = estimate.EstimateResult(
        model="m", architecture="llama", layers=2, batch=1, prompt=64, new_tokens=8, prefill_ms=1.0,
        decode_ms_per_token=0.5, tokens_per_s=2000.0, generate_ms=5.0, weights_bytes=2**30, kv_bytes_per_token=1024,
        kv_bytes_at_prompt=65536, max_batch_at_prompt=12, capacity_bytes=2**37, compiled="regional compilation",
        launches={"prefill": 3, "decode": 2},
        kernels=[line("prefill", "spyre_mm", 2, 400.0), line("prefill", "spyre_sdpa", 1, 200.0),
                 line("decode", "spyre_mm", 2, 250.0)])
    console = Console(width=200, record=True)
    estimate.print_report(result, console)
    text = console.export_text()
    for expected in ("prefill latency", "1.000 ms", "decode latency per token (KV length 64)", "0.500 ms/token",
                     "2000.0", "prefill + 8 new tokens", "1.00 GiB", "1,024 bytes", "largest batch", "12",
                     "prefill: 3 launches", "decode: 2 launches", "spyre_sdpa", "50.0%", "dram-bound"):
        assert expected in text, expected


def test_shipped_configs_are_the_published_hyperparameters():
    pytest.importorskip("transformers")
    assert {"granite-3.3-8b", "llama-3.1-8b", "qwen2.5-7b"} <= set(estimate.shipped_models())
    data, name = estimate.read_config(model="granite-3.3-8b")
    g = estimate.build_config(data)
    assert name == "granite-3.3-8b" and g.model_type == "granite"
    assert (g.hidden_size, g.intermediate_size, g.num_hidden_layers, g.num_attention_heads,
            g.num_key_value_heads, g.vocab_size) == (4096, 12800, 40, 32, 8, 49159)
    assert g.tie_word_embeddings and g.embedding_multiplier == 12 and g.attention_multiplier == 0.0078125
    assert g.residual_multiplier == 0.22 and g.logits_scaling == 16 and g.max_position_embeddings == 131072
    assert g.rms_norm_eps == 1e-5 and data["rope_theta"] == 1e7
    llama = estimate.build_config(estimate.read_config(model="llama-3.1-8b")[0])
    assert (llama.hidden_size, llama.intermediate_size, llama.num_hidden_layers, llama.vocab_size) == (4096, 14336, 32, 128256)
    qwen = estimate.build_config(estimate.read_config(model="qwen2.5-7b")[0])
    assert (qwen.hidden_size, qwen.intermediate_size, qwen.num_hidden_layers, qwen.num_key_value_heads,
            qwen.vocab_size) == (3584, 18944, 28, 4, 152064)
    # KV cache of Granite: 40 layers x keys and values x 8 heads x 128 fp16 values = 160 KiB per token.
    assert estimate.kv_bytes_per_token(g, 40, 512) == 40 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, expected a Hugging Face config object"),
    ({"hidden_size": 64}, 'the config has no "model_type"'),
    ({**TINY_LLAMA, "model_type": "gpt2"}, "unknown architecture 'gpt2': spyre estimate knows granite, llama, qwen2"),
    ({**TINY_LLAMA, "model_type": "no-such-model"}, "unknown architecture 'no-such-model'"),
    ({**TINY_LLAMA, "num_attention_heads": 5}, "cannot build a llama config: Class validation error for validator "
                                               "'validate_architecture': ValueError: The hidden size (128) is not a "
                                               "multiple of the number of attention heads (5)."),
    ({**TINY_LLAMA, "hidden_size": "wide"}, "expected int, got str"),
    ({**TINY_LLAMA, "num_hidden_layers": 0}, "num_hidden_layers must be positive integers"),
])
def test_a_bad_config_gives_one_line_and_exit_code_2(tmp_path, content, message, capsys):
    pytest.importorskip("transformers")
    from torch_spyre import cli

    code = cli.main(["estimate", "--config", write(tmp_path, content), "--json"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("spyre estimate: ") and message in err, err


def test_a_missing_file_or_bad_arguments_exit_2(tmp_path, capsys):
    from torch_spyre import cli

    assert cli.main(["estimate", "--config", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err and "missing.json" in err
    for args in (["estimate"], ["estimate", "--model", "gpt-9"], ["estimate", "--model", "granite-3.3-8b", "--batch", "0"]):
        with pytest.raises(SystemExit) as e:
            cli.main(args)
        assert e.value.code == 2
    capsys.readouterr()


def test_a_tensor_parallel_shard_divides_heads_mlp_and_vocabulary():
    pytest.importorskip("transformers")
    full = estimate.build_config(TINY_LLAMA)
    shard = estimate.build_config(estimate.shard_config(TINY_LLAMA, full, 1))
    assert shard.num_attention_heads == 4
    with_cards(8)
    data = estimate.shard_config(TINY_LLAMA, full, 2)
    assert {k: data[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                                 "vocab_size", "hidden_size")} == {
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
        "vocab_size": 256, "hidden_size": 128}
    shard = estimate.build_config(data)
    assert shard.head_dim == 32 and shard.num_hidden_layers == 3
    # 2 KV heads over 4 cards: replicated, one per card (as vLLM does).
    assert estimate.shard_config(TINY_LLAMA, full, 4)["num_key_value_heads"] == 1


def with_cards(n: int) -> None:
    """This process's simulated system has ``n`` cards (the test's monkeypatch puts the configuration back)."""
    from torch_spyre.card import load_config
    from torch_spyre.device import cards

    cards._config = load_config({}, num_cards=n)


@pytest.fixture(autouse=True)
def _restore_card_config(monkeypatch):
    from torch_spyre.device import cards

    monkeypatch.setattr(cards, "_config", cards._config)


@pytest.mark.parametrize("cards, system, change, message", [
    ("0", 8, {}, "--cards must be at least 1, got 0"),
    ("-2", 8, {}, "--cards must be at least 1, got -2"),
    ("9", 8, {}, "--cards 9: the simulated system has 8 card(s) (num_cards); set TORCH_SPYRE_NUM_CARDS=9"),
    ("2", 1, {}, "--cards 2: the simulated system has 1 card(s) (num_cards); set TORCH_SPYRE_NUM_CARDS=2"),
    ("8", 8, {}, "--cards 8: the 4 attention heads do not split evenly over 8 cards"),
    ("2", 8, {"num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 192},
     "--cards 2: the 3 KV heads neither split evenly over 2 cards nor replicate evenly onto them"),
    ("2", 8, {"intermediate_size": 255}, "--cards 2: the MLP's intermediate size 255 does not split evenly"),
])
def test_bad_card_counts_give_one_line_and_exit_code_2(tmp_path, capsys, cards, system, change, message):
    pytest.importorskip("transformers")
    from torch_spyre import cli

    with_cards(system)
    code = cli.main(["estimate", "--config", write(tmp_path, {**TINY_LLAMA, **change}), "--cards", cards, "--json"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("spyre estimate: ") and message in err, err


def test_kv_bytes_per_token_counts_stick_padding():
    pytest.importorskip("transformers")
    cfg = estimate.build_config({**TINY_LLAMA, "hidden_size": 80 * 4, "intermediate_size": 64})
    # head_dim 80 fp16 = 160 bytes: two sticks per head and token on the card.
    assert estimate.kv_bytes_per_token(cfg, 3, 64) == 2 * 3 * 2 * 256
    assert math.isclose(estimate.kv_bytes_per_token(cfg, 3, 64) / (2 * 3 * 2 * 80 * 2), 1.6)


@pytest.mark.slow
@pytest.mark.models
def test_a_shrunk_granite_runs_with_its_multipliers_and_tied_embeddings():
    """Granite's config with small dimensions: the multipliers and the tied LM head compile and run."""
    pytest.importorskip("transformers")
    data, _ = estimate.read_config(model="granite-3.3-8b")
    small = {**data, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 1000, "eos_token_id": 0}
    r = estimate.run(estimate.EstimateOptions(small, "granite-small", batch=1, prompt=64, new_tokens=4))
    assert r.architecture == "granite" and r.prefill_ms > 0 and r.decode_ms_per_token > 0
    # The embedding (1000 x 128) is the LM head too: counted once.
    per_layer = (128 * 128 * 2 + 2 * 64 * 128) + 3 * 128 * 256 + 2 * 128
    assert r.weights_bytes == 2 * (1000 * 128 + 2 * per_layer + 128)
    assert sum(k.calls for k in r.kernels if k.phase == "decode" and k.name == "spyre_sdpa") == 2

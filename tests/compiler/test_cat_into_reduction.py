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
"""

from __future__ import annotations

import pytest
import torch

from .spyre_compile_helpers import TOL, fresh


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

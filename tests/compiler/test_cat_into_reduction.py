"""A concatenation feeding a reduction in one fused kernel: ViT-MSN's and YOLOS's embeddings (the class token
concatenated in front of the transposed patch embeddings, plus the position embeddings) feeding the first
LayerNorm. Compiled, the whole output was zeros (coverage: compiled cosine 0 while eager passes); the same
kernel without the LayerNorm, or the LayerNorm without the cat, is right. Found by the coverage sweep, not
fixed yet: the test is a strict xfail so it fails (XPASS) once the codegen is fixed."""

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


@pytest.mark.xfail(strict=True, reason="a cat (guarded loads of a transposed operand) feeding a reduction "
                                       "(LayerNorm) in one fused kernel computes zeros")
def test_cat_into_a_layer_norm():
    _check(norm=True)

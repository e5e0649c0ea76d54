"""relayout.py: the same tensor under another stick dimension, on the card, bit-exact."""

from __future__ import annotations

import pytest
import torch

import torch_spyre
from torch_spyre.card import StickLayout, load_config
from torch_spyre.compiler.relayout import RelayoutError, relayout, relayout_program
from torch_spyre.program import DmaLoad


@pytest.mark.parametrize("shape,dim", [((128, 96), 0), ((4, 70, 130), 1), ((3, 64, 64), 0)])
def test_relayout_keeps_values(shape, dim):
    torch_spyre.reset_fallback_stats()
    x = torch.randn(*shape).half()
    xs = x.to("spyre")
    y = relayout(xs, dim)
    assert torch_spyre.get_layout(y).stick_layout.stick_dim == dim % len(shape)
    assert torch.equal(y.cpu(), xs.cpu())
    assert dict(torch_spyre.fallback_stats()) == {}


def test_relayout_program_reads_stick_blocks():
    src, dst = StickLayout((256, 256), 1, "dlfloat16"), StickLayout((256, 256), 0, "dlfloat16")
    program = relayout_program(src, dst, load_config())
    assert program.metadata["decisions"]["kind"] == "relayout"
    loads = [i for _, _, i in program.instructions() if isinstance(i, DmaLoad)]
    assert loads and all(i.pattern.sticks >= 2 for i in loads)  # whole stick blocks, not single elements
    with pytest.raises(RelayoutError, match="keeps the host shape"):
        relayout_program(src, StickLayout((256, 128), 0, "dlfloat16"), load_config())

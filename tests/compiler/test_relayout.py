"""relayout.py: the same tensor under another stick dimension, on the card, bit-exact."""

from __future__ import annotations

import pytest
import torch

import torch_spyre
from torch_spyre.card import StickLayout, load_config
from torch_spyre.compiler.relayout import RelayoutError, relayout, relayout_in_place, relayout_program
from torch_spyre.device import storage, tensor
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


def test_relayout_in_place_keeps_every_view():
    torch_spyre.reset_fallback_stats()
    xs = torch.randn(192, 128).half().to("spyre")
    view = xs[5:70].t()
    before, before_view = xs.cpu(), view.cpu()
    record = relayout_in_place(xs, 0, "test")
    # The program took its simulated time and moved the tensor once: 192 x 128 fp16 sticks, read and written.
    assert record.duration == pytest.approx(record.timing.total_s, rel=1e-12) and record.duration > 0
    assert record.stats.total_dma_read_bytes == record.stats.total_dma_write_bytes == 192 * 128 * 2
    assert torch_spyre.get_layout(xs).stick_layout.stick_dim == 0
    assert torch.equal(xs.cpu(), before) and torch.equal(view.cpu(), before_view)
    assert relayout_in_place(xs, 0) is None  # already sticked there: nothing runs
    assert dict(torch_spyre.fallback_stats()) == {}


def test_relayout_in_place_refuses_what_it_cannot_do():
    with pytest.raises(RelayoutError, match="expects a spyre tensor"):
        relayout_in_place(torch.zeros(4, 4), 0)
    w = torch.randn(100, 128).half().to("spyre")  # sticked on dim 0, 100 rows pad to 128: more bytes
    with pytest.raises(RelayoutError, match="needs 32768 device bytes, its allocation has 25600"):
        relayout_in_place(w, 0)


def test_replace_layout_checks_shape_and_size():
    xs = torch.randn(64, 64).half().to("spyre")
    alloc = storage.allocation_of(xs)
    with pytest.raises(ValueError, match="keeps the host shape"):
        tensor.replace_layout(alloc, StickLayout((32, 128), 0, "dlfloat16"), alloc)
    small = torch.randn(100, 64).half().to("spyre")
    with pytest.raises(ValueError, match="relayout into a new tensor instead"):
        tensor.replace_layout(storage.allocation_of(small), StickLayout((100, 64), 0, "dlfloat16"), alloc)

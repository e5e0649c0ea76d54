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


def _instructions(program) -> list[str]:
    return [repr(i) for _, _, i in program.instructions()]


def test_overflow_proof_skips_tile_attempts_without_changing_the_program(monkeypatch):
    """A weight too big for one tile: the first attempts are refused from the first tiles' DMA buffers
    (a lower bound of the plan), not by generating the whole program; the program is the one the
    attempt-by-attempt search writes."""
    from torch_spyre.compiler.codegen.pointwise import generator

    src, dst = StickLayout((1536, 384), 1, "dlfloat16"), StickLayout((1536, 384), 0, "dlfloat16")
    # A small scratchpad, so that the first tiles overflow (with the default one the first tile fits on
    # the cores this kernel gets), and the proof on for this small kernel too.
    config = load_config().model_copy(update={"scratchpad_plannable_bytes": 200_000})
    builds = []
    real = generator.PointwiseGenerator._build
    monkeypatch.setattr(generator.PointwiseGenerator, "_build", lambda self, *a: builds.append(a[1]) or real(self, *a))
    monkeypatch.setattr(generator, "_PROOF_MIN_ELEMENTS", 1)
    proved = relayout_program(src, dst, config)
    assert len(builds) == 1  # only the tile that fits was built
    monkeypatch.setattr(generator, "_PROOF_MIN_ELEMENTS", 1 << 62)
    built = relayout_program(src, dst, config)
    assert len(builds) > 2
    assert _instructions(proved) == _instructions(built)
    a, b = proved.metadata["decisions"], built.metadata["decisions"]
    assert a["tiling"] == b["tiling"] and len(a["alternatives"]) == len(b["alternatives"])
    for lower, full in zip(a["alternatives"], b["alternatives"]):
        assert lower["result"].startswith("needs at least")
        assert int(lower["result"].split()[3]) <= int(full["result"].split()[1])


def test_repeated_tiles_share_their_boxes(monkeypatch):
    """Tiles at different offsets of a regular tensor have the same scratchpad positions: their boxes are
    worked out once (the generator's host cost follows the distinct tiles, the program's size all of them)."""
    from torch_spyre.compiler.codegen.pointwise import analysis

    computed = []
    real = analysis.KernelGen._partition
    monkeypatch.setattr(analysis.KernelGen, "_partition", lambda self, *a: computed.append(a[0]) or real(self, *a))
    program = relayout_program(StickLayout((2048, 512), 1, "dlfloat16"), StickLayout((2048, 512), 0, "dlfloat16"),
                               load_config())
    tiles = program.metadata["decisions"]["tiling"]
    n_tiles = len(program.cores) * -(-2048 // len(program.cores) // tiles["tile"][0])
    assert n_tiles >= 4 and len(computed) < n_tiles


@pytest.mark.parametrize("shape,scratchpad", [((1600, 256), 40000), ((2, 400, 192), 30000), ((320, 300), 30000)])
def test_translated_tiles_give_the_program_of_tile_by_tile_analysis(monkeypatch, shape, scratchpad):
    """A tile whose device elements are an earlier tile's moved by whole sticks (same lane phase) takes that
    tile's positions, boxes and DMA patterns moved along (access.translated): the program is the one that
    analysing every tile on its own writes."""
    from torch_spyre.compiler import access

    config = load_config().model_copy(update={"scratchpad_plannable_bytes": scratchpad})
    src, dst = StickLayout(shape, len(shape) - 1, "dlfloat16"), StickLayout(shape, 0, "dlfloat16")
    hits = []
    real = access.translated
    monkeypatch.setattr(access, "translated", lambda *a: (lambda t: hits.append(t is not None) or t)(real(*a)))
    reused = relayout_program(src, dst, config)
    assert sum(hits) > 100  # most tiles were translations
    monkeypatch.setattr(access, "translated", lambda *a: None)
    alone = relayout_program(src, dst, config)
    assert _instructions(reused) == _instructions(alone)
    assert reused.metadata["decisions"] == alone.metadata["decisions"]


def _owners_disjoint_by_concatenation(gen, cboxes) -> bool:
    """The owner check as first written: every box's sticks, concatenated, are distinct."""
    import numpy as np

    from torch_spyre.card.layout import sorted_unique

    for v in (v for v in gen.dag.values if v.op == "store" and v.attrs["buffer"] not in gen.spec.internal):
        whole = gen._store_sticks(v)
        sticks = [sorted_unique(whole[tuple(slice(o, o + n) for o, n in zip(xo, xs))]) for xo, xs in cboxes]
        allst = np.concatenate(sticks)
        if sorted_unique(allst).size != allst.size:
            return False
    return True


def test_owner_check_stopping_at_the_first_shared_stick_agrees_with_the_full_check():
    from torch_spyre.compiler.access import TensorView
    from torch_spyre.compiler.codegen.pointwise.generator import PointwiseGenerator
    from torch_spyre.compiler.codegen.pointwise.tiling import core_boxes, split_counts
    from torch_spyre.compiler.relayout import relayout_spec

    answers = []
    for shape, dst_dim in [((300, 200), 0), ((6, 1024), 0), ((3, 70, 130), 1), ((96, 64), 1), ((256, 96), 0)]:
        src, dst = StickLayout(shape, len(shape) - 1, "dlfloat16"), StickLayout(shape, dst_dim, "dlfloat16")
        gen = PointwiseGenerator(relayout_spec(shape, "dlfloat16"), {"src": TensorView.whole("src", src),
                                                                     "dst": TensorView.whole("dst", dst)}, load_config())
        sizes = list(shape)
        for cores in (32, 20, 16, 7, 4, 2):
            for unit in (1, 64, sizes[-1]):
                cboxes = core_boxes(sizes, split_counts(sizes, cores, unit), unit)
                if len(cboxes) > 1:
                    answers.append(gen._owners_disjoint(cboxes))
                    assert answers[-1] == _owners_disjoint_by_concatenation(gen, cboxes), (shape, cores, unit)
    assert set(answers) == {True, False}  # divisions that share sticks and divisions that do not

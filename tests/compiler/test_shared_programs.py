"""Kernels of the same content share one prepared program (``kernel_runtime._SharedPrograms``): a model's
repeated blocks compile to kernels that differ only in their names (Inductor numbers kernels, buffers
and scheduler nodes), and the program is generated, validated, timed and proved once, then launched
under each kernel's own name and operand names."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torch_spyre.profiler
from torch_spyre.compiler import optimizations, wrapper
from torch_spyre.program import DmaGather, DmaLoad, DmaStore

from .spyre_compile_helpers import TOL, fresh


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return x + torch.relu(self.fc(self.norm(x)))


def _without_operand_names(program):
    def plain(ins):
        if isinstance(ins, (DmaLoad, DmaGather)):
            return (type(ins).__name__, ins.src.offset, repr(ins.pattern), ins.sp_offset)
        if isinstance(ins, DmaStore):
            return (type(ins).__name__, ins.dst.offset, repr(ins.pattern), ins.sp_offset)
        return ins

    return {core: [plain(i) for i in ins] for core, ins in program.cores.items()}


def test_repeated_blocks_share_programs_under_their_own_names(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block()).half().eval()
    for p in model.parameters():  # other weights in each block: the sharing is of programs, not data
        nn.init.normal_(p, std=0.2)
    x = torch.randn(4, 16, 64).half()
    expected = model.float()(x.float())
    spyre = model.half().to("spyre")
    fresh()
    wrapper.reset_shape_cache_stats()
    compiled = torch.compile(spyre)
    with torch.no_grad():
        compiled(x.to("spyre"))  # compiles and runs (the first launches prove the programs)
        stats = wrapper.shape_cache_stats()
        with torch_spyre.profiler.profile() as prof:
            got = compiled(x.to("spyre")).cpu()
    torch.testing.assert_close(got.float(), expected, **TOL[torch.float16])
    # The second block's kernels ran fast from their first launch (the shared program was proved by the
    # first block's): run every launch both ways now, any differing byte raises.
    monkeypatch.setenv("TORCH_SPYRE_CHECK", "compare")
    with torch.no_grad():
        assert torch.equal(compiled(x.to("spyre")).cpu(), got)
    monkeypatch.delenv("TORCH_SPYRE_CHECK")
    assert stats["shared"] >= 2, stats  # the second block's kernels took the first block's programs
    kernels = [r for r in prof.events() if r.kind == "kernel"]
    assert len({r.name for r in kernels}) == len(kernels)  # each kernel launches under its own name
    # Each kernel's program names that kernel and its own operands; shared ones differ in nothing else.
    by_kernel = {}
    for k in _kernels_named({r.name for r in kernels}):
        for prepared in k._prepared.values():
            assert prepared.name == k.name and prepared.program.name == k.name
            assert set(prepared.operand_names) <= {b.name for b in k.spec.buffers}
            by_kernel[k.name] = prepared
    shared = [(a, b) for a in by_kernel.values() for b in by_kernel.values()
              if a is not b and a.executor is b.executor]
    assert shared
    for a, b in shared:
        assert a.operand_names != b.operand_names or a.name != b.name
        assert _without_operand_names(a.program) == _without_operand_names(b.program)
        assert a.duration == b.duration


def _kernels_named(names: set[str]) -> list:
    import gc

    return [o for o in gc.get_objects() if type(o) is wrapper.SpyreKernel and o.name in names and o._prepared]


def test_programs_made_under_other_switches_are_not_shared():
    """A program generated with an optimization switched off is another program: the same kernels run
    under the switch generate every content again (and share among themselves), taking none of the
    programs made with it on."""
    from torch_spyre.compiler import optimizations

    torch.manual_seed(0)
    spyre = nn.Sequential(Block(), Block()).half().eval().to("spyre")
    x = torch.randn(3, 20, 64).half().to("spyre")  # a shape no other test's live kernels were made for
    fresh()
    wrapper.reset_shape_cache_stats()
    compiled = torch.compile(spyre)
    with torch.no_grad():
        expected = compiled(x).cpu()
        before = wrapper.shape_cache_stats()
        with optimizations.disabled("ring_sharing"):
            got = compiled(x).cpu()
    after = wrapper.shape_cache_stats()
    generated = before["programs"] - before["shared"]
    assert before["shared"] >= 2 and generated >= 2, before
    assert after["programs"] - after["shared"] == 2 * generated, (before, after)  # every content anew
    assert after["shared"] == 2 * before["shared"], (before, after)  # the second block's, from the first's
    torch.testing.assert_close(got, expected, **TOL[torch.float16])


def test_an_error_in_a_shared_program_names_its_own_kernel():
    """Two embeddings of one shape share a program; a bad index in the second names the second's kernel.
    (embedding_group would run both lookups as one kernel: switched off, so each has its own.)"""

    class TwoLookups(nn.Module):
        def __init__(self):
            super().__init__()
            self.e1, self.e2 = nn.Embedding(10, 64), nn.Embedding(10, 64)

        def forward(self, i, j):
            return self.e1(i) * 2, self.e2(j) * 2

    from torch_spyre.card.execute import ExecutionError

    fresh()
    wrapper.reset_shape_cache_stats()
    compiled = torch.compile(TwoLookups().half().to("spyre"))
    good = torch.tensor([1, 2, 3]).to("spyre")
    with torch.no_grad(), optimizations.disabled("embedding_group"):
        compiled(good, good)
        assert wrapper.shape_cache_stats()["shared"] >= 1
        with torch_spyre.profiler.profile() as prof:
            compiled(good, good)
        names = [r.name for r in prof.events() if r.kind == "kernel"]
        with pytest.raises(ExecutionError, match="gather index 50") as err:
            compiled(good, torch.tensor([4, 50, 6]).to("spyre"))
    failing = str(err.value).split(":")[0]
    assert failing in names and failing != names[0], (failing, names)  # the second lookup's kernel

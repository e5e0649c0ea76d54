"""Eager programs of views covering whole rows are not specialized on the row offset (compiler/row_views.py)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import torch_spyre
from torch_spyre.card.layout import StickLayout
from torch_spyre.compiler import eager, kernel_runtime, optimizations, wrapper
from torch_spyre.compiler.row_views import extent_bytes, row_shift
from torch_spyre.device.storage import allocation_of

from .spyre_compile_helpers import eager_compile_mode


@pytest.fixture(autouse=True)
def compile_mode(monkeypatch):
    eager_compile_mode(monkeypatch, fresh_cache=True)
    yield


def _x(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _on_card_only():
    stats = torch_spyre.fallback_stats()
    assert stats.host == {} and wrapper.host_fallback_stats() == {}, stats.host


def _shift(t: torch.Tensor) -> int | None:
    return row_shift(allocation_of(t).meta["layout"], tuple(t.shape), t.stride(), t.storage_offset())


# --- the rule --------------------------------------------------------------------------------------
def test_row_shift_is_the_device_offset_of_the_first_row_and_none_for_other_views():
    lay = StickLayout((64, 64), 1, "float32")  # device [2 sticks, 64 rows, 32 lanes]: rows interleaved
    assert row_shift(lay, (64,), (1,), 0) == 0
    assert row_shift(lay, (64,), (1,), 5 * 64) == 5 * 32  # row 5: five sticks on
    assert row_shift(lay, (3, 64), (64, 1), 60 * 64) == 60 * 32
    assert row_shift(lay, (5, 64), (64, 1), 60 * 64) is None  # past the last row
    assert row_shift(lay, (64,), (1,), 5) is None  # inside a stick
    assert row_shift(lay, (32,), (1,), 64) is None  # part of a row
    assert row_shift(lay, (64,), (64,), 3) is None  # a column
    assert row_shift(lay, (64, 64), (1, 64), 0) is None  # transposed
    assert row_shift(StickLayout((64, 64), 0, "float32"), (64,), (1,), 64) is None  # sticked on dim 0
    assert row_shift(StickLayout((64,), 0, "float32"), (32,), (1,), 32) is None  # 1-d: no rows
    lay3 = StickLayout((4, 6, 100), 2, "dlfloat16")  # padded rows; device [6, 2 sticks, 4, 64 lanes]
    assert row_shift(lay3, (6, 100), (100, 1), 2 * 600) == 2 * 64
    assert row_shift(lay3, (2, 100), (100, 1), 600 + 300) == 3 * (2 * 4 * 64) + 64
    assert row_shift(lay3, (4, 100), (100, 1), 600 + 300) is None  # rows 3..6 of a dim of 6
    # What a view at offset 0 reaches: through the last stick of its last element.
    assert extent_bytes(lay, 64) == (64 + 1) * 128
    assert extent_bytes(lay, 64 * 64) == lay.nbytes


def test_the_program_of_a_row_reaches_only_its_declared_extent():
    x = torch.randn(64, 64).to("spyre")
    kernels = []
    run = kernel_runtime.SpyreKernel.run

    def spy(self, **args):
        kernels.append(self)
        return run(self, **args)

    kernel_runtime.SpyreKernel.run = spy
    try:
        _ = x[7] + 1
    finally:
        kernel_runtime.SpyreKernel.run = run
    (launch,) = [k.last_launch for k in kernels]
    (prepared,) = [p for k in kernels for p in k._prepared.values()]
    nbytes = dict(zip(prepared.operand_names, prepared.operand_nbytes.tolist()))
    (row,) = [n for n, a in launch.addresses.items() if a == allocation_of(x).address + 7 * 128]  # row 7: 7 sticks on
    assert nbytes[row] == (64 + 1) * 128  # sticks 0 and 64 of the layout, not its 256 sticks


def test_switched_off_every_row_compiles_as_before():
    xc = _x(8, 64)
    x = xc.to("spyre")
    with optimizations.disabled("row_views"):
        for i in range(3):
            assert torch.equal((x[i] + 1).cpu(), xc[i] + 1)
        assert eager.signature(torch.ops.aten.neg.default, (x[3],), {}, 0)[1][0][3] == 3 * 64
    assert eager.cache_stats()["compiles"] == 3
    assert kernel_runtime.shape_cache_stats()["programs"] == 3


# --- reads ---------------------------------------------------------------------------------------
def test_rows_of_a_2d_tensor_compile_once():
    xc = _x(64, 64)
    x = xc.to("spyre")
    for i in range(6):
        assert torch.equal((x[i] + 1).cpu(), xc[i] + 1)
    stats = eager.cache_stats()
    assert (stats["compiles"], stats["hits"]) == (1, 5)
    assert kernel_runtime.shape_cache_stats()["programs"] == 1
    _on_card_only()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_ranges_of_a_3d_tensor_at_several_offsets(dtype):
    xc = _x(4, 6, 100, dtype=dtype)  # 100 elements a row: padded sticks
    x = xc.to("spyre")
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for i in range(4):
        torch.testing.assert_close(torch.exp(x[i]).cpu().float(), torch.exp(xc[i].float()), **tol)
    for i, j in [(0, 0), (1, 3), (3, 4), (2, 1)]:
        torch.testing.assert_close((x[i, j:j + 2] * 2).cpu().float(), xc[i, j:j + 2].float() * 2, **tol)
    stats = eager.cache_stats()
    assert stats["compiles"] == 2 and stats["hits"] == 6
    _on_card_only()


def test_read_only_views_of_one_storage_stay_correct_together():
    xc = _x(16, 64)
    x = xc.to("spyre")
    for i, j in [(0, 1), (3, 3), (5, 2), (15, 0)]:
        assert torch.equal((x[i] + x[j]).cpu(), xc[i] + xc[j])
    assert eager.cache_stats()["compiles"] == 1
    _on_card_only()


def test_stack_and_cat_of_permuted_rows_compile_once():
    ec = _x(8, 384)
    e = ec.to("spyre")
    perms = list(itertools.permutations(range(8)))
    random.Random(0).shuffle(perms)
    for p in perms[:4]:
        assert torch.equal(torch.stack([e[k] for k in p]).cpu(), ec[list(p)])
        assert torch.equal(torch.cat([e[k:k + 1] for k in p]).cpu(), ec[list(p)])
    stats = eager.cache_stats()
    assert (stats["compiles"], stats["hits"]) == (2, 6)
    assert kernel_runtime.shape_cache_stats()["programs"] == 2
    _on_card_only()


# --- writes --------------------------------------------------------------------------------------
def test_out_writes_into_rows_leave_their_neighbours():
    xc = _x(16, 64)
    x = xc.to("spyre")
    for i in (0, 5, 15):
        zc = _x(64, seed=i + 1)
        torch.mul(zc.to("spyre"), 3.0, out=x[i])
        torch.mul(zc, 3.0, out=xc[i])
        assert torch.equal(x.cpu(), xc)
    stats = eager.cache_stats()
    assert (stats["compiles"], stats["hits"]) == (1, 2)
    _on_card_only()


def test_in_place_writes_into_rows_leave_their_neighbours():
    # (An in-place op on a view, ``add.out(v, z, out=v)``, does not compile today and runs on the host,
    # as before these rows were placed at offset 0: only its values are checked here.)
    xc, zc = _x(3, 4, 64), _x(4, 64, seed=1)
    x, z = xc.to("spyre"), zc.to("spyre")
    for i in range(3):
        x[i].sub_(z)
        xc[i].sub_(zc)
        x[i, 1].add_(z[0])
        xc[i, 1].add_(zc[0])
        assert torch.equal(x.cpu(), xc)


# --- views placed where they lie, as before -------------------------------------------------------
def test_views_that_are_not_whole_rows_keep_their_offsets_and_stay_correct():
    xc = _x(64, 64)
    x = xc.to("spyre")
    flat, flatc = x.view(-1), xc.view(-1)
    views = [(flat[5:69], flatc[5:69]), (flat[6:70], flatc[6:70]),  # inside a stick
             (x[:, 3], xc[:, 3]), (x[:, 4], xc[:, 4]),  # columns
             (x[:, 32:], xc[:, 32:]), (x[2:5].t(), xc[2:5].t())]  # a column slice, transposed
    for v, vc in views:
        assert _shift(v) is None
        assert torch.equal((v * 3).cpu(), vc * 3)
    assert eager.cache_stats()["compiles"] == len(views)  # one per placement, as before
    _on_card_only()


def test_a_written_row_read_through_another_view_keeps_its_place():
    xc = _x(8, 64)
    x = xc.to("spyre")
    torch.add(x[1], 1, out=x[2])  # a written argument overlapping another: the host, as before
    torch.add(xc[1], 1, out=xc[2])
    assert torch.equal(x.cpu(), xc)
    assert "overlaps another argument" in eager.host_reasons().get("add.out", "")


def test_a_view_of_another_dtype_keeps_its_offset():
    x = torch.randn(8, 64).to("spyre")
    v = x.view(torch.int32)[3]
    alloc = allocation_of(v)
    assert alloc.meta["dtype"] is not v.dtype
    assert eager.signature(torch.ops.aten.neg.default, (v,), {}, 0)[1][0][3] == v.storage_offset()
    assert eager.signature(torch.ops.aten.neg.default, (x[3],), {}, 0)[1][0][3] == "rows"


# --- timing-only ---------------------------------------------------------------------------------
def test_rows_in_timing_only_mode():
    xc = _x(32, 64)
    with torch_spyre.timing_only():
        x = xc.to("spyre")  # charged, not stored
        outs = [x[i] + 1 for i in (0, 9, 31)]
    assert not any(allocation_of(o).has_data for o in outs)
    stats = eager.cache_stats()
    assert (stats["compiles"], stats["hits"]) == (1, 2)
    y = xc.to("spyre")
    assert torch.equal((y[9] + 1).cpu(), xc[9] + 1)  # the same program, run for real
    assert eager.cache_stats()["compiles"] == 1


# --- fp32 weights split once (weight_parts.py) ------------------------------------------------------
def test_weight_parts_of_row_ranges_are_split_per_range_by_one_program():
    from torch_spyre.compiler import weight_parts

    weight_parts.clear()
    ac, wc = _x(8, 64), _x(192, 64, seed=1)
    a, w = ac.to("spyre"), wc.to("spyre")
    before = weight_parts.stats()
    for i in (0, 64, 128):
        torch.testing.assert_close((a @ w[i:i + 64]).cpu(), ac @ wc[i:i + 64], rtol=1e-4, atol=1e-4)
    for i in (0, 64, 128):  # each range's own parts again (they are keyed by where B lies)
        torch.testing.assert_close((a @ w[i:i + 64]).cpu(), ac @ wc[i:i + 64], rtol=1e-4, atol=1e-4)
    after = weight_parts.stats()
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (3, 3)
    assert eager.cache_stats()["compiles"] == 2  # the split and the matmul on the parts, once each
    _on_card_only()


# --- compiled graphs bind their inputs the same way ---------------------------------------------------
def test_a_compiled_graph_on_rows_generates_one_program():
    xc = _x(16, 64)
    x = xc.to("spyre")
    f = torch.compile(lambda v: (v * 2 + 1).softmax(-1), dynamic=False)
    for i in (0, 3, 9, 15):
        torch.testing.assert_close(f(x[i]).cpu(), (xc[i] * 2 + 1).softmax(-1), rtol=1e-5, atol=1e-6)
    stats = kernel_runtime.shape_cache_stats()
    assert (stats["programs"], stats["hits"]) == (1, 3)

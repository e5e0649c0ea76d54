"""access.py: index evaluation, stick sets, DMA patterns and affine views, on exact small cases."""

from __future__ import annotations

import numpy as np
import pytest

from torch_spyre.card import StickLayout
from torch_spyre.compiler import access
from torch_spyre.compiler.access import AccessError, TensorView


def grid(*shape):
    return np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")


def test_evaluate_inductor_index_functions():
    x0, x1 = grid(4, 6)
    v = {"x0": x0, "x1": x1}
    np.testing.assert_array_equal(access.evaluate("6*x0 + x1", v), 6 * x0 + x1)
    np.testing.assert_array_equal(access.evaluate("FloorDiv(x1, 4)", v), x1 // 4)
    np.testing.assert_array_equal(access.evaluate("ModularIndexing(x0 + 6*x1, 3, 5)", v), ((x0 + 6 * x1) // 3) % 5)
    np.testing.assert_array_equal(access.evaluate("Min(x0, x1)", v), np.minimum(x0, x1))
    np.testing.assert_array_equal(access.evaluate("floor(x1/2) + 3*x0", v), x1 // 2 + 3 * x0)
    with pytest.raises(AccessError, match="no value"):
        access.evaluate("x2 + 1", v)


def test_device_elements_follow_the_layout_and_offset():
    lay = StickLayout((5, 100, 150), 2, "dlfloat16")
    place = TensorView.whole("t", lay, 150)
    host = np.arange(10)
    np.testing.assert_array_equal(access.device_elements(place, host), lay.device_offsets(host + 150))
    with pytest.raises(AccessError, match="outside its allocation"):
        access.device_elements(place, np.array([lay.numel]))


def test_stick_set_positions_and_patterns():
    lay = StickLayout((8, 128), 1, "dlfloat16")  # device [2 sticks, 8 rows, 64]
    place = TensorView.whole("t", lay)
    r, c = grid(8, 128)
    dev = access.device_elements(place, 128 * r + c)
    ss = access.stick_set(place, dev)
    assert ss.sticks.tolist() == list(range(16))
    pats = access.stick_patterns(ss.sticks)
    assert len(pats) == 1 and pats[0][2].sticks == 16
    # two rows only: sticks {r, 8 + r}: one two-level pattern
    sub = access.stick_set(place, dev[2:4])
    (first, rank, pat), = access.stick_patterns(sub.sticks)
    assert (first, rank, pat.shape, pat.dram_strides) == (2, 0, (2, 2), (8 * 128, 128))


def test_affine_views_split_rows_at_stick_boundaries():
    lay = StickLayout((8, 256), 1, "float32")  # 32 lanes, 8 sticks per row
    place = TensorView.whole("t", lay)
    r, c = grid(4, 256)
    pos = access.stick_set(place, access.device_elements(place, 256 * r + c)).position
    assert access.affine_strides(pos) is None
    splits = access.choose_splits([pos])
    shape, _ = access.refine_shape(pos.shape, splits)
    assert shape == (4, 8, 32)
    # Within the 4-row x 8-stick set: the next row is the next stick (32 lanes), the next stick 4 rows on.
    assert access.affine_strides(pos.reshape(shape)) == (0, (32, 128, 1))


def test_transposed_read_is_affine_in_blocks():
    lay = StickLayout((64, 64), 1, "dlfloat16")
    place = TensorView.whole("t", lay)
    i, j = grid(64, 64)
    pos = access.stick_set(place, access.device_elements(place, 64 * j + i)).position  # a.T
    base, strides = access.affine_strides(pos)
    assert strides == (1, 64)


def test_split_points_and_uniform_split():
    p = np.r_[np.arange(10), 100 + np.arange(10)]
    assert access.split_point(p) == (0, 10)
    m = np.r_[np.ones(7, bool), np.zeros(5, bool)]
    assert access.uniform_split(m) == (0, 7)
    assert access.uniform_split(np.ones(4, bool)) is None

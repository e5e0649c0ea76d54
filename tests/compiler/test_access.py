"""access.py: index evaluation, stick sets, DMA patterns and affine views, on exact small cases."""

from __future__ import annotations

import math

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


def _reference_choose_splits(arrays):
    """The split search as first written: every divisor of the outer size, largest first, checked on the
    whole arrays (one pass per divisor). ``choose_splits`` must give the same answer."""
    import math

    shape, splits = arrays[0].shape, {}
    for d in reversed(range(len(shape))):
        fs = []
        while True:
            cur, axes = access.refine_shape(shape, {**splits, d: fs})
            outer = axes[d][0]
            if all(access.line_affine(a.reshape(cur), outer) for a in arrays):
                break
            n = cur[outer]
            runs = []
            for a in arrays:
                r = a.reshape(cur)
                if n <= 2:
                    runs.append(n)
                    continue
                dd = np.diff(r, axis=outer)
                bad = np.flatnonzero(np.any(dd != np.take(dd, [0], axis=outer),
                                            axis=tuple(k for k in range(dd.ndim) if k != outer)))
                runs.append(int(bad[0]) + 1 if bad.size else n)
            divisors = sorted((f for f in range(2, n) if n % f == 0 and f <= min(runs)), reverse=True)
            found = None
            for f in divisors:
                trial, t_axes = access.refine_shape(shape, {**splits, d: fs + [f]})
                if all(access.line_affine(a.reshape(trial), t_axes[d][1]) for a in arrays):
                    found = f
                    break
            if found is None:
                break
            fs.append(found)
        if fs:
            splits[d] = fs
    return splits


@pytest.mark.parametrize("seed", range(2))
def test_choose_splits_matches_the_divisor_by_divisor_search(seed):
    """Stick positions of flattened ranges of padded tensors (several factors per dim) and of tiles of
    views under random layouts."""
    rng = np.random.default_rng(seed)
    cases = 0
    for _ in range(60):
        nd = int(rng.integers(2, 4))
        host = tuple(int(x) for x in rng.integers(1, 70, nd))
        lay = StickLayout(host, int(rng.integers(0, nd)), str(rng.choice(["dlfloat16", "float32"])))
        place = TensorView.whole("t", lay)
        n = math.prod(host)
        lead = 2 if n % 2 == 0 else 1
        pos = access.stick_set(place, access.device_elements(place, np.arange(n).reshape(lead, n // lead))).position
        tile = tuple(int(rng.integers(1, h + 1)) for h in host)
        g = np.meshgrid(*[np.arange(t) for t in tile], indexing="ij")
        idx = sum(g[d] * lay.host_strides[d] for d in range(nd))
        other = access.stick_set(place, access.device_elements(place, idx)).position
        for arrays in ([pos], [other]):
            assert access.choose_splits(arrays) == _reference_choose_splits(arrays)
            cases += 1
    assert cases == 120


def test_choose_splits_makes_one_pass_per_factor_however_many_divisors(monkeypatch):
    """A padded row of 5040 elements (60 divisors): the search reads the arrays once per factor it finds
    and once to see it is done, not once per divisor tried."""
    lay = StickLayout((3, 5040), 1, "dlfloat16")  # 79 sticks per row, the last one padded
    place = TensorView.whole("t", lay)
    pos = access.stick_set(place, access.device_elements(place, np.arange(3 * 5040).reshape(1, -1))).position
    passes = []
    real = access._steps
    monkeypatch.setattr(access, "_steps", lambda a, axis: passes.append(a.shape) or real(a, axis))
    splits = access.choose_splits([pos])
    assert splits == _reference_choose_splits([pos]) and splits[1]
    factors = sum(len(f) for f in splits.values())
    assert len(passes) <= factors + 2 * len(pos.shape)


@pytest.mark.parametrize("masked", [False, True])
def test_stick_set_of_long_runs_ranks_like_searchsorted(masked):
    # A tile of a tensor sticked on columns: each stick's 64 lanes are neighbours, so ranks are taken once
    # per run of equal sticks; a mask leaves some elements naming sticks outside the set (clipped).
    lay = StickLayout((40, 4096), 1, "dlfloat16")
    place = TensorView.whole("t", lay)
    r, c = grid(40, 4096)
    dev = access.device_elements(place, 4096 * r + c)[3:37]
    valid = (c[3:37] % 700 < 500) if masked else None
    ss = access.stick_set(place, dev, valid)
    sticks = dev // 64
    uniq = np.unique(sticks if valid is None else sticks[valid])
    np.testing.assert_array_equal(ss.sticks, uniq)
    rank = np.minimum(np.searchsorted(uniq, sticks), uniq.size - 1)
    np.testing.assert_array_equal(ss.position, rank * 64 + dev % 64)


def test_translated_stick_set_is_the_stick_set_of_the_moved_elements():
    lay = StickLayout((256, 300), 0, "dlfloat16")  # rows are lanes: tiles 25 rows apart start at other lanes
    place = TensorView.whole("t", lay)
    r, c = grid(25, 300)
    first = access.device_elements(place, 300 * r + c)
    ref = access.stick_set(place, first)
    moved = access.device_elements(place, 300 * (r + 64) + c)  # a whole stick of rows further: translated
    t = access.translated(ref, first, moved, 64)
    direct = access.stick_set(place, moved)
    np.testing.assert_array_equal(t.sticks, direct.sticks)
    np.testing.assert_array_equal(t.position, direct.position)
    assert t.patterns() == access.stick_patterns(direct.sticks) and ref.patterns() == access.stick_patterns(ref.sticks)
    other_lane = access.device_elements(place, 300 * (r + 25) + c)
    assert access.translated(ref, first, other_lane, 64) is None
    assert access.translated(ref, first, first[:, :299], 64) is None  # another shape

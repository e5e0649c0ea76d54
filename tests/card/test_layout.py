"""Stick layouts: IBM's documented example, padding, byte costs, and placement round trips."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spyre.card.layout import (DEVICE_DTYPES, LayoutError, StickLayout, _device_offsets_reference,
                                     default_layout, sorted_unique)


def test_ibm_documented_example():
    # spyre-card.md: host (5,100,150) fp16 -> device [100, 3, 5, 64], host strides [150, 64, 15000, 1].
    lay = default_layout((5, 100, 150), "dlfloat16")
    assert lay.device_size == (100, 3, 5, 64)
    assert lay.stride_map == (150, 64, 15000, 1)
    assert lay.padding == 3 * 64 - 150
    assert lay.nbytes == 128 * 100 * 3 * 5


@pytest.mark.parametrize(
    "shape, dtype, nbytes",
    [
        ((5, 100), "dlfloat16", 5 * 2 * 128),  # not 1,000 bytes: two sticks per row
        ((64,), "dlfloat16", 128),
        ((65,), "dlfloat16", 256),
        ((3, 32), "float32", 3 * 128),
        ((3, 33), "float32", 3 * 256),
        ((), "float32", 128),  # a scalar still occupies a stick
        ((7, 0), "dlfloat16", 0),
        ((2, 129), "int8", 2 * 256),
        ((4, 16), "int64", 4 * 128),
    ],
)
def test_bytes_are_whole_sticks(shape, dtype, nbytes):
    assert default_layout(shape, dtype).nbytes == nbytes


def test_other_stick_dimension():
    lay = StickLayout((100, 5), 0, "dlfloat16")
    # Sticks run down the columns: 5 columns x 2 sticks of 64 rows.
    assert lay.device_size == (2, 5, 64)
    assert lay.stride_map == (64 * 5, 1, 5)
    assert lay.nbytes == 5 * 2 * 128


def test_invalid_layouts():
    with pytest.raises(LayoutError, match="stick dimension"):
        StickLayout((3, 4), 2, "float32")
    with pytest.raises(LayoutError, match="unknown device dtype"):
        StickLayout((3, 4), 1, "float64")
    lay = default_layout((3, 4), "float32")
    with pytest.raises(LayoutError, match="out of range"):
        lay.device_offsets(np.array([12]))


@st.composite
def layouts(draw):
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(1, 70), min_size=rank, max_size=rank)))
    while np.prod(shape, dtype=np.int64) > 20_000:  # keep examples small: the logic, not the size, is tested
        shape = shape[1:]
    stick = draw(st.integers(0, max(len(shape) - 1, 0)))
    dtype = draw(st.sampled_from(sorted(DEVICE_DTYPES)))
    return StickLayout(shape, stick, dtype)


@settings(max_examples=80, deadline=None)
@given(layouts())
def test_pack_unpack_and_offsets_agree(lay):
    host = np.arange(lay.numel, dtype=np.int64)
    dev = lay.pack(host, fill=-1)
    assert dev.size == lay.device_numel
    assert dev.size * lay.itemsize == lay.nbytes
    np.testing.assert_array_equal(lay.unpack(dev), host)
    offsets = lay.device_offsets(np.arange(lay.numel))
    np.testing.assert_array_equal(dev[offsets], host)
    # Every host element has its own device slot; the rest is padding.
    assert len(np.unique(offsets)) == lay.numel
    assert (dev == -1).sum() == lay.device_numel - lay.numel
    # stride_map: host offset of a device coordinate = dot(coordinate, stride_map) for real elements.
    coords = np.array(np.unravel_index(offsets, lay.device_size))
    host_from_map = (coords.T * np.array(lay.stride_map)).sum(axis=1)
    np.testing.assert_array_equal(host_from_map, host)


@settings(max_examples=80, deadline=None)
@given(layouts(), st.integers(0, 2**32 - 1))
def test_device_offsets_match_unravelling_every_dim(lay, seed):
    # device_offsets divides the index a few times (shifts for powers of two) instead of unravelling.
    idx = np.random.default_rng(seed).integers(0, lay.numel, size=min(3 * lay.numel, 500))
    np.testing.assert_array_equal(lay.device_offsets(idx), _device_offsets_reference(lay, idx))


@pytest.mark.parametrize("shape,stick", [((4096, 64), 0), ((64, 4096), 1), ((3, 128, 64), 1), ((2, 64, 3, 64), 2)])
def test_device_offsets_of_power_of_two_shapes(shape, stick):
    lay = StickLayout(shape, stick, "dlfloat16")
    idx = np.arange(lay.numel)
    np.testing.assert_array_equal(lay.device_offsets(idx), _device_offsets_reference(lay, idx))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.int8, np.uint8, np.float64])
@pytest.mark.parametrize("n,span", [(0, 1), (1, 5), (7, 3), (5000, 100), (5000, 15000), (20000, 10**9)])
@pytest.mark.parametrize("runs", [0, 64])
def test_sorted_unique_is_numpys_unique(dtype, n, span, runs):
    # Big integer arrays in a narrow range take the mask path, the rest a sort: both are np.unique.
    rng = np.random.default_rng(n + span)
    lo = -50 if np.dtype(dtype).kind in "if" else 0
    hi = min(span, int(np.iinfo(dtype).max)) if np.dtype(dtype).kind in "iu" else span
    values = rng.integers(lo, hi, size=n).astype(dtype).reshape(-1, 1) if n else np.zeros(0, dtype)
    if runs:  # runs of equal values (a stick's lanes side by side) are counted once before sorting
        values = np.repeat(values, runs, axis=0)
    got = sorted_unique(values)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.unique(values))

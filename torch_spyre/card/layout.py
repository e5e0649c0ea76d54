"""Stick layouts: how a tensor's elements sit in device memory.

A layout describes one *allocation*. Its elements form a row-major host array of shape ``host_shape``
(the host element space that every view of the allocation indexes with its storage offset and
strides). One host dimension, the *stick dimension*, is cut into 128-byte sticks and padded to whole
sticks; the device array is row-major over ``device_size``, whose last dimension is the lanes of one
stick.

Device order (IBM's default generalised from its documented example): with ``s`` the stick dimension
and ``outer`` the other host dimensions in order,

    device_size = [*outer[1:], n_sticks, outer[0], lanes]       (if outer is not empty)
    device_size = [n_sticks, lanes]                             (1-D)

e.g. host (5, 100, 150) fp16 sticked on dim 2 -> device [100, 3, 5, 64] with host strides per device
dimension [150, 64, 15000, 1]. Rows of the first dimension are interleaved stick by stick, which is
what the PE arrays stream. Bytes on device = 128 x product of the non-lane device dimensions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import SpyreError
from ..program import STICK_BYTES, row_major_strides


# Device element types: name -> (bytes per element, numpy dtype of the stored bits).
DEVICE_DTYPES: dict[str, tuple[int, np.dtype]] = {
    "dlfloat16": (2, np.dtype(np.uint16)),
    "float32": (4, np.dtype(np.float32)),
    "int64": (8, np.dtype(np.int64)),
    "int32": (4, np.dtype(np.int32)),
    "int16": (2, np.dtype(np.int16)),
    "int8": (1, np.dtype(np.int8)),
    "uint8": (1, np.dtype(np.uint8)),
    "bool": (1, np.dtype(np.bool_)),
}


class LayoutError(SpyreError, ValueError):
    """A layout that cannot exist (bad stick dimension, unknown device dtype, ...)."""


@dataclass(frozen=True)
class StickLayout:
    host_shape: tuple[int, ...]
    stick_dim: int
    device_dtype: str

    def __post_init__(self) -> None:
        if self.device_dtype not in DEVICE_DTYPES:
            raise LayoutError(f"unknown device dtype {self.device_dtype!r}; known: {', '.join(DEVICE_DTYPES)}")
        if any(int(d) < 0 for d in self.host_shape):
            raise LayoutError(f"negative size in host shape {self.host_shape}")
        object.__setattr__(self, "host_shape", tuple(int(d) for d in self.host_shape))
        rank = max(len(self.host_shape), 1)
        if not -rank <= self.stick_dim < rank:
            raise LayoutError(
                f"stick dimension {self.stick_dim} is out of range for a {len(self.host_shape)}-d tensor"
            )
        object.__setattr__(self, "stick_dim", self.stick_dim % rank)

    # --- shape arithmetic -----------------------------------------------------------------------
    @property
    def itemsize(self) -> int:
        return DEVICE_DTYPES[self.device_dtype][0]

    @property
    def storage_dtype(self) -> np.dtype:
        return DEVICE_DTYPES[self.device_dtype][1]

    @property
    def lanes(self) -> int:
        """Elements per stick."""
        return STICK_BYTES // self.itemsize

    @cached_property
    def _shape(self) -> tuple[int, ...]:
        return self.host_shape if self.host_shape else (1,)  # a 0-d tensor is one element in one stick

    @cached_property
    def numel(self) -> int:
        return math.prod(self._shape)

    @cached_property
    def host_strides(self) -> tuple[int, ...]:
        return row_major_strides(self._shape)

    @cached_property
    def n_sticks(self) -> int:
        return -(-self._shape[self.stick_dim] // self.lanes)

    @cached_property
    def _outer(self) -> list[int]:
        return [d for d in range(len(self._shape)) if d != self.stick_dim]

    @cached_property
    def device_dims(self) -> tuple[str | int, ...]:
        """What each device dimension is: a host dim index, "sticks" or "lanes"."""
        outer = self._outer
        if not outer:
            return ("sticks", "lanes")
        return (*outer[1:], "sticks", outer[0], "lanes")

    @cached_property
    def device_size(self) -> tuple[int, ...]:
        return tuple(self._dim_size(d) for d in self.device_dims)

    def _dim_size(self, d: str | int) -> int:
        if d == "sticks":
            return self.n_sticks
        if d == "lanes":
            return self.lanes
        return self._shape[d]

    @cached_property
    def stride_map(self) -> tuple[int, ...]:
        """For each device dimension, the host stride (in elements) it corresponds to."""
        s = self.host_strides[self.stick_dim]
        out = []
        for d in self.device_dims:
            if d == "sticks":
                out.append(self.lanes * s)
            elif d == "lanes":
                out.append(s)
            else:
                out.append(self.host_strides[d])
        return tuple(out)

    @property
    def padding(self) -> int:
        """Padding elements added to the stick dimension."""
        return self.n_sticks * self.lanes - self._shape[self.stick_dim]

    @cached_property
    def device_numel(self) -> int:
        return math.prod(self.device_size)

    @property
    def nbytes(self) -> int:
        """Bytes this layout occupies on the card: whole sticks."""
        return self.device_numel * self.itemsize

    def describe(self) -> str:
        return (
            f"StickLayout(host={list(self.host_shape)}, stick_dim={self.stick_dim}, "
            f"device_size={list(self.device_size)}, stride_map={list(self.stride_map)}, "
            f"padding={self.padding}, device_dtype={self.device_dtype}, bytes={self.nbytes})"
        )

    # --- element placement ----------------------------------------------------------------------
    @cached_property
    def _host_perm(self) -> tuple[int, ...]:
        """Axis order that takes the padded, stick-split host array to device order."""
        # Padded host array has axes: host dims with the stick dim split into (sticks, lanes).
        # Name them: host dim i -> i (stick dim -> its "sticks" part), lanes -> len(shape).
        order = []
        for d in self.device_dims:
            if d == "sticks":
                order.append(self.stick_dim)
            elif d == "lanes":
                order.append(len(self._shape))
            else:
                order.append(d)
        return tuple(order)

    def _split_shape(self) -> tuple[int, ...]:
        shape = list(self._shape)
        shape[self.stick_dim] = self.n_sticks
        return (*shape, self.lanes)

    def pack(self, host: np.ndarray, fill: int | float = 0) -> np.ndarray:
        """Place a flat host array (``numel`` elements, already in device encoding) in device order."""
        arr = np.asarray(host).reshape(self._shape)
        pad = [(0, 0)] * arr.ndim
        pad[self.stick_dim] = (0, self.padding)
        if self.padding:
            arr = np.pad(arr, pad, constant_values=fill)
        # Split the stick dim into (sticks, lanes) and move lanes last.
        split = np.moveaxis(
            arr.reshape(*self._shape[: self.stick_dim], self.n_sticks, self.lanes, *self._shape[self.stick_dim + 1 :]),
            self.stick_dim + 1,
            -1,
        )
        return np.ascontiguousarray(np.transpose(split, self._host_perm)).reshape(-1)

    def unpack(self, device: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`pack`: the flat host array (``numel`` elements) from device order."""
        dev = np.asarray(device).reshape(self.device_size)
        split = np.transpose(dev, np.argsort(self._host_perm))
        merged = np.moveaxis(split, -1, self.stick_dim + 1).reshape(
            *self._shape[: self.stick_dim], self.n_sticks * self.lanes, *self._shape[self.stick_dim + 1 :]
        )
        index = [slice(None)] * len(self._shape)
        index[self.stick_dim] = slice(0, self._shape[self.stick_dim])
        return np.ascontiguousarray(merged[tuple(index)]).reshape(-1)

    def device_offsets(self, host_index: np.ndarray) -> np.ndarray:
        """Device element offsets of host linear indices (vectorized).

        With ``s`` the stick dim, ``r`` the row dim (``outer[0]``) and ``rest`` the linear index over the
        other outer dims (in device order they are row-major and contiguous with each other):
        ``offset = rest * (n_sticks * n_r * lanes) + (c // lanes) * (n_r * lanes) + r * lanes + c % lanes``,
        computed by a few divisions instead of unravelling every dim (the generators map millions of
        indices per big kernel)."""
        idx = np.asarray(host_index, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.numel):
            raise LayoutError(f"host index out of range for a layout of {self.numel} elements")
        shape, s, lanes = self._shape, self.stick_dim, self.lanes
        if len(shape) == 1:
            return idx.copy()
        after = math.prod(shape[s + 1:])
        if s == 0:
            n_r = shape[1]
            after = math.prod(shape[2:])
            c, rr = _divmod(idx, n_r * after)  # rr: row and the dims after it
            r, rest = _divmod(rr, after) if after > 1 else (rr, None)
        else:
            n_r, between = shape[0], math.prod(shape[1:s])
            q, b = _divmod(idx, after) if after > 1 else (idx, None)
            q, c = _divmod(q, shape[s])
            r, a = _divmod(q, between) if between > 1 else (q, None)
            rest = b if a is None else (a * after if b is None else a * after + b)
        off = c >> (lanes.bit_length() - 1)  # lanes is a power of two
        off *= (n_r - 1) * lanes
        off += c  # (c // lanes) * n_r * lanes + c % lanes
        off += r * lanes
        if rest is not None:
            off += rest * (self.n_sticks * n_r * lanes)
        return off


def _divmod(x: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.divmod`` of non-negative integers, by shift and mask when ``d`` is a power of two (several
    times faster than numpy's integer division)."""
    if d & (d - 1) == 0:
        return x >> (d.bit_length() - 1), x & (d - 1)
    return np.divmod(x, d)


def _device_offsets_reference(layout: StickLayout, host_index: np.ndarray) -> np.ndarray:
    """:meth:`StickLayout.device_offsets` by unravelling every dim (what the tests compare it with)."""
    idx = np.asarray(host_index, dtype=np.int64)
    coords = np.unravel_index(idx, layout._shape)
    dev_strides = dict(zip(layout.device_dims, row_major_strides(layout.device_size)))
    c = coords[layout.stick_dim]
    off = (c // layout.lanes) * dev_strides["sticks"] + (c % layout.lanes) * dev_strides["lanes"]
    for d in layout._outer:
        off = off + coords[d] * dev_strides[d]
    return off


_MASK_MIN = 4096  # below this many values a sort is as quick as the mask


def run_starts(flat: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a non-empty 1-d array begins (a boolean mask)."""
    starts = np.empty(flat.size, dtype=bool)
    starts[0] = True
    np.not_equal(flat[1:], flat[:-1], out=starts[1:])
    return starts


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` (flattened, sorted) by one sort: the numpy in use (2.4) takes the hash-table
    path for integers, about 10x slower than sorting and 300x on the regular stick numbers of a tile
    (1.4 s for a million), which made the generators' analysis of a big tensor take minutes."""
    flat = np.asarray(values).reshape(-1)
    if flat.size >= _MASK_MIN and flat.dtype.kind in "iu":
        # Runs of equal values (the elements of one stick, in a tile's row-major order) count once: keep
        # each run's first value, so a sort below sees a run per stick instead of an element per lane.
        starts = run_starts(flat)
        if np.count_nonzero(starts) * 2 <= flat.size:
            flat = flat[starts]
    if flat.size >= _MASK_MIN and flat.dtype.kind in "iu":
        # Integers in a range not much wider than their count (stick numbers, device offsets): mark them
        # in a boolean array over the range, O(n) instead of a sort's O(n log n), the same result.
        lo, hi = int(flat.min()), int(flat.max())
        if hi - lo < 4 * flat.size:
            seen = np.zeros(hi - lo + 1, dtype=bool)
            seen[flat.astype(np.int64, copy=False) - lo] = True
            return (np.flatnonzero(seen) + lo).astype(flat.dtype, copy=False)
    flat = np.sort(flat)
    if flat.size < 2:
        return flat
    keep = np.empty(flat.size, dtype=bool)
    keep[0] = True
    np.not_equal(flat[1:], flat[:-1], out=keep[1:])
    return flat[keep]


def default_layout(host_shape: tuple[int, ...], device_dtype: str, stick_dim: int = -1) -> StickLayout:
    """IBM's default: the last host dimension is sticked."""
    return StickLayout(tuple(host_shape), stick_dim, device_dtype)

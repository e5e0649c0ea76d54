"""What instructions operate on: device operands and addresses, scratchpad tensor views, DMA stick patterns.

``STICK_BYTES`` is defined here and nowhere else: every layer that counts sticks imports it from
:mod:`torch_spyre.program`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

STICK_BYTES = 128

# Element types a scratchpad tensor may have, and their sizes in bytes.
SP_DTYPES: dict[str, int] = {
    "dlfloat16": 2,
    "float32": 4,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def row_major_strides(shape) -> tuple[int, ...]:
    """Element strides of a contiguous row-major array (torch's rule: a size-0 dim counts as 1)."""
    strides, acc = [], 1
    for s in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def strided_extent(shape: Iterable[int], strides: Iterable[int]) -> tuple[int, int]:
    """The lowest and highest start offset (in stride units, relative to the base) a strided walk over a
    non-empty ``shape`` reaches; negative strides reach below the base. Scratchpad views and DMA
    patterns both bound the bytes they touch with it."""
    lo = hi = 0
    for s, st in zip(shape, strides):
        if st >= 0:
            hi += (s - 1) * st
        else:
            lo += (s - 1) * st
    return lo, hi


@dataclass(frozen=True)
class Operand:
    """A tensor argument: ``nbytes`` of device memory bound at launch. ``access`` is in, out or inout."""

    name: str
    nbytes: int
    access: str = "in"
    # Optional description of the data (for printing and for launch-time checks).
    device_dtype: str | None = None
    host_shape: tuple[int, ...] | None = None
    stick_dim: int | None = None


@dataclass(frozen=True)
class Addr:
    """A symbolic device address: ``offset`` bytes into operand ``operand``."""

    operand: str
    offset: int = 0


@dataclass(frozen=True)
class SpTensor:
    """A strided view of scratchpad bytes: element (i0, i1, ...) sits at
    ``offset + itemsize * sum(i_d * strides[d])``. Stride 0 broadcasts."""

    offset: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None  # elements; None = row-major contiguous

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.strides is None:
            object.__setattr__(self, "strides", row_major_strides(self.shape))
        else:
            object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))

    @classmethod
    def exact(cls, offset: int, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> "SpTensor":
        """The view of ``shape`` and ``strides`` given as they are: both already tuples of Python ints,
        so the normalisation of ``__post_init__`` is skipped (a generator that places millions of views
        built them that way; ``SpTensor(...)`` is the checked constructor)."""
        t = object.__new__(cls)
        object.__setattr__(t, "offset", offset)
        object.__setattr__(t, "dtype", dtype)
        object.__setattr__(t, "shape", shape)
        object.__setattr__(t, "strides", strides)
        return t

    @property
    def itemsize(self) -> int:
        return SP_DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def byte_span(self) -> tuple[int, int]:
        """[start, end) of the bytes the view can touch (conservative for strided views)."""
        if self.numel == 0:
            return self.offset, self.offset
        lo, hi = strided_extent(self.shape, self.strides)
        return self.offset + lo * self.itemsize, self.offset + (hi + 1) * self.itemsize


@dataclass(frozen=True)
class Scalar:
    """An immediate value for an elementwise op."""

    value: float


@dataclass(frozen=True)
class DmaPattern:
    """Nested loops moving one 128-byte stick per iteration. ``dram_strides`` and ``sp_strides`` are
    in bytes, one per loop; a DRAM stride of 128 on the innermost loop is a contiguous burst."""

    shape: tuple[int, ...]
    dram_strides: tuple[int, ...]
    sp_strides: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("shape", "dram_strides", "sp_strides"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))

    @property
    def sticks(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.sticks * STICK_BYTES

    @staticmethod
    def contiguous(n_sticks: int) -> "DmaPattern":
        return DmaPattern((n_sticks,), (STICK_BYTES,), (STICK_BYTES,))

    def span(self, strides: tuple[int, ...]) -> tuple[int, int]:
        """[lo, hi) byte offsets reached relative to the base, for one side's strides."""
        if self.sticks == 0:
            return 0, 0
        lo, hi = strided_extent(self.shape, strides)
        return lo, hi + STICK_BYTES

    def dram_range(self, offset: int) -> tuple[int, int]:
        """[lo, hi) of the device bytes reached from ``offset`` (an operand offset or an address)."""
        lo, hi = self.span(self.dram_strides)
        return offset + lo, offset + hi

    def sp_range(self, offset: int) -> tuple[int, int]:
        """[lo, hi) of the scratchpad bytes reached from ``offset``."""
        lo, hi = self.span(self.sp_strides)
        return offset + lo, offset + hi

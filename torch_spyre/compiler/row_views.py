"""Views that cover whole rows of their allocation: one program for every row offset.

In a :class:`~torch_spyre.card.layout.StickLayout` sticked on its last dim, the device offset of a host
element is a sum, over the host dims, of its coordinate times that dim's device stride (the stick dim
split into sticks and lanes). So a row-major contiguous view covering ``n`` whole rows of a dim ``j``
(every element of each covered row, inside one row of the dims before ``j``) lies exactly where the same
view at storage offset 0 lies, moved by ``device_offsets(offset)`` elements: a whole number of sticks.
Its program is the one generated for storage offset 0, bound that many bytes further on (the rows of the
outermost dim are interleaved stick by stick, so the rows themselves are not one byte range: the bound
operand is declared as the bytes the view at offset 0 reaches, :func:`extent_bytes`, not the whole layout).

Views inside a stick, partial rows, strided or transposed views, layouts sticked on another dim and views
of another dtype than their allocation (which the callers check: ``row_shift`` sees host elements only) do
not qualify: they are placed where they lie, as before; so is
every view with the ``row_views`` optimization switched off (``TORCH_SPYRE_DISABLE=row_views``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..program import STICK_BYTES, row_major_strides
from . import optimizations


def enabled() -> bool:
    """Whether views of whole rows are placed at offset 0 (the ``row_views`` optimization is on)."""
    return "row_views" not in optimizations.disabled_set()


@functools.lru_cache(maxsize=8192)
def row_shift(layout: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> int | None:
    """Device elements between this view's elements and those of the same view at storage offset 0 (a
    multiple of the layout's lanes), or None when the view does not cover whole rows (module doc).
    (Memoized: every eager call and every launch asks of each tensor.)"""
    host = layout.host_shape
    k = len(host)
    if k < 2 or layout.stick_dim != k - 1 or len(shape) == 0:
        return None
    n = math.prod(shape)
    if n == 0 or offset < 0 or offset + n > layout.numel:
        return None
    if any(size > 1 and stride != want for size, stride, want in zip(shape, strides, row_major_strides(shape))):
        return None  # not the row-major contiguous range [offset, offset + n)
    hs = layout.host_strides
    for j in range(k - 1):  # rows of dim j: whole rows of the stick dim, never part of one
        if offset % hs[j] == 0 and n % hs[j] == 0 and (offset // hs[j]) % host[j] + n // hs[j] <= host[j]:
            shift = int(layout.device_offsets(np.array([offset], dtype=np.int64))[0])
            return shift if shift % layout.lanes == 0 else None
    return None


@functools.lru_cache(maxsize=4096)
def extent_bytes(layout: Any, numel: int) -> int:
    """Bytes from the start of the layout that a view of host elements [0, numel) reaches (through the end
    of the stick of its last element: device offsets grow with every host coordinate, so the last element
    has the largest)."""
    last = int(layout.device_offsets(np.array([numel - 1], dtype=np.int64))[0])
    return (last // layout.lanes + 1) * STICK_BYTES

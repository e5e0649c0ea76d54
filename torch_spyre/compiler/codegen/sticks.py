"""Moving tiles of whole sticks between device memory and scratchpad, shared by the generators.

The stick-run compression itself is :func:`torch_spyre.compiler.access.stick_patterns`; this module
turns it into DMA instructions for a tile (:func:`dma_tile`), counts the DRAM bursts a stick set costs
(:func:`dram_runs`, what the estimates charge), checks that an output row owns the sticks it stores
(:func:`check_owns_sticks`) and sizes scratchpad tiles in whole sticks (:func:`sp_bytes`).
"""

from __future__ import annotations

import math

import numpy as np

from torch_spyre.card.layout import sorted_unique
from torch_spyre.compiler.access import CodegenError, TensorView, stick_patterns
from torch_spyre.program import STICK_BYTES, Addr, DmaLoad, DmaStore, Instruction


def dram_runs(dev: np.ndarray) -> int:
    """Contiguous device bursts in a set of sticks (what each DRAM discontinuity costs is in the config)."""
    s = sorted_unique(np.asarray(dev, dtype=np.int64))
    return int(s.size and 1 + np.count_nonzero(np.diff(s) != 1))


def dma_tile(arg: TensorView, dev: np.ndarray, sp_offset: int, store: bool) -> list[Instruction]:
    """Loads (or stores) of the sticks ``dev`` of ``arg`` to (from) a contiguous scratchpad tile, laid out
    row-major in ``dev``'s order from byte ``sp_offset``."""
    cls = DmaStore if store else DmaLoad
    return [cls(Addr(arg.name, d * STICK_BYTES), sp_offset + s * STICK_BYTES, pat)
            for d, s, pat in stick_patterns(dev)]


def check_owns_sticks(arg: TensorView, lane0: int, ncols: int, role: str, col0: int = 0) -> None:
    """A kernel stores whole sticks: an output row must own its sticks (start at lane 0, and end at a
    stick boundary or at the end of the stick dim, where the rest is padding), or cores would overwrite
    each other's values."""
    lay = arg.layout
    extent = lay.host_shape[lay.stick_dim] if lay.host_shape else 1
    coord0 = (arg.storage_offset // lay.host_strides[lay.stick_dim]) % extent
    ends_at_padding = coord0 + col0 + ncols == extent  # columns [col0, col0 + ncols) of the row
    if lane0 != 0 or (ncols % lay.lanes and not ends_at_padding):
        raise CodegenError(
            f"{role} %{arg.name}: each output row of {ncols} elements shares its sticks with other data "
            f"(first lane {lane0}); stores move whole sticks, so write into a fresh buffer in the default "
            "layout and copy (relayout) into this view")


def sp_bytes(dtype_bytes: int, *shape: int) -> int:
    """Scratchpad bytes of a row-major tile, rounded up to whole sticks."""
    return -(-math.prod(shape) * dtype_bytes // STICK_BYTES) * STICK_BYTES

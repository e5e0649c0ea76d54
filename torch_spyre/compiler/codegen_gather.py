"""Gathers (embedding, index_select, a gather that reduces to one) as Spyre programs over ``DmaGather``.

Also home of the small addressing helpers the attention generator shares: :class:`TensorArg` (a named
device buffer, its :class:`StickLayout` and the view geometry of the tensor the kernel sees) and the
stick-run compression that turns the device sticks of a scratchpad tile into as few DMA patterns as
possible. (They belong in ``compiler/access.py`` once that module lands.)

How a gather runs
-----------------
A DmaGather picks *rows of whole sticks*: for each index ``i`` held in scratchpad it copies ``row_sticks``
contiguous sticks from ``src + i * row_stride``. In a stick layout the sticks that share one coordinate
of the gathered dimension form ``i * R + P``: a fixed set ``P`` of stick offsets shifted by a row
stride ``R`` (e.g. an embedding table [V, D] sticked on D: ``R`` = 1 stick, ``P`` = {s * V}: the D sticks
of one row are V sticks apart). ``P`` splits into contiguous runs and each run is one DmaGather, so an
embedding row of D fp16 values costs ceil(D / 64) gathers per chunk of indices, whatever the number of
indices. Gathering along the stick dimension itself would pick single elements inside sticks, which no
DMA can do: that needs a relayout first, and the generator says so.

Per core: load a chunk of indices (whole index sticks) by DMA, gather each run into scratchpad, store
the gathered sticks to the output rows (compressed DMA patterns); chunks alternate between two buffer
sets so the next chunk's loads overlap this chunk's store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from torch_spyre.card.layout import STICK_BYTES, StickLayout
from torch_spyre.compiler.decisions import BufferDecision, KernelDecisions
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, SpBuffer, plan
from torch_spyre.program import (
    Addr,
    DmaGather,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Instruction,
    Operand,
    Program,
    SpTensor,
)


class CodegenError(ValueError):
    """A kernel spec the generator cannot turn into a program; the message says why and what would help."""


# Host dtypes -> the card's device dtype for them (fp16 and bf16 live as DLFloat16).
_DEVICE_DTYPE = {
    torch.float16: "dlfloat16", torch.bfloat16: "dlfloat16", torch.float32: "float32",
    torch.int64: "int64", torch.int32: "int32", torch.bool: "bool",
    "float16": "dlfloat16", "bfloat16": "dlfloat16", "float32": "float32", "dlfloat16": "dlfloat16",
    "int64": "int64", "int32": "int32", "bool": "bool",
}


def device_dtype_of(dtype: Any) -> str:
    """The card's dtype for a host dtype (torch dtype or name); CodegenError if the card has none."""
    if dtype not in _DEVICE_DTYPE:
        raise CodegenError(f"unsupported dtype {dtype}; supported: float16, bfloat16, float32 (data), int64, "
                           "int32 (indices), bool (masks)")
    return _DEVICE_DTYPE[dtype]


# ---------------------------------------------------------------------------------------------
# A kernel argument: allocation + layout + view
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorArg:
    """A tensor argument of a kernel: the device buffer ``name`` laid out by ``layout`` (the allocation's
    host shape, stick dim and device dtype) and the view the kernel reads or writes: ``shape``,
    ``strides`` and ``storage_offset`` in host elements of the allocation (None strides: contiguous)."""

    name: str
    layout: StickLayout
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    storage_offset: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.strides is None:
            st, acc = [], 1
            for s in reversed(self.shape):
                st.append(acc)
                acc *= s
            object.__setattr__(self, "strides", tuple(reversed(st)))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        if len(self.strides) != len(self.shape):
            raise CodegenError(f"%{self.name}: {len(self.shape)} sizes {list(self.shape)} but strides {list(self.strides)}")

    @staticmethod
    def contiguous(name: str, shape: Sequence[int], dtype: Any, stick_dim: int = -1) -> "TensorArg":
        """A whole fresh buffer in IBM's default layout (last dim sticked unless told otherwise)."""
        return TensorArg(name, StickLayout(tuple(shape), stick_dim, device_dtype_of(dtype)), tuple(shape))

    @property
    def dtype(self) -> str:
        return self.layout.device_dtype

    @property
    def lanes(self) -> int:
        return self.layout.lanes

    def operand(self, access: str) -> Operand:
        lay = self.layout
        return Operand(self.name, lay.nbytes, access, lay.device_dtype, lay.host_shape, lay.stick_dim)

    def describe(self) -> str:
        return (f"{self.layout.describe()} view shape={list(self.shape)} strides={list(self.strides)} "
                f"offset={self.storage_offset}")

    def host_index(self, coords: np.ndarray) -> np.ndarray:
        """Host linear indices of view coordinates (``coords`` [..., ndim])."""
        return self.storage_offset + np.asarray(coords, dtype=np.int64) @ np.asarray(self.strides, dtype=np.int64)

    def check_last_dim_sticked(self, role: str) -> None:
        """Rows of the view's last dim must run along the layout's stick dim, lane by lane."""
        lay = self.layout
        if not self.shape:
            raise CodegenError(f"{role} %{self.name} is 0-d; expected at least one dimension")
        if self.shape[-1] > 1 and self.strides[-1] != lay.host_strides[lay.stick_dim]:
            raise CodegenError(
                f"{role} %{self.name}: its last dim (stride {self.strides[-1]}) does not run along the stick dim "
                f"{lay.stick_dim} of its layout ({lay.describe()}); insert a relayout so that the last dim is "
                "sticked (compiler/relayout.py)")
        hi = self.storage_offset + sum((s - 1) * st for s, st in zip(self.shape, self.strides) if s > 0)
        lo = self.storage_offset + sum((s - 1) * st for s, st in zip(self.shape, self.strides) if s > 0 and st < 0)
        if min(self.shape, default=1) > 0 and (lo < 0 or hi >= lay.numel):
            raise CodegenError(f"{role} %{self.name}: the view reaches host elements [{lo}, {hi}] outside its "
                               f"buffer of {lay.numel} elements")

    def row_sticks(self, lead: np.ndarray, col0: int, ncols: int) -> tuple[np.ndarray, int]:
        """Device stick numbers covering columns [col0, col0+ncols) of each row ``lead`` ([n, ndim-1]
        coordinates), as [n, k], and the lane of column col0 in its stick (the same for every row)."""
        lay, lanes = self.layout, self.layout.lanes
        lead = np.asarray(lead, dtype=np.int64).reshape(-1, len(self.shape) - 1)
        first = self.host_index(np.concatenate([lead, np.full((len(lead), 1), col0)], axis=1))
        dev0 = lay.device_offsets(first)
        lane0 = dev0 % lanes
        if np.any(lane0 != lane0[0]):
            raise CodegenError(f"%{self.name}: rows start at different lanes of their sticks; a relayout is needed")
        lane0 = int(lane0[0]) if len(lane0) else 0
        k = -(-(lane0 + ncols) // lanes)
        # Column of each covered stick's first used lane; its device stick number.
        cols = np.maximum(0, np.arange(k) * lanes - lane0) + col0
        host = first[:, None] + (cols - col0)[None, :] * self.strides[-1]
        return lay.device_offsets(host.reshape(-1)).reshape(len(lead), k) // lanes, lane0


# ---------------------------------------------------------------------------------------------
# Stick runs -> DMA patterns
# ---------------------------------------------------------------------------------------------
def _affine(dev: np.ndarray) -> tuple[int, ...] | None:
    """Strides (in sticks) if ``dev[i0, i1, ...] = dev[0...] + sum(i_k * s_k)``, else None."""
    base = int(dev.flat[0])
    strides = []
    for d in range(dev.ndim):
        if dev.shape[d] > 1:
            idx = [0] * dev.ndim
            idx[d] = 1
            strides.append(int(dev[tuple(idx)]) - base)
        else:
            strides.append(0)
    grids = np.indices(dev.shape).reshape(dev.ndim, -1)
    if np.array_equal(dev.reshape(-1), base + np.asarray(strides) @ grids):
        return tuple(strides)
    return None


def stick_patterns(dev: np.ndarray, sp_stick0: int = 0) -> list[tuple[int, int, DmaPattern]]:
    """Cover a tile of sticks, laid out row-major and contiguous in scratchpad from stick ``sp_stick0``,
    whose device stick numbers are ``dev`` (any rank), by few DMA patterns: [(device stick, scratchpad
    stick, pattern)]. An affine tile is one pattern whose loops are ordered by decreasing device stride
    (the DMA engine reorders, so the innermost loop is the longest contiguous burst); otherwise split the
    outer dim (runs of constant stride in 1-D)."""
    dev = np.asarray(dev, dtype=np.int64)
    if dev.size == 0:
        return []
    sp_strides = [int(np.prod(dev.shape[d + 1:])) for d in range(dev.ndim)]
    strides = _affine(dev)
    if strides is not None:
        loops = [d for d in range(dev.ndim) if dev.shape[d] > 1] or [dev.ndim - 1]
        loops.sort(key=lambda d: (-abs(strides[d]), -sp_strides[d]))
        pat = DmaPattern(tuple(dev.shape[d] for d in loops), tuple(strides[d] * STICK_BYTES for d in loops),
                         tuple(sp_strides[d] * STICK_BYTES for d in loops))
        return [(int(dev.flat[0]), sp_stick0, pat)]
    if dev.ndim > 1:
        out = []
        for i in range(dev.shape[0]):
            out += stick_patterns(dev[i], sp_stick0 + i * sp_strides[0])
        return out
    out, start = [], 0
    while start < dev.size:  # maximal runs of constant stride
        end = min(start + 2, dev.size)
        while end < dev.size and dev[end] - dev[end - 1] == dev[start + 1] - dev[start]:
            end += 1
        out += stick_patterns(dev[start:end], sp_stick0 + start)
        start = end
    return out


def dram_runs(dev: np.ndarray) -> int:
    """Contiguous device bursts in a set of sticks (what each DRAM discontinuity costs is in the config)."""
    s = np.unique(np.asarray(dev, dtype=np.int64).reshape(-1))
    return int(s.size and 1 + np.count_nonzero(np.diff(s) != 1))


def dma_tile(arg: TensorArg, dev: np.ndarray, sp_offset: int, store: bool) -> list[Instruction]:
    """Loads (or stores) of the sticks ``dev`` of ``arg`` to (from) a contiguous scratchpad tile."""
    cls = DmaStore if store else DmaLoad
    return [cls(Addr(arg.name, d * STICK_BYTES), sp_offset + s * STICK_BYTES, pat)
            for d, s, pat in stick_patterns(dev)]


def check_owns_sticks(arg: TensorArg, lane0: int, ncols: int, role: str) -> None:
    """A kernel stores whole sticks: an output row must own its sticks (start at lane 0, and end at a
    stick boundary or at the end of the stick dim, where the rest is padding), or cores would overwrite
    each other's values."""
    lay = arg.layout
    extent = lay.host_shape[lay.stick_dim] if lay.host_shape else 1
    coord0 = (arg.storage_offset // lay.host_strides[lay.stick_dim]) % extent
    ends_at_padding = coord0 + ncols == extent
    if lane0 != 0 or (ncols % lay.lanes and not ends_at_padding):
        raise CodegenError(
            f"{role} %{arg.name}: each output row of {ncols} elements shares its sticks with other data "
            f"(first lane {lane0}); stores move whole sticks, so write into a fresh buffer in the default "
            "layout and copy (relayout) into this view")


def sp_bytes(dtype_bytes: int, *shape: int) -> int:
    """Scratchpad bytes of a row-major tile, rounded up to whole sticks."""
    return -(-math.prod(shape) * dtype_bytes // STICK_BYTES) * STICK_BYTES

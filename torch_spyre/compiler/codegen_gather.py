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
indices. Gathering along the stick dimension itself (torch.gather or index_select along the last dim)
picks single elements inside sticks: each index then gathers the stick holding its element, and a
one-hot select on the vector unit keeps its lane (two stick reads per element; see the last section).

Per core: load a chunk of indices (whole index sticks) by DMA, gather each run into scratchpad, store
the gathered sticks to the output rows (compressed DMA patterns); chunks alternate between two buffer
sets so the next chunk's loads overlap this chunk's store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from torch_spyre.card.config import CardConfig
from torch_spyre.errors import SpyreError
from torch_spyre.card.layout import STICK_BYTES, StickLayout
from torch_spyre.compiler.decisions import BufferDecision, KernelDecisions
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, SpBuffer, plan
from torch_spyre.program import (
    row_major_strides,
    SP_DTYPES,
    Addr,
    DmaGather,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    Instruction,
    Operand,
    Program,
    Reduce,
    Scalar,
    SpTensor,
)


class CodegenError(SpyreError, ValueError):
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
            object.__setattr__(self, "strides", row_major_strides(self.shape))
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
        lead = np.asarray(lead, dtype=np.int64)
        lead = lead.reshape(len(lead), len(self.shape) - 1)
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


def check_owns_sticks(arg: TensorArg, lane0: int, ncols: int, role: str, col0: int = 0) -> None:
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


def core_ids(n: int, config: CardConfig) -> list[int]:
    """Physical cores for ``n`` work lists: from the memory interface's ring stop outwards, alternating
    sides, so DRAM traffic (which rides the ring to each core) splits over both directions of the ring
    instead of queueing on the links on one side when fewer than all cores are used."""
    m, total = config.memory_ring_stop, config.num_cores
    out: list[int] = []
    for k in range(total):
        for c in ((m + k) % total, (m - k) % total):
            if c not in out and len(out) < n:
                out.append(c)
    return out


def sp_bytes(dtype_bytes: int, *shape: int) -> int:
    """Scratchpad bytes of a row-major tile, rounded up to whole sticks."""
    return -(-math.prod(shape) * dtype_bytes // STICK_BYTES) * STICK_BYTES


# ---------------------------------------------------------------------------------------------
# The gather spec
# ---------------------------------------------------------------------------------------------
GATHER_KINDS = ("embedding", "index_select", "gather")
INDEX_DTYPES = ("int64", "int32")


@dataclass(frozen=True)
class GatherSpec:
    """One gather with static shapes.

    - ``embedding``: out[*idx, :] = source[idx, :]; source [V, D], out idx.shape + [D] (dim must be 0).
    - ``index_select``: out = source.index_select(dim, index), index 1-d (or 0-d).
    - ``gather``: out = torch.gather(source, dim, index): along the last (stick) dim element by element;
      along another dim only when index is constant along every other dim (stride 0, i.e. an expanded
      index), which makes it an index_select of a narrowed source; anything else is refused with an
      explanation.

    ``chunk`` forces the indices gathered per DmaGather step (None: as many as fit, balanced over cores)."""

    kind: str
    source: TensorArg
    index: TensorArg
    out: TensorArg
    dim: int = 0
    name: str = "gather"
    chunk: int | None = None
    source_ops: tuple[str, ...] = ()

    @staticmethod
    def embedding(num_embeddings: int, dim: int, index_shape: tuple[int, ...], dtype: Any = torch.float16,
                  index_dtype: Any = torch.int64, **kw: Any) -> "GatherSpec":
        """An embedding lookup over fresh buffers weight, indices and out in the default layout."""
        return GatherSpec("embedding", TensorArg.contiguous("weight", (num_embeddings, dim), dtype),
                          TensorArg.contiguous("indices", index_shape, index_dtype),
                          TensorArg.contiguous("out", (*index_shape, dim), dtype), 0,
                          source_ops=("aten.embedding.default",), **kw)

    @staticmethod
    def index_select(source_shape: tuple[int, ...], dim: int, n: int, dtype: Any = torch.float16,
                     index_dtype: Any = torch.int64, **kw: Any) -> "GatherSpec":
        out_shape = list(source_shape)
        out_shape[dim % len(source_shape)] = n
        return GatherSpec("index_select", TensorArg.contiguous("source", source_shape, dtype),
                          TensorArg.contiguous("indices", (n,), index_dtype),
                          TensorArg.contiguous("out", tuple(out_shape), dtype), dim,
                          source_ops=("aten.index_select.default",), **kw)


@dataclass(frozen=True)
class _Plan:
    """What a gather is after normalisation: positions of ``index`` (row-major) pick rows along ``dim``
    of ``source``; position coordinates ``coord_map`` [(out dim, index dim)] place them in ``out``."""

    source: TensorArg
    index: TensorArg
    out: TensorArg
    dim: int
    coord_map: tuple[tuple[int, int], ...]
    num_rows: int


def _normalise(spec: GatherSpec) -> _Plan:
    """Check the spec and bring the three kinds to one form, with a clear error for what cannot run."""
    if spec.kind not in GATHER_KINDS:
        raise CodegenError(f"unknown gather kind {spec.kind!r}; known: {', '.join(GATHER_KINDS)}")
    src, idx, out = spec.source, spec.index, spec.out
    if idx.dtype not in INDEX_DTYPES:
        raise CodegenError(f"{spec.kind} index %{idx.name} must be int64 or int32, got {idx.dtype}")
    if src.dtype != out.dtype:
        raise CodegenError(f"{spec.kind}: source %{src.name} is {src.dtype} but out %{out.name} is {out.dtype}")
    if src.dtype not in ("dlfloat16", "float32", "int64", "int32", "bool"):
        raise CodegenError(f"{spec.kind}: unsupported data dtype {src.dtype}")
    r = len(src.shape)
    if r < 1:
        raise CodegenError(f"{spec.kind}: source %{src.name} is 0-d")
    dim = spec.dim % r
    if not idx.shape:  # a 0-d index is one position
        idx = TensorArg(idx.name, idx.layout, (1,), (1,), idx.storage_offset)
    if spec.kind == "embedding":
        if r != 2 or dim != 0:
            raise CodegenError(f"embedding weight %{src.name} must be 2-d [num_embeddings, dim], got {list(src.shape)}")
        want = (*spec.index.shape, src.shape[1])
        # Index dim d is out dim d (a 0-d index: its one position has no coordinate in out).
        coord_map = tuple((d, d) for d in range(len(spec.index.shape)))
    elif spec.kind == "index_select":
        if len(idx.shape) != 1:
            raise CodegenError(f"index_select index %{idx.name} must be 1-d, got shape {list(spec.index.shape)}")
        want = tuple(idx.shape[0] if d == dim else s for d, s in enumerate(src.shape))
        coord_map = ((dim, 0),)
    else:
        src, idx, want, coord_map = _gather_as_select(spec, dim)
    if out.shape != tuple(want):
        raise CodegenError(f"{spec.kind}: out %{out.name} has shape {list(out.shape)}, expected {list(want)}")
    if dim == r - 1:
        raise CodegenError(
            f"{spec.kind} along dim {dim} of %{src.name}: that is the stick dim of its layout, so each index picks "
            "single elements inside 128-byte sticks, which DMA cannot do; relayout the source so that another "
            "dim is sticked (e.g. transpose so the gathered dim is not last), or run it on the vector unit")
    for role, t in (("source", src), ("index", idx), ("out", out)):
        t.check_last_dim_sticked(f"{spec.kind} {role}")
    return _Plan(src, idx, out, dim, coord_map, src.shape[dim])


def _gather_as_select(spec: GatherSpec, dim: int) -> tuple[TensorArg, TensorArg, tuple[int, ...], tuple]:
    """torch.gather with an index constant along every dim but ``dim`` is an index_select of the source
    narrowed to the index's sizes. Anything else picks different elements in each row."""
    src, idx = spec.source, spec.index
    if len(idx.shape) != len(src.shape):
        raise CodegenError(f"gather index %{idx.name} must have the source's rank {len(src.shape)}, got {len(idx.shape)}")
    varying = [d for d in range(len(idx.shape)) if d != dim and idx.shape[d] > 1 and idx.strides[d] != 0]
    if varying:
        raise CodegenError(
            f"gather along dim {dim} with an index that varies along dim(s) {varying} picks a different element "
            "per row: a DmaGather moves whole rows of sticks and cannot. Only an index expanded over the other "
            "dims (index_select) maps to DmaGather; otherwise lower torch.gather to a relayout of the source "
            "sticked on the gathered dim plus a vector-unit select, or run it on the host")
    if any(idx.shape[d] > src.shape[d] for d in range(len(idx.shape)) if d != dim):
        raise CodegenError(f"gather index shape {list(idx.shape)} exceeds source {list(src.shape)} off dim {dim}")
    narrowed = TensorArg(src.name, src.layout, tuple(src.shape[dim] if d == dim else idx.shape[d]
                                                      for d in range(len(src.shape))), src.strides, src.storage_offset)
    positions = TensorArg(idx.name, idx.layout, tuple(s if d == dim else 1 for d, s in enumerate(idx.shape)),
                          idx.strides, idx.storage_offset)
    return narrowed, positions, idx.shape, ((dim, dim),)


# ---------------------------------------------------------------------------------------------
# Row structure: which device sticks make up one gathered row
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _RowSticks:
    """Row i of the source along ``dim`` is the sticks ``i * stride + P``; ``runs`` cuts P (in key order:
    the other dims row-major, then the row's sticks) into contiguous (first stick, length) runs."""

    stride: int
    runs: tuple[tuple[int, int], ...]
    keys: np.ndarray  # [n_keys, rank - 2] coordinates of the source's other (non-gathered, non-last) dims
    sticks_per_key: int


def _other_dims(rank: int, skip: set[int]) -> list[int]:
    return [d for d in range(rank - 1) if d not in skip]


def _key_coords(shape: tuple[int, ...], dims: list[int]) -> np.ndarray:
    """Row-major coordinates over ``dims`` of ``shape``: [prod, len(dims)]."""
    sizes = [shape[d] for d in dims]
    if not sizes:
        return np.zeros((1, 0), dtype=np.int64)
    return np.stack([g.reshape(-1) for g in np.indices(sizes)], axis=1).astype(np.int64)


ROW_CHECK_LIMIT = 1 << 16  # source rows whose sticks are checked one by one (beyond: a spread sample)


def _rows_to_check(num_rows: int, keys: int) -> np.ndarray:
    """The rows whose sticks are computed to verify that row i is ``i * stride + P``: all of them for
    tables up to ROW_CHECK_LIMIT (rows x keys), else the first and last thousand and an even spread
    (a view that merges dims breaks the pattern at dim boundaries, which the first rows already show)."""
    if num_rows * keys <= ROW_CHECK_LIMIT:
        return np.arange(num_rows, dtype=np.int64)
    n = max(2, ROW_CHECK_LIMIT // (3 * keys))
    spread = np.linspace(0, num_rows - 1, n).astype(np.int64)
    return np.unique(np.r_[np.arange(min(n, num_rows)), spread, np.arange(max(0, num_rows - n), num_rows)])


def _source_rows(p: _Plan) -> _RowSticks:
    src, dim = p.source, p.dim
    rank = len(src.shape)
    keys = _key_coords(src.shape, _other_dims(rank, {dim}))
    rows = _rows_to_check(p.num_rows, len(keys))
    lead = np.insert(np.repeat(keys[None], len(rows), 0), dim, rows[:, None], axis=2).reshape(-1, rank - 1)
    dev, lane0 = src.row_sticks(lead, 0, src.shape[-1])
    if lane0 != 0:
        raise CodegenError(f"gather source %{src.name}: its rows start at lane {lane0} of a stick, so the gathered "
                           "sticks would land at other lanes than the output's; relayout the source first")
    dev = dev.reshape(len(rows), -1)
    stride = int(dev[1, 0] - dev[0, 0]) if len(rows) > 1 else 0  # rows[:2] are 0 and 1
    if not np.array_equal(dev, dev[0][None, :] + rows[:, None] * stride):
        raise CodegenError(f"gather source %{src.name}: rows along dim {dim} are not a fixed set of sticks at a "
                           "fixed stride in its layout; relayout the source (e.g. to a contiguous default layout)")
    P = dev[0]
    cuts = np.flatnonzero(np.diff(P) != 1) + 1
    starts = np.r_[0, cuts]
    lengths = np.diff(np.r_[starts, P.size])
    return _RowSticks(stride, tuple((int(P[s]), int(n)) for s, n in zip(starts, lengths)), keys, dev.shape[1] // len(keys))


def _out_sticks(p: _Plan, rows: _RowSticks, positions: np.ndarray) -> np.ndarray:
    """Device sticks of the output rows at flat index ``positions``: [n, n_keys * sticks per key]."""
    out, rank = p.out, len(p.out.shape)
    pos = np.stack(np.unravel_index(positions, p.index.shape), axis=1) if len(positions) else np.zeros((0, len(p.index.shape)), np.int64)
    mapped = {od for od, _ in p.coord_map}
    others = _other_dims(rank, mapped)
    n, nk = len(positions), len(rows.keys)
    lead = np.zeros((n, nk, rank - 1), dtype=np.int64)
    for od, idim in p.coord_map:
        lead[:, :, od] = pos[:, idim][:, None]
    for j, od in enumerate(others):
        lead[:, :, od] = rows.keys[None, :, j]
    dev, lane0 = out.row_sticks(lead.reshape(n * nk, rank - 1), 0, out.shape[-1])
    check_owns_sticks(out, lane0, out.shape[-1], "gather out")
    if dev.shape[1] != rows.sticks_per_key:
        raise CodegenError(f"gather out %{out.name}: rows span {dev.shape[1]} sticks but source rows {rows.sticks_per_key}")
    return dev.reshape(n, -1)


# ---------------------------------------------------------------------------------------------
# Chunks and cores
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Chunk:
    r0: int  # rows [r0, r1) of the index's leading dims (flattened), columns [c0, c1) of its last dim
    r1: int
    c0: int
    c1: int

    @property
    def size(self) -> int:
        return (self.r1 - self.r0) * (self.c1 - self.c0)


def _chunks(n_rows: int, n_cols: int, per_chunk: int, lanes: int) -> list[_Chunk]:
    """Chunks of at most ``per_chunk`` positions: whole index rows, or pieces of one row (stick-aligned
    unless a chunk is smaller than a stick)."""
    if n_cols <= per_chunk:
        step = max(1, per_chunk // n_cols)
        return [_Chunk(r, min(n_rows, r + step), 0, n_cols) for r in range(0, n_rows, step)]
    # Whole index sticks when chunks are big; smaller chunks share an index stick (cores only read it).
    seg = per_chunk // lanes * lanes if per_chunk >= lanes else per_chunk
    return [_Chunk(r, r + 1, c, min(n_cols, c + seg)) for r in range(n_rows) for c in range(0, n_cols, seg)]


def _chunk_plans(n_rows: int, n_cols: int, per_chunk: int, lanes: int) -> dict[str, list[_Chunk]]:
    """Ways to cut the index positions into chunks: along its rows (above), or, when every row fits in
    a chunk, all rows by a few columns — the output then gets one DRAM burst across rows when its layout
    interleaves them (IBM's layout puts the first dim innermost, e.g. the batch of [B, L, D])."""
    plans = {"row pieces": _chunks(n_rows, n_cols, per_chunk, lanes)}
    if 1 < n_rows <= per_chunk and n_cols > 1:
        cols = max(1, per_chunk // n_rows)
        plans["column blocks"] = [_Chunk(0, n_rows, c, min(n_cols, c + cols)) for c in range(0, n_cols, cols)]
    return plans


def _choose_chunks(p: _Plan, rows: "_RowSticks", plans: dict[str, list[_Chunk]]) -> tuple[str, list[_Chunk], dict]:
    """The plan whose first chunk's output sticks make the fewest DRAM bursts per position."""
    C = p.index.shape[-1]
    scores = {}
    for name, chunks in plans.items():
        c = chunks[0]
        positions = (np.arange(c.r0, c.r1)[:, None] * C + np.arange(c.c0, c.c1)[None, :]).reshape(-1)
        scores[name] = round(dram_runs(_out_sticks(p, rows, positions)) / c.size, 3)
    best = min(plans, key=lambda n: scores[n])
    return best, plans[best], scores


def _split(chunks: list[_Chunk], cores: int) -> list[list[_Chunk]]:
    """Consecutive chunks per core, about the same number of positions each."""
    total = sum(c.size for c in chunks)
    out: list[list[_Chunk]] = [[]]
    done = 0
    for c in chunks:
        if out[-1] and done >= total * len(out) / cores and len(out) < cores:
            out.append([])
        out[-1].append(c)
        done += c.size
    return out


def _chunk_size(p: _Plan, rows: _RowSticks, spec: GatherSpec, config: CardConfig) -> int:
    """Positions per chunk: enough to spread the work over every core, no more than two buffer sets of
    gathered rows (plus the index sticks) fit in the scratchpad."""
    n = int(np.prod(p.index.shape))
    if spec.chunk:
        return spec.chunk
    row_bytes = rows.sticks_per_key * len(rows.keys) * STICK_BYTES
    fit = (config.scratchpad_plannable_bytes // 2 - 4 * STICK_BYTES) // (row_bytes + p.index.layout.itemsize)
    spread = -(-n // config.num_cores)
    return max(1, min(fit, spread))


def _index_lead(p: _Plan, r0: int, r1: int) -> np.ndarray:
    shape = p.index.shape[:-1]
    if not shape:
        return np.zeros((r1 - r0, 0), dtype=np.int64)
    return np.stack(np.unravel_index(np.arange(r0, r1), shape), axis=1).astype(np.int64)


def _emit_chunk(p: _Plan, rows: _RowSticks, c: _Chunk, buf: dict[str, int], parity: int) -> list[Instruction]:
    """Load the chunk's indices, gather each run of row sticks, store the gathered sticks to the output."""
    idx = p.index
    ins: list[Instruction] = []
    dev, lane0 = idx.row_sticks(_index_lead(p, c.r0, c.r1), c.c0, c.c1 - c.c0)
    ins += dma_tile(idx, dev, buf[f"idx{parity}"], store=False)
    width = dev.shape[1] * idx.lanes
    isz = idx.layout.itemsize
    index = SpTensor(buf[f"idx{parity}"] + lane0 * isz, idx.dtype, (c.r1 - c.r0, c.c1 - c.c0), (width, 1))
    n = c.size
    base = buf[f"rows{parity}"]
    offsets = []
    for first, length in rows.runs:
        offsets.append(base)
        ins.append(DmaGather(Addr(p.source.name, first * STICK_BYTES), index, rows.stride * STICK_BYTES, length,
                             base, p.num_rows))
        base += n * length * STICK_BYTES
    C = idx.shape[-1]
    positions = (np.arange(c.r0, c.r1)[:, None] * C + np.arange(c.c0, c.c1)[None, :]).reshape(-1)
    # [index rows, index columns, sticks]: keeping the chunk's two axes apart lets a store pattern
    # follow each one's own device stride.
    out_dev = _out_sticks(p, rows, positions).reshape(c.r1 - c.r0, c.c1 - c.c0, -1)
    lengths = {length for _, length in rows.runs}
    if len(lengths) == 1:  # every run alike: one (multi-loop) store pattern for all of them
        L = lengths.pop()
        tiles = out_dev.reshape(c.r1 - c.r0, c.c1 - c.c0, -1, L).transpose(2, 0, 1, 3)
        ins += dma_tile(p.out, tiles, offsets[0], store=True)
    else:
        col = 0
        for off, (_, length) in zip(offsets, rows.runs):
            ins += dma_tile(p.out, out_dev[:, :, col:col + length], off, store=True)
            col += length
    return ins


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def build_gather(spec: GatherSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """embedding / index_select / (expanded-index) gather -> (Program, KernelDecisions). Raises
    CodegenError for specs it cannot compile; an index outside the source's rows stops the program on
    the card (see :func:`explain_gather_error`)."""
    if _is_element_gather(spec):
        return build_element_gather(spec, config)
    if spec.kind == "index_select" and len(spec.source.shape) > 1 and spec.dim % len(spec.source.shape) == len(spec.source.shape) - 1:
        return build_element_gather(_select_as_gather(spec), config)
    p = _normalise(spec)
    rows = _source_rows(p)
    idx_rows = int(np.prod(p.index.shape[:-1])) if len(p.index.shape) > 1 else 1
    per_chunk = _chunk_size(p, rows, spec, config)
    plans = _chunk_plans(idx_rows, p.index.shape[-1], per_chunk, p.index.lanes)
    plan_name, chunks, plan_scores = _choose_chunks(p, rows, plans)
    per_core = _split(chunks, config.num_cores)
    largest = max(chunks, key=lambda c: c.size)
    row_bytes = rows.sticks_per_key * len(rows.keys) * STICK_BYTES
    idx_bytes = (largest.r1 - largest.r0) * (-(-(largest.c1 - largest.c0 + p.index.lanes - 1) // p.index.lanes) + 1) * STICK_BYTES
    bufs = [SpBuffer(f"{name}{q}", size) for q in range(2)
            for name, size in (("idx", idx_bytes), ("rows", largest.size * row_bytes))]
    try:
        sp_plan = plan(bufs, config.scratchpad_plannable_bytes)
    except ScratchpadOverflowError as e:
        raise CodegenError(f"{spec.kind} {spec.name}: a chunk of {largest.size} indices does not fit: {e}") from None
    buf = {b.name: b.offset for b in sp_plan.buffers}
    per_core = [cs for cs in per_core if cs]
    cores = {core: [i for n, c in enumerate(cs) for i in _emit_chunk(p, rows, c, buf, n % 2)]
             for core, cs in zip(core_ids(len(per_core), config), per_core)}
    decisions = _gather_decisions(spec, p, rows, per_core, per_chunk, sp_plan)
    decisions.tiling["chunking"] = plan_name
    decisions.alternatives.insert(0, {"option": "chunking by output DRAM bursts per index", **plan_scores,
                                      "chosen": plan_name})
    operands = [p.source.operand("in")]
    if p.index.name != p.source.name:
        operands.append(p.index.operand("in"))
    if p.out.name in (p.source.name, p.index.name):
        raise CodegenError(f"{spec.kind} out %{p.out.name} is also an input; write to a separate buffer")
    operands.append(p.out.operand("out"))
    meta = {"kind": "gather", "decisions": decisions.to_dict(),
            "gather": {"index_operand": p.index.name, "source_operand": p.source.name, "dim": p.dim,
                       "valid_range": [0, p.num_rows]}}
    return Program(spec.name, operands, cores, meta), decisions


def explain_gather_error(program: Program, error: Exception) -> str:
    """The card stops a DmaGather whose index is out of range, naming core, instruction and the range;
    this adds which index tensor and source it was, from the program's metadata."""
    g = program.metadata.get("gather")
    if not g:
        return str(error)
    lo, hi = g["valid_range"]
    return (f"{program.name}: index tensor %{g['index_operand']} holds a value outside [{lo}, {hi}), the valid "
            f"rows of %{g['source_operand']} along dim {g['dim']} ({error})")


def _gather_decisions(spec: GatherSpec, p: _Plan, rows: _RowSticks, per_core: list[list[_Chunk]],
                      per_chunk: int, sp_plan: Any) -> KernelDecisions:
    dec = KernelDecisions(spec.name, "gather", source_ops=list(spec.source_ops))
    dec.buffers = [BufferDecision(p.source.name, "input", p.source.describe()),
                   BufferDecision(p.index.name, "input", p.index.describe()),
                   BufferDecision(p.out.name, "output", p.out.describe())]
    sizes = [sum(c.size for c in cs) for cs in per_core if cs]
    dec.work_division = {"unit": "index positions (each output row owns its sticks)", "cores": len(sizes),
                         "positions_per_core": [min(sizes), max(sizes)], "chunks": sum(len(cs) for cs in per_core)}
    dec.tiling = {"positions_per_chunk": per_chunk, "gathers_per_chunk": len(rows.runs),
                  "row_sticks": [n for _, n in rows.runs], "row_stride_sticks": rows.stride, "dim": p.dim,
                  "valid_rows": p.num_rows}
    dec.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                      "buffers": {b.name: [b.offset, b.aligned_bytes] for b in sp_plan.buffers}}
    dec.overlap = {"double_buffered": ["idx", "rows"]}
    dec.alternatives = [
        {"option": "one DmaGather per contiguous run of a row's sticks", "gathers_per_chunk": len(rows.runs),
         "chosen": True},
        {"option": "relayout the source so a row's sticks are contiguous (one gather per chunk)",
         "chosen": False, "why": "a relayout pass over the whole table costs more than the extra gather instructions"},
    ]
    dec.notes = [f"indices outside [0, {p.num_rows}) stop the program at the DmaGather (card check); "
                 f"index tensor %{p.index.name}, source %{p.source.name}"]
    return dec


# ---------------------------------------------------------------------------------------------
# The wrapper's generator interface (compiler/wrapper.py: fn(KernelSpec, places, config) -> Program)
# ---------------------------------------------------------------------------------------------
GENERATOR = "gather"


def spec_from_kernel(kspec: Any, places: dict[str, Any]) -> GatherSpec:
    """``kspec.params``: kind (embedding, index_select or gather), source, index, out (buffer names), dim."""
    def arg(name: str) -> TensorArg:
        b = kspec.buffer(name)
        return TensorArg(name, places[name].layout, tuple(b.size), tuple(b.stride), int(places[name].storage_offset))

    p = kspec.params
    return GatherSpec(p["kind"], arg(p["source"]), arg(p["index"]), arg(p["out"]), int(p.get("dim", 0)),
                      kspec.name, source_ops=tuple(kspec.source_ops))


def generate(kspec: Any, places: dict[str, Any], config: CardConfig) -> Program:
    """Register with ``wrapper.register_generator(GENERATOR, generate)``."""
    program, decisions = build_gather(spec_from_kernel(kspec, places), config)
    decisions.source_lines = list(getattr(kspec, "source_lines", []))
    program.metadata["decisions"] = decisions.to_dict()
    return program


# ---------------------------------------------------------------------------------------------
# torch.gather along the stick dim: element gathers
# ---------------------------------------------------------------------------------------------
# out[r, j] = x[r, idx[r, j]] picks one element inside a stick. Per index: gather the stick that holds it
# (its number computed from the index on the vector unit), then keep its lane with a one-hot select and
# a row sum (exact: one non-zero term). A first DmaGather over the raw indices with num_rows = C makes
# the card check them against the gathered dim, so a bad index stops the program with torch's range.
ELEMENT_CHUNK_BYTES = 640  # scratchpad bytes per index per buffer set (gathered stick, one-hot, select, ...)


def _select_as_gather(spec: GatherSpec) -> GatherSpec:
    """index_select along the last dim is a gather whose index is the same for every row (stride 0)."""
    src, idx = spec.source, spec.index
    if len(idx.shape) > 1:
        raise CodegenError(f"index_select index %{idx.name} must be 1-d, got shape {list(idx.shape)}")
    n, stride = (idx.shape[0], idx.strides[0]) if idx.shape else (1, 1)
    expanded = TensorArg(idx.name, idx.layout, (*src.shape[:-1], n), (0,) * (len(src.shape) - 1) + (stride,),
                         idx.storage_offset)
    return GatherSpec("gather", src, expanded, spec.out, -1, spec.name, spec.chunk,
                      spec.source_ops or ("aten.index_select.default",))


def _is_element_gather(spec: GatherSpec) -> bool:
    return spec.kind == "gather" and len(spec.source.shape) >= 1 and spec.dim % len(spec.source.shape) == len(spec.source.shape) - 1


@dataclass(frozen=True)
class _ElementPlan:
    source: TensorArg
    index: TensorArg
    out: TensorArg
    first: np.ndarray  # [index rows] device stick of column 0 of the source row each index row reads
    lane0: int  # lane of column 0 in that stick (the same for every row)
    kstride: int  # device sticks between consecutive sticks of one source row
    rows: int  # index rows (all dims but the last)
    cols: int  # indices per row
    valid: int  # the source's gathered (last) dim: indices must lie in [0, valid)
    packed_index: bool = False  # index rows share sticks (e.g. [N, 1] sticked along N): read as one run
    packed_out: bool = False  # out rows share sticks: chunks of whole sticks, values stored as one run


def _element_plan(spec: GatherSpec) -> _ElementPlan:
    src, idx, out = spec.source, spec.index, spec.out
    if idx.dtype not in INDEX_DTYPES:
        raise CodegenError(f"gather index %{idx.name} must be int64 or int32, got {idx.dtype}")
    if src.dtype != out.dtype:
        raise CodegenError(f"gather: source %{src.name} is {src.dtype} but out %{out.name} is {out.dtype}")
    if len(idx.shape) != len(src.shape) or out.shape != idx.shape:
        raise CodegenError(f"gather: index {list(idx.shape)} must have the source's rank {len(src.shape)} and out "
                           f"its shape (out is {list(out.shape)})")
    if any(i > s for i, s in zip(idx.shape[:-1], src.shape[:-1])):
        raise CodegenError(f"gather index shape {list(idx.shape)} exceeds source {list(src.shape)} off the last dim")
    for role, t in (("source", src), ("index", idx), ("out", out)):
        t.check_last_dim_sticked(f"gather {role}")
    n_rows = int(np.prod(idx.shape[:-1]))
    lead = np.stack(np.unravel_index(np.arange(n_rows), idx.shape[:-1]), axis=1) if len(idx.shape) > 1 \
        else np.zeros((1, 0), dtype=np.int64)
    dev, lane0 = src.row_sticks(lead.astype(np.int64), 0, src.shape[-1])
    kstride = int(dev[0, 1] - dev[0, 0]) if dev.shape[1] > 1 else 0
    if dev.shape[1] > 1 and not np.array_equal(dev, dev[:, :1] + kstride * np.arange(dev.shape[1])):
        raise CodegenError(f"gather source %{src.name}: a row's sticks are not evenly spaced; relayout it first")
    return _ElementPlan(src, idx, out, dev[:, 0], lane0, kstride, n_rows, idx.shape[-1], src.shape[-1],
                        _rows_share_sticks(idx, "gather index", store=False),
                        _rows_share_sticks(out, "gather out", store=True))


def _rows_share_sticks(t: TensorArg, role: str, store: bool) -> bool:
    """True when ``t``'s rows cannot be moved row by row (rows of a few elements packed into shared
    sticks, as an [N, 1] tensor is: its layout drops the size-1 dim and sticks N) but all its elements
    lie in device order, row-major and back to back (one run of sticks, starting at lane 0 for a
    store). Rows that neither own their sticks nor are packed raise the row path's error."""
    lead = _lead_coords(t.shape, 0, int(np.prod(t.shape[:-1])))
    try:
        _, lane0 = t.row_sticks(lead, 0, t.shape[-1])
        if store:
            check_owns_sticks(t, lane0, t.shape[-1], role)
        return False
    except CodegenError as row_error:
        dev = _packed_offsets(t)
        # A store writes whole sticks: the run must start a stick and be all of its buffer (padding after).
        if np.any(np.diff(dev) != 1) or (store and (dev[0] % t.lanes or dev.size != t.layout.numel)):
            raise row_error
        return True


def _lead_coords(shape: tuple[int, ...], r0: int, r1: int) -> np.ndarray:
    """Coordinates of rows [r0, r1) over all dims but the last ([n, ndim-1])."""
    if len(shape) <= 1:
        return np.zeros((r1 - r0, 0), dtype=np.int64)
    return np.stack(np.unravel_index(np.arange(r0, r1), shape[:-1]), axis=1).astype(np.int64)


def _packed_offsets(t: TensorArg, r0: int = 0, r1: int | None = None) -> np.ndarray:
    """Device element offsets of rows [r0, r1) of ``t``, row-major."""
    r1 = int(np.prod(t.shape[:-1])) if r1 is None else r1
    lead = _lead_coords(t.shape, r0, r1)
    coords = np.concatenate([np.repeat(lead, t.shape[-1], axis=0),
                             np.tile(np.arange(t.shape[-1]), r1 - r0)[:, None]], axis=1)
    return t.layout.device_offsets(t.host_index(coords))


def _packed_tile(t: TensorArg, r0: int, r1: int) -> tuple[np.ndarray, int]:
    """The sticks holding rows [r0, r1) of a packed tensor (one run) and the lane of the first element."""
    dev = _packed_offsets(t, r0, r1)
    return np.arange(dev[0] // t.lanes, dev[-1] // t.lanes + 1, dtype=np.int64), int(dev[0] % t.lanes)


def _element_chunks(ep: _ElementPlan, per_chunk: int) -> list[_Chunk]:
    """Whole index rows (or 128-aligned pieces of one row), never across a break in the rows' first
    sticks' stride, so a chunk's row bases are first + i * stride."""
    if ep.packed_out:  # whole output sticks per chunk, so no two chunks (cores) share one
        unit = ep.out.lanes // math.gcd(ep.out.lanes, ep.cols)
        step = max(unit, per_chunk // ep.cols // unit * unit)
        return [_Chunk(r, min(ep.rows, r + step), 0, ep.cols) for r in range(0, ep.rows, step)]
    if ep.cols > per_chunk:
        seg = max(128, per_chunk // 128 * 128)
        return [_Chunk(r, r + 1, c, min(ep.cols, c + seg)) for r in range(ep.rows) for c in range(0, ep.cols, seg)]
    step = max(1, per_chunk // ep.cols)
    out, r = [], 0
    while r < ep.rows:
        end = min(ep.rows, r + step)
        d = np.diff(ep.first[r:end])
        if d.size and (d != d[0]).any():
            end = r + 1 + int(np.flatnonzero(d != d[0])[0])
        out.append(_Chunk(r, end, 0, ep.cols))
        r = end
    return out


class _ElementEmitter:
    """One core's chunks; ``sp(name, ...)`` views into its planned buffers (two sets, by chunk parity)."""

    def __init__(self, ep: _ElementPlan, buf: dict[str, int]):
        self.ep, self.buf = ep, buf
        self.ins: list[Instruction] = []
        self.val_dtype = "int64" if ep.source.dtype in ("int64", "int32", "bool") else "float32"

    def sp(self, name: str, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
           elem_offset: int = 0) -> SpTensor:
        return SpTensor(self.buf[name] + elem_offset * SP_DTYPES[dtype], dtype, shape, strides)

    def ew(self, op: str, out: SpTensor, *inputs: SpTensor | int | float) -> None:
        self.ins.append(Elementwise(op, out, tuple(x if isinstance(x, SpTensor) else Scalar(x) for x in inputs)))

    def iota(self, name: str, n: int) -> SpTensor:
        """0 .. n-1 in scratchpad with no constants: n-1 zeros then n ones, summed through a sliding
        window (row i of the [n, n] window, strides [1, 1], holds i + 1 ones)."""
        self.ew("copy", self.sp(name, "int64", (n - 1,)), 0)
        self.ew("copy", self.sp(name, "int64", (n,), elem_offset=n - 1), 1)
        out = self.sp(name, "int64", (n, 1), elem_offset=2 * n - 1)
        self.ins.append(Reduce("sum", out, self.sp(name, "int64", (n, n), (1, 1)), axis=1))
        self.ew("sub", out, out, 1)
        return out

    def run(self, chunks: list[_Chunk], max_rows: int) -> list[Instruction]:
        lanes = self.ep.source.lanes
        self.iota_rows = self.iota("iota_rows", max(max_rows, 2))
        iota_lanes = self.iota("iota_lanes", lanes)
        self.iota_lanes = SpTensor(iota_lanes.offset, "int64", (lanes,), (1,))
        for n, c in enumerate(chunks):
            self.chunk(c, n % 2)
        return self.ins

    def chunk(self, c: _Chunk, p: int) -> None:
        ep, nr, nc = self.ep, c.r1 - c.r0, c.c1 - c.c0
        n, lanes = nr * nc, ep.source.lanes
        idx = ep.index
        if ep.packed_index:
            dev, l0 = _packed_tile(idx, c.r0, c.r1)
            pitch = nc
        else:
            dev, l0 = idx.row_sticks(_lead_coords(idx.shape, c.r0, c.r1), c.c0, nc)
            pitch = dev.shape[1] * idx.lanes
        self.ins += dma_tile(idx, dev, self.buf[f"idx{p}"], store=False)
        index = self.sp(f"idx{p}", idx.dtype, (nr, nc), (pitch, 1), l0)
        rows = SpTensor(self.buf[f"g{p}"], ep.source.dtype, (n, lanes))
        # The card checks every index against the gathered dim (row_stride 0: each reads one stick).
        self.ins.append(DmaGather(Addr(ep.source.name, 0), index, 0, 1, rows.offset, ep.valid))
        # Stick of each element: first(row) + ((idx + lane0) // lanes) * kstride.
        base = self._row_bases(c, p)
        pos = self.sp(f"pos{p}", "int64", (nr, nc))
        self.ew("add", pos, index, ep.lane0)
        stick = self.sp(f"stick{p}", "int64", (nr, nc))
        self.ew("floordiv", stick, pos, lanes)
        self.ew("fma", stick, stick, ep.kstride, SpTensor(base.offset, "int64", (nr, nc), (1, 0)))
        self.ins.append(DmaGather(Addr(ep.source.name, 0), stick, STICK_BYTES, 1, rows.offset,
                                  ep.source.layout.nbytes // STICK_BYTES))
        # Keep each stick's lane (idx + lane0) % lanes: one-hot, select, row sum.
        self.ew("remainder", pos, pos, lanes)
        hot = self.sp(f"hot{p}", "bool", (n, lanes))
        self.ew("eq", hot, SpTensor(pos.offset, "int64", (n, lanes), (1, 0)),
                SpTensor(self.iota_lanes.offset, "int64", (n, lanes), (0, 1)))
        sel = self.sp(f"sel{p}", self.val_dtype, (n, lanes))
        self.ew("where", sel, hot, rows, 0)
        val = self.sp(f"val{p}", self.val_dtype, (n, 1))
        self.ins.append(Reduce("sum", val, sel, axis=1))
        self._store(c, p, val)

    def _row_bases(self, c: _Chunk, p: int) -> SpTensor:
        """Device stick of column 0 of each chunk row's source row: one fma over the row iota per run
        of rows whose first sticks are evenly spaced (one run unless rows cross a break of the layout)."""
        first, nr = self.ep.first[c.r0:c.r1], c.r1 - c.r0
        base = self.sp(f"base{p}", "int64", (nr, 1))
        start = 0
        while start < nr:
            end = min(start + 2, nr)
            while end < nr and first[end] - first[end - 1] == first[start + 1] - first[start]:
                end += 1
            step = int(first[start + 1] - first[start]) if end - start > 1 else 0
            n = end - start
            self.ew("fma", self.sp(f"base{p}", "int64", (n, 1), elem_offset=start),
                    SpTensor(self.iota_rows.offset, "int64", (n, 1)), step, int(first[start]))
            start = end
        return base

    def _store(self, c: _Chunk, p: int, val: SpTensor) -> None:
        ep, nr, nc = self.ep, c.r1 - c.r0, c.c1 - c.c0
        out = ep.out
        if ep.packed_out:
            self._store_packed(c, p, val)
            return
        dev, l0 = out.row_sticks(_lead_coords(out.shape, c.r0, c.r1), c.c0, nc)
        check_owns_sticks(out, l0, nc, "gather out", c.c0)
        w = dev.shape[1] * out.lanes
        if w > nc:  # padding lanes are stored with the row: give them a value
            self.ew("copy", self.sp(f"o{p}", out.dtype, (nr, w - nc), (w, 1), nc), 0)
        self.ew("cast", self.sp(f"o{p}", out.dtype, (nr, nc), (w, 1)), SpTensor(val.offset, val.dtype, (nr, nc)))
        self.ins += dma_tile(out, dev, self.buf[f"o{p}"], store=True)

    def _store_packed(self, c: _Chunk, p: int, val: SpTensor) -> None:
        """Rows packed into shared sticks: the chunk's values are one run of whole sticks from lane 0
        (chunks hold whole sticks; past the last element only padding follows)."""
        out, n = self.ep.out, (c.r1 - c.r0) * (c.c1 - c.c0)
        dev, _ = _packed_tile(out, c.r0, c.r1)
        w = dev.size * out.lanes
        if w > n:  # padding lanes are stored with the run: give them a value
            self.ew("copy", self.sp(f"o{p}", out.dtype, (w - n,), elem_offset=n), 0)
        self.ew("cast", self.sp(f"o{p}", out.dtype, (n,)), SpTensor(val.offset, val.dtype, (n,)))
        self.ins += dma_tile(out, dev, self.buf[f"o{p}"], store=True)


def _element_buffers(ep: _ElementPlan, per_chunk: int, max_rows: int) -> list[SpBuffer]:
    n, lanes = per_chunk, ep.source.lanes
    sel_bytes = 8 if ep.source.dtype in ("int64", "int32", "bool") else 4  # int64 or fp32 selections
    row = min(per_chunk, ep.cols)  # a chunk's rows hold at most this many indices each
    k_idx = -(-(row + ep.index.lanes) // ep.index.lanes) + 1
    k_out = -(-(row + ep.out.lanes) // ep.out.lanes) + 1
    idx_rows = out_rows = max_rows
    if ep.packed_index:  # one run of all the chunk's elements
        k_idx, idx_rows = -(-(per_chunk + ep.index.lanes) // ep.index.lanes) + 1, 1
    if ep.packed_out:
        k_out, out_rows = -(-(per_chunk + ep.out.lanes) // ep.out.lanes) + 1, 1
    out = [SpBuffer("iota_rows", 8 * (3 * max(max_rows, 2))), SpBuffer("iota_lanes", 8 * 3 * lanes)]
    for p in range(2):
        out += [SpBuffer(f"idx{p}", idx_rows * k_idx * STICK_BYTES), SpBuffer(f"g{p}", n * STICK_BYTES),
                SpBuffer(f"base{p}", 8 * max_rows), SpBuffer(f"pos{p}", 8 * n), SpBuffer(f"stick{p}", 8 * n),
                SpBuffer(f"hot{p}", n * lanes), SpBuffer(f"sel{p}", n * lanes * sel_bytes),
                SpBuffer(f"val{p}", 8 * n), SpBuffer(f"o{p}", out_rows * k_out * STICK_BYTES)]
    return out


def build_element_gather(spec: GatherSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """torch.gather along the source's stick (last) dim, element by element (see the section comment)."""
    ep = _element_plan(spec)
    per_chunk = spec.chunk or max(1, min(config.scratchpad_plannable_bytes // (2 * ELEMENT_CHUNK_BYTES),
                                         -(-ep.rows * ep.cols // config.num_cores)))
    while True:  # the estimate per index ignores the rows' stick padding: halve until the plan fits
        chunks = _element_chunks(ep, per_chunk)
        max_rows = max(c.r1 - c.r0 for c in chunks)
        largest = max(c.size for c in chunks)
        try:
            sp_plan = plan(_element_buffers(ep, largest, max_rows), config.scratchpad_plannable_bytes)
            break
        except ScratchpadOverflowError as e:
            if per_chunk == 1 or spec.chunk:
                raise CodegenError(f"gather {spec.name}: a chunk of {largest} indices does not fit: {e}") from None
            per_chunk //= 2
    per_core = [cs for cs in _split(chunks, config.num_cores) if cs]
    buf = {b.name: b.offset for b in sp_plan.buffers}
    cores = {core: _ElementEmitter(ep, buf).run(cs, max_rows)
             for core, cs in zip(core_ids(len(per_core), config), per_core)}
    dec = KernelDecisions(spec.name, "gather", source_ops=list(spec.source_ops) or ["aten.gather.default"])
    dec.buffers = [BufferDecision(t.name, role, t.describe()) for role, t in
                   (("input", ep.source), ("input", ep.index), ("output", ep.out))]
    sizes = [sum(c.size for c in cs) for cs in per_core]
    dec.work_division = {"unit": "index rows (output rows own their sticks)", "cores": len(per_core),
                         "positions_per_core": [min(sizes), max(sizes)], "chunks": len(chunks)}
    dec.tiling = {"mode": "element gather along the stick dim", "positions_per_chunk": per_chunk,
                  "gathers_per_chunk": 2, "valid_rows": ep.valid, "dim": len(ep.source.shape) - 1}
    dec.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                      "buffers": {b.name: [b.offset, b.aligned_bytes] for b in sp_plan.buffers}}
    dec.overlap = {"double_buffered": ["idx", "g", "pos", "stick", "hot", "sel", "val", "o"]}
    dec.alternatives = [{"option": "relayout the source sticked on another dim, then a row gather", "chosen": False,
                         "why": "a pass over the whole source for a few elements per row"},
                        {"option": "one stick per index + one-hot lane select", "chosen": True,
                         "cost": "two 128-byte stick reads per gathered element (range check + value)"}]
    dec.notes = [f"indices outside [0, {ep.valid}) stop the program at the first DmaGather (card check)"]
    operands = [ep.source.operand("in")]
    if ep.index.name != ep.source.name:
        operands.append(ep.index.operand("in"))
    operands.append(ep.out.operand("out"))
    meta = {"kind": "gather", "decisions": dec.to_dict(),
            "gather": {"index_operand": ep.index.name, "source_operand": ep.source.name,
                       "dim": len(ep.source.shape) - 1, "valid_range": [0, ep.valid]}}
    return Program(spec.name, operands, cores, meta), dec

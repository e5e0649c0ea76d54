"""torch.gather along the stick dim: element gathers.

out[r, j] = x[r, idx[r, j]] picks one element inside a stick. Per index: gather the stick that holds it
(its number computed from the index on the vector unit), then keep its lane with a one-hot select and
a row sum (exact: one non-zero term). A first DmaGather over the raw indices with num_rows = C makes
the card check them against the gathered dim, so a bad index stops the program with torch's range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from torch_spyre.card import costs
from torch_spyre.card.config import CardConfig
from torch_spyre.compiler.access import CodegenError, TensorView
from torch_spyre.compiler.codegen.emitter import Emitter
from torch_spyre.compiler.codegen.gather.plan import _Chunk, _lead_coords, _split
from torch_spyre.compiler.codegen.gather.spec import INDEX_DTYPES, GatherSpec
from torch_spyre.compiler.codegen.sticks import check_owns_sticks, dma_tile
from torch_spyre.compiler.core_count import CoreCount, cores_for, dma_cycles
from torch_spyre.compiler.decisions import BufferDecision, KernelDecisions
from torch_spyre.compiler.placement import cores_near_memory
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, SpBuffer, plan
from torch_spyre.program import STICK_BYTES, Addr, DmaGather, Instruction, Program, Reduce, SpTensor

ELEMENT_CHUNK_BYTES = 640  # scratchpad bytes per index per buffer set (gathered stick, one-hot, select, ...)


@dataclass(frozen=True)
class _ElementPlan:
    source: TensorView
    index: TensorView
    out: TensorView
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


def _rows_share_sticks(t: TensorView, role: str, store: bool) -> bool:
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

def _packed_offsets(t: TensorView, r0: int = 0, r1: int | None = None) -> np.ndarray:
    """Device element offsets of rows [r0, r1) of ``t``, row-major."""
    r1 = int(np.prod(t.shape[:-1])) if r1 is None else r1
    lead = _lead_coords(t.shape, r0, r1)
    coords = np.concatenate([np.repeat(lead, t.shape[-1], axis=0),
                             np.tile(np.arange(t.shape[-1]), r1 - r0)[:, None]], axis=1)
    return t.layout.device_offsets(t.host_index(coords))


def _packed_tile(t: TensorView, r0: int, r1: int) -> tuple[np.ndarray, int]:
    """The sticks holding rows [r0, r1) of a packed tensor (one run, as a [1, k] tile of sticks) and the
    lane of the first element."""
    dev = _packed_offsets(t, r0, r1)
    return np.arange(dev[0] // t.lanes, dev[-1] // t.lanes + 1, dtype=np.int64)[None], int(dev[0] % t.lanes)


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
class _ElementEmitter(Emitter):
    """One core's chunks; ``sp(name, ...)`` views into its planned buffers (two sets, by chunk parity)."""

    def __init__(self, ep: _ElementPlan, buf: dict[str, int]):
        super().__init__(buf)
        self.ep = ep
        self.val_dtype = "int64" if ep.source.dtype in ("int64", "int32", "bool") else "float32"

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


def _core_count(ep: _ElementPlan, config: CardConfig) -> CoreCount:
    """Cores for an element gather (``core_count``): per index, two stick reads (the range check and the
    value), the one-hot select of a stick's lanes and its row sum on the vector unit (fp32), and the
    value stored."""
    n = ep.rows * ep.cols
    vector = 2 * costs.vector_cycles(config, n * ep.source.lanes, 4)
    return cores_for(dma_cycles(config, n * (2 * STICK_BYTES + ep.out.itemsize)) + vector, config, parts=n)


def build_element_gather(spec: GatherSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """torch.gather along the source's stick (last) dim, element by element (see the section comment)."""
    ep = _element_plan(spec)
    count = _core_count(ep, config)
    per_chunk = spec.chunk or max(1, min(config.scratchpad_plannable_bytes // (2 * ELEMENT_CHUNK_BYTES),
                                         -(-ep.rows * ep.cols // count.cores)))
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
    per_core = [cs for cs in _split(chunks, min(config.num_cores, max(count.cores, len(chunks)))) if cs]
    buf = {b.name: b.offset for b in sp_plan.buffers}
    cores = {core: _ElementEmitter(ep, buf).run(cs, max_rows)
             for core, cs in zip(cores_near_memory(len(per_core), config), per_core)}
    dec = KernelDecisions(spec.name, "gather", source_ops=list(spec.source_ops) or ["aten.gather.default"])
    dec.buffers = [BufferDecision(t.name, role, t.describe()) for role, t in
                   (("input", ep.source), ("input", ep.index), ("output", ep.out))]
    sizes = [sum(c.size for c in cs) for cs in per_core]
    dec.work_division = {"unit": "index rows (output rows own their sticks)", "cores": len(per_core),
                         "positions_per_core": [min(sizes), max(sizes)], "chunks": len(chunks)}
    dec.core_count = count.to_dict()
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

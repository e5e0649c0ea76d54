"""Event-driven timing of a Spyre program on the simulated card.

Timing depends only on the program (never on data or on the addresses bound at launch), so the runtime
computes it once per prepared program and reuses it. Every figure comes from :class:`CardConfig`.

The model
---------
*Engines.* Each core has a DMA engine with a read and a write channel, its PE arrays (``corelets_in_use``
of them, a MatMul is split across them), a vector unit and a ring port with one lane per direction.
Instructions issue in program order and each engine runs its own instructions in order, asynchronously
from the others.

*Dependencies.* An instruction starts when its engine is free and every earlier instruction of the same
core that touches overlapping scratchpad bytes in a conflicting way (RAW, WAR, WAW) has finished; DMA on
overlapping bytes of one operand is ordered the same way (symbolically: operand and offset). That alone
gives double-buffering overlap: a load into buffer B runs while the vector unit works on buffer A.
Across cores: ``Wait`` starts after the matching ``Signal`` has travelled the ring; ``RingRecv`` after the
matching ``RingSend`` has delivered its bytes (and later readers of those bytes depend on the RingRecv);
``Barrier`` releases its group once every member has arrived. ``Signal`` and ``Barrier`` first wait for all
earlier work of their core (a fence: what was written must be visible); ``Wait`` and ``Barrier`` hold back
every later instruction of their core.

*Work.* MatMul: weight-stationary tiles of ``pe_rows`` x (``pe_cols`` x SIMD width), each streaming the M
rows of activations plus a systolic fill and drain of ``pe_rows + pe_cols + mac_latency_cycles`` cycles.
Vector ops: one 128-byte stick per cycle per corelet for 2-byte types (so fp32 takes twice as long), plus
``vector_transcendental_cycles`` extra cycles per stick for transcendental ops. Sync: ring hop latency.

*Transfers.* DMA and ring sends are fluid flows: after a fixed latency (``dram_latency_s`` for DMA, hop
latency x hops for the ring) their bytes move at a rate recomputed at every start/finish event by max-min
fair sharing (progressive filling) of the resources on their path:

- LPDDR5: one resource shared by all cores. A byte read costs 1/(peak x read efficiency) of its time, a
  byte written 1/(peak x write efficiency), and each byte pays a read/write turnaround penalty in
  proportion to the share of active DRAM flows going the other way, sized so that an even mix achieves
  ``dram_mixed_efficiency``. Strided patterns pay ``dram_run_overhead_bytes`` per contiguous run.
- ring links: a bidirectional ring of ``num_cores`` stops, one link per neighbouring pair and direction,
  ``ring_bytes_per_cycle x clock x ring_efficiency`` each; transfers take the shortest direction (clockwise
  on a tie). DRAM traffic rides the ring between a core and the memory interface at ``memory_ring_stop``.
  ``RingSend(network="reduce")`` uses a separate ring of ``reduction_ring_bytes_per_cycle`` links.
- a DMA flow is also capped by its core's DMA engine (``dma_bytes_per_cycle``), a ring flow by one link's
  bandwidth (the port's injection rate).

A kernel costs ``kernel_fixed_cost_s`` on top of its instructions; it is modelled as a prologue, so the
first instruction starts at ``fixed_cost_s``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..program import (
    STICK_BYTES,
    TRANSCENDENTAL_OPS,
    Barrier,
    Addr,
    DmaGather,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Program,
    ProgramError,
    Reduce,
    RingRecv,
    RingSend,
    Signal,
    SpTensor,
    Wait,
)
from . import costs
from .config import CardConfig

ENGINES = ("dma", "pe", "vector", "ring")
_EPS_BYTES = 1e-6  # a flow with fewer bytes left than this has finished (float round-off)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """When one instruction ran: seconds from the start of the kernel (fixed cost included)."""

    core: int
    index: int
    engine: str  # dma, pe, vector, ring or sync
    op: str
    start: float
    end: float


@dataclass
class ProgramTiming:
    program_name: str
    total_s: float
    fixed_cost_s: float
    intervals: list[Interval]
    busy_s: dict[int, dict[str, float]]  # core -> engine -> seconds the engine was busy (union of intervals)
    bytes: dict[str, int]  # dram_read, dram_write, ring, reduce_ring, sp_read, sp_write
    flops: int  # 2*M*N*K per matmul plus one per vector element
    pe_flops: int
    compute_bound_s: float  # the work at peak rate on the cores the program uses
    dram_bound_s: float  # DRAM bytes at the read/write bandwidths
    dram_busy_s: float  # seconds of fully used DRAM time, turnaround and strided-burst penalties included
    ring_link_busiest_s: float  # seconds of fully used time of the busiest ring link
    bottleneck: str
    config: CardConfig = field(repr=False)

    @property
    def execution_s(self) -> float:
        """Time from the first instruction to the last (the kernel time without the fixed cost)."""
        return self.total_s - self.fixed_cost_s

    @property
    def roofline_s(self) -> float:
        """The best the card could do: max(compute at peak, DRAM bytes at bandwidth) plus the fixed cost."""
        return max(self.compute_bound_s, self.dram_bound_s) + self.fixed_cost_s

    @property
    def roofline_fraction(self) -> float:
        """Fraction of the roofline achieved (1.0 = as fast as the bound allows)."""
        return self.roofline_s / self.total_s if self.total_s > 0 else 1.0

    @property
    def utilization(self) -> dict[int, dict[str, float]]:
        """core -> engine -> busy seconds / total seconds."""
        return {c: {e: (b / self.total_s if self.total_s else 0.0) for e, b in eng.items()} for c, eng in self.busy_s.items()}

    def dram_bandwidth(self) -> float:
        """Achieved DRAM bytes per second over the execution (fixed cost excluded)."""
        moved = self.bytes["dram_read"] + self.bytes["dram_write"]
        return moved / self.execution_s if self.execution_s > 0 else 0.0

    def summary(self) -> str:
        us = 1e6
        lines = [
            f"program {self.program_name}: {self.total_s * us:.2f} us "
            f"(fixed {self.fixed_cost_s * us:.2f} us + execution {self.execution_s * us:.2f} us), {self.bottleneck}",
            f"  roofline {self.roofline_s * us:.2f} us (compute {self.compute_bound_s * us:.2f} us, "
            f"DRAM {self.dram_bound_s * us:.2f} us), achieved {100 * self.roofline_fraction:.1f} % of it; "
            f"DRAM fully used {self.dram_busy_s * us:.2f} us, busiest ring link {self.ring_link_busiest_s * us:.2f} us",
            f"  bytes: DRAM read {self.bytes['dram_read']:,}, DRAM write {self.bytes['dram_write']:,}, "
            f"ring {self.bytes['ring']:,}, reduce ring {self.bytes['reduce_ring']:,}, "
            f"scratchpad read {self.bytes['sp_read']:,}, write {self.bytes['sp_write']:,}",
            f"  flops: {self.flops:,} ({self.pe_flops:,} on the PE arrays)",
            f"  {'utilization (% of total)':<28}" + " ".join(f"{e:>6}" for e in ENGINES),
        ]
        lines += [f"    {label:<26}" + row for label, row in self._utilization_rows()]
        return "\n".join(lines)

    def _utilization_rows(self) -> list[tuple[str, str]]:
        """One row per run of consecutive cores with the same (rounded) utilization, so that 32 cores
        doing the same work print as one line."""
        util = self.utilization
        rows: list[tuple[list[int], str]] = []
        for core in sorted(util):
            row = " ".join(f"{100 * util[core][e]:6.1f}" for e in ENGINES)
            if rows and rows[-1][1] == row and rows[-1][0][-1] == core - 1:
                rows[-1][0].append(core)
            else:
                rows.append(([core], row))
        return [(f"core {c[0]}" if len(c) == 1 else f"cores {c[0]}-{c[-1]}", row) for c, row in rows]


# ---------------------------------------------------------------------------------------------
# Static cost of one instruction
# ---------------------------------------------------------------------------------------------
@dataclass
class _Flow:
    """A transfer's bytes and the path they take (the part the fluid model shares)."""

    nbytes: float
    links: tuple[Any, ...]  # ring link ids crossed, each at weight 1 byte per byte
    dram: str  # "r", "w" or "" (no DRAM)
    dram_factor: float  # DRAM byte-equivalents per byte (strided patterns > 1)
    cap: float  # bytes/s limit of the issuing engine

    def signature(self) -> tuple:
        return (self.links, self.dram, self.dram_factor, self.cap)


@dataclass
class _Node:
    core: int
    index: int
    instr: Instruction
    engine: str  # reporting engine
    lane: Any  # in-order queue the instruction waits for; None = no engine (sync, ring receive)
    duration: float = 0.0  # seconds of engine time (compute, sync latency) or the latency of a transfer
    flow: _Flow | None = None
    reads: list[tuple[int, int]] = field(default_factory=list)  # scratchpad byte ranges
    writes: list[tuple[int, int]] = field(default_factory=list)
    dram: list[tuple[str, int, int, bool]] = field(default_factory=list)  # operand, lo, hi, is_write
    preds: set[int] = field(default_factory=set)


def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _pattern_range(offset: int, pattern: DmaPattern) -> tuple[int, int]:
    lo, hi = pattern.span(pattern.sp_strides)
    return offset + lo, offset + hi


def _dram_range(addr: Addr, pattern: DmaPattern) -> tuple[int, int]:
    lo, hi = pattern.span(pattern.dram_strides)
    return addr.offset + lo, addr.offset + hi


def _contiguous_runs(pattern: DmaPattern) -> int:
    """Number of contiguous DRAM bursts: trailing loops whose stride continues the burst merge into it."""
    if pattern.sticks == 0:
        return 0
    run_bytes, run_sticks = STICK_BYTES, 1
    for size, stride in zip(reversed(pattern.shape), reversed(pattern.dram_strides)):
        if size == 1:
            continue
        if stride != run_bytes:
            break
        run_bytes *= size
        run_sticks *= size
    return pattern.sticks // run_sticks


def _ring_path(src: int, dst: int, n: int, net: str) -> tuple[Any, ...]:
    """Links of network ``net`` crossed from stop ``src`` to ``dst`` (``costs.ring_path``)."""
    return tuple((net, *link) for link in costs.ring_path(src, dst, n))


def _direction(path: tuple[Any, ...]) -> str:
    return path[0][1] if path else "cw"


class _Coster:
    """Turns one instruction into engine time, a flow and scratchpad accesses (no simulation here)."""

    def __init__(self, config: CardConfig):
        self.cfg = config
        self.clock = config.clock_hz
        self.dma_cap = config.dma_bytes_per_cycle * config.clock_hz
        self.link_bw = config.ring_link_bandwidth
        self.reduce_link_bw = config.reduction_ring_bytes_per_cycle * config.clock_hz * config.ring_efficiency
        self.handlers = {
            DmaLoad: self.dma_load, DmaStore: self.dma_store, DmaGather: self.dma_gather, MatMul: self.matmul,
            Elementwise: self.elementwise, Reduce: self.reduce, RingSend: self.ring_send, Signal: self.signal,
            Barrier: self.barrier,
        }

    # --- DMA ----------------------------------------------------------------------------------
    def dram_flow(self, core: int, nbytes: int, runs: int, direction: str) -> _Flow:
        n, mem = self.cfg.num_cores, self.cfg.memory_ring_stop
        path = _ring_path(mem, core, n, "data") if direction == "r" else _ring_path(core, mem, n, "data")
        factor = 1.0 + (runs * self.cfg.dram_run_overhead_bytes / nbytes if nbytes else 0.0)
        return _Flow(float(nbytes), path, direction, factor, self.dma_cap)

    def dma_load(self, node: _Node, ins: DmaLoad) -> None:
        node.writes.append(_pattern_range(ins.sp_offset, ins.pattern))
        node.dram.append((ins.src.operand, *_dram_range(ins.src, ins.pattern), False))
        node.flow = self.dram_flow(node.core, ins.pattern.nbytes, _contiguous_runs(ins.pattern), "r")
        node.duration = self.cfg.dram_latency_s

    def dma_store(self, node: _Node, ins: DmaStore) -> None:
        node.reads.append(_pattern_range(ins.sp_offset, ins.pattern))
        node.dram.append((ins.dst.operand, *_dram_range(ins.dst, ins.pattern), True))
        node.flow = self.dram_flow(node.core, ins.pattern.nbytes, _contiguous_runs(ins.pattern), "w")
        node.duration = self.cfg.dram_latency_s

    def dma_gather(self, node: _Node, ins: DmaGather) -> None:
        rows = ins.index.numel
        nbytes = rows * ins.row_sticks * STICK_BYTES
        node.reads.append(ins.index.byte_span())
        node.writes.append((ins.sp_offset, ins.sp_offset + nbytes))
        # Which rows are read depends on data: any row of the source may be.
        node.dram.append((ins.src.operand, ins.src.offset, ins.src.offset + ins.num_rows * ins.row_stride, False))
        # Rows land wherever the indices say: each row is its own burst.
        node.flow = self.dram_flow(node.core, nbytes, rows, "r")
        node.duration = self.cfg.dram_latency_s

    # --- compute ------------------------------------------------------------------------------
    def matmul_cycles(self, ins: MatMul) -> int:
        batch = _prod(ins.b.shape[:-2]) if len(ins.b.shape) > 2 else 1
        k, n = ins.a.shape[-1], ins.out.shape[-1]
        m = max(1, _prod(ins.out.shape[:-1]) // batch)
        return costs.pe_matmul_cycles(self.cfg, m, k, n, ins.a.dtype, batch)

    def matmul(self, node: _Node, ins: MatMul) -> None:
        node.reads += [ins.a.byte_span(), ins.b.byte_span()]
        if ins.accumulate:
            node.reads.append(ins.out.byte_span())
        node.writes.append(ins.out.byte_span())
        node.duration = self.matmul_cycles(ins) / self.clock

    def vector_cycles(self, elements: int, itemsize: int, op: str) -> int:
        return costs.vector_cycles(self.cfg, elements, itemsize, op in TRANSCENDENTAL_OPS)

    def elementwise(self, node: _Node, ins: Elementwise) -> None:
        tensors = [t for t in ins.inputs if isinstance(t, SpTensor)]
        node.reads += [t.byte_span() for t in tensors]
        node.writes.append(ins.out.byte_span())
        # Broadcast operands (a stride of 0) are read once per stick, so they do not set the width.
        width = max([ins.out.itemsize] + [t.itemsize for t in tensors if 0 not in t.strides])
        node.duration = self.vector_cycles(ins.out.numel, width, ins.op) / self.clock

    def reduce(self, node: _Node, ins: Reduce) -> None:
        node.reads.append(ins.inp.byte_span())
        if ins.accumulate:
            node.reads.append(ins.out.byte_span())
        node.writes.append(ins.out.byte_span())
        node.duration = self.vector_cycles(ins.inp.numel, ins.inp.itemsize, ins.op) / self.clock

    # --- ring and sync ------------------------------------------------------------------------
    def hop_seconds(self, hops: int) -> float:
        return hops * self.cfg.ring_hop_latency_cycles / self.clock

    def ring_send(self, node: _Node, ins: RingSend) -> None:
        net = "reduce" if ins.network == "reduce" else "data"
        path = _ring_path(node.core, ins.dst_core, self.cfg.num_cores, net)
        cap = self.reduce_link_bw if net == "reduce" else self.link_bw
        node.reads.append((ins.src_offset, ins.src_offset + ins.nbytes))
        node.flow = _Flow(float(ins.nbytes), path, "", 1.0, cap)
        node.duration = self.hop_seconds(len(path))
        node.lane = ("ring", net, _direction(path))

    def signal(self, node: _Node, ins: Signal) -> None:
        node.duration = self.hop_seconds(len(_ring_path(node.core, ins.dst_core, self.cfg.num_cores, "data")))

    def barrier(self, node: _Node, ins: Barrier) -> None:
        # Releasing a group takes a token round trip across the ring's diameter.
        node.duration = self.hop_seconds(self.cfg.num_cores // 2)

    def cost(self, node: _Node) -> None:
        handler = self.handlers.get(type(node.instr))
        if handler is not None:
            handler(node, node.instr)


# ---------------------------------------------------------------------------------------------
# Dependencies
# ---------------------------------------------------------------------------------------------
class _Hazards:
    """Access records of one address space (a core's scratchpad, or one device-memory operand); finds the
    RAW/WAR/WAW predecessors of a new instruction.

    Records are kept sorted by start with the longest length seen, so a query only scans records that can
    overlap. Records that can no longer matter are dropped: one fully covered by a later write (that write
    already depends on it, so whatever depends on the write is ordered after it too), and a read covered
    by a later read on the same in-order engine (which finishes after it)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.records: list[tuple[int, int, int, bool, Any]] = []  # lo, hi, node id, is_write, lane
        self.longest = 0

    def _near(self, lo: int, hi: int) -> range:
        """Indices of records that may overlap [lo, hi): those starting in (lo - longest, hi)."""
        return range(bisect.bisect_right(self.starts, lo - self.longest), bisect.bisect_left(self.starts, hi))

    def add(self, node_id: int, lane: Any, reads: list[tuple[int, int]], writes: list[tuple[int, int]]) -> set[int]:
        preds: set[int] = set()
        for (lo, hi), writes_only in [(r, True) for r in reads] + [(w, False) for w in writes]:
            for i in self._near(lo, hi):
                rlo, rhi, other, is_write, _ = self.records[i]
                if rlo < hi and lo < rhi and (is_write or not writes_only):
                    preds.add(other)  # RAW for reads; WAW and WAR for writes
        self._drop_superseded(lane, reads, writes)
        for (lo, hi), is_write in [(r, False) for r in reads] + [(w, True) for w in writes]:
            if hi > lo:
                i = bisect.bisect_right(self.starts, lo)
                self.starts.insert(i, lo)
                self.records.insert(i, (lo, hi, node_id, is_write, lane))
                self.longest = max(self.longest, hi - lo)
        preds.discard(node_id)
        return preds

    def _drop_superseded(self, lane: Any, reads: list[tuple[int, int]], writes: list[tuple[int, int]]) -> None:
        doomed: set[int] = set()
        for (lo, hi), by_write in [(w, True) for w in writes] + [(r, False) for r in reads if lane is not None]:
            start = bisect.bisect_left(self.starts, lo)
            for i in range(start, bisect.bisect_left(self.starts, hi)):
                rlo, rhi, _, is_write, rec_lane = self.records[i]
                if rhi <= hi and (by_write or (not is_write and rec_lane == lane)):
                    doomed.add(i)
        for i in sorted(doomed, reverse=True):
            del self.starts[i]
            del self.records[i]


def _lane_of(ins: Instruction) -> Any:
    """The in-order queue an instruction waits in. The DMA engine has a read channel and a write channel
    (reads enter the core's ring stop, writes leave it: opposite directions of the ring)."""
    if isinstance(ins, (DmaLoad, DmaGather)):
        return "dma_read"
    if isinstance(ins, DmaStore):
        return "dma_write"
    return {"pe": "pe", "vector": "vector"}.get(ins.ENGINE)


def _dram_hazards(tables: dict[str, "_Hazards"], nid: int, lane: Any, accesses: list[tuple[str, int, int, bool]]) -> set[int]:
    """Same-core ordering of DMA on overlapping bytes of one operand (symbolic: operand and offset only)."""
    preds: set[int] = set()
    for operand, lo, hi, is_write in accesses:
        table = tables.setdefault(operand, _Hazards())
        rng = [(lo, hi)]
        preds |= table.add(nid, lane, [] if is_write else rng, rng if is_write else [])
    return preds


class _Graph:
    """Every instruction as a node with the set of nodes that must finish before it starts."""

    def __init__(self, program: Program, coster: _Coster):
        self.program = program
        self.nodes: list[_Node] = []
        self.cores = sorted(c for c, ins in program.cores.items() if ins)
        for core in self.cores:
            self._add_core(core, program.cores[core], coster)
        self._link_cross_core()

    def _add_core(self, core: int, instrs: list[Instruction], coster: _Coster) -> None:
        hazards = _Hazards()
        dram_hazards: dict[str, _Hazards] = {}
        last_in_lane: dict[Any, int] = {}
        holding: int | None = None  # the latest Wait/Barrier: later instructions start after it
        for index, ins in enumerate(instrs):
            nid = len(self.nodes)
            node = _Node(core, index, ins, ins.ENGINE, _lane_of(ins))
            coster.cost(node)
            self.nodes.append(node)
            node.preds |= hazards.add(nid, node.lane, node.reads, node.writes)
            node.preds |= _dram_hazards(dram_hazards, nid, node.lane, node.dram)
            if node.lane is not None and node.lane in last_in_lane:
                node.preds.add(last_in_lane[node.lane])
            if holding is not None:
                node.preds.add(holding)
            if isinstance(ins, (Signal, Barrier)):
                node.preds |= set(last_in_lane.values())  # fence: earlier work is done and visible
            if node.lane is not None:
                last_in_lane[node.lane] = nid
            if isinstance(ins, RingRecv):
                last_in_lane[("recv", ins.src_core, ins.tag, nid)] = nid  # fences also wait for receives
            if isinstance(ins, (Wait, Barrier)):
                holding = nid

    def _link_cross_core(self) -> None:
        """Match Signal/Wait, RingSend/RingRecv (in order per sender, receiver and tag) and Barriers."""
        signals, sends, barriers = defaultdict(list), defaultdict(list), defaultdict(list)
        for nid, node in enumerate(self.nodes):
            ins = node.instr
            if isinstance(ins, Signal):
                signals[(node.core, ins.dst_core, ins.tag)].append(nid)
            elif isinstance(ins, RingSend):
                sends[(node.core, ins.dst_core, ins.tag)].append(nid)
            elif isinstance(ins, Barrier):
                group = ins.cores if ins.cores is not None else tuple(self.cores)
                barriers[(ins.tag, group, node.core)].append(nid)
        for nid, node in enumerate(self.nodes):
            ins = node.instr
            if isinstance(ins, Wait):
                node.preds.add(self._take(signals, (ins.src_core, node.core, ins.tag), node, "Signal"))
            elif isinstance(ins, RingRecv):
                send = self._take(sends, (ins.src_core, node.core, ins.tag), node, "RingSend")
                node.preds.add(send)
                sent: RingSend = self.nodes[send].instr  # type: ignore[assignment]
                self._retarget_receive(nid, sent)
        self._check_unmatched(signals, "Signal", "Wait")
        self._check_unmatched(sends, "RingSend", "RingRecv")
        self._join_barriers(barriers)

    def _take(self, table: dict, key: tuple, node: _Node, what: str) -> int:
        if not table.get(key):
            raise ProgramError(f"no matching {what} from core {key[0]} with tag {key[2]}: the core would wait forever",
                               node.core, node.index, node.instr)
        return table[key].pop(0)

    def _check_unmatched(self, table: dict, what: str, partner: str) -> None:
        for nids in table.values():
            if nids:
                n = self.nodes[nids[0]]
                raise ProgramError(f"{what} has no matching {partner} on the destination core", n.core, n.index, n.instr)

    def _retarget_receive(self, recv_id: int, sent: RingSend) -> None:
        """Make the RingRecv the writer of the bytes it delivers, so that the receiver's readers of them
        depend on it (applied by :func:`_rescan_received_bytes`, once every send is matched)."""
        self.nodes[recv_id].writes.append((sent.dst_offset, sent.dst_offset + sent.nbytes))

    def _join_barriers(self, barriers: dict) -> None:
        occurrences: dict[tuple, list[list[int]]] = defaultdict(list)
        for (tag, group, core), nids in barriers.items():
            if core not in group:
                n = self.nodes[nids[0]]
                raise ProgramError(f"barrier group {list(group)} does not include this core", n.core, n.index, n.instr)
            for k, nid in enumerate(nids):
                while len(occurrences[(tag, group)]) <= k:
                    occurrences[(tag, group)].append([])
                occurrences[(tag, group)][k].append(nid)
        for (tag, group), rounds in occurrences.items():
            for members in rounds:
                if len(members) != len(group):
                    n = self.nodes[members[0]]
                    raise ProgramError(f"barrier tag {tag}: only {len(members)} of the {len(group)} cores reach it",
                                       n.core, n.index, n.instr)
                arrival: set[int] = set()
                for nid in members:
                    arrival |= self.nodes[nid].preds
                for nid in members:
                    self.nodes[nid].preds = set(arrival)


def _rescan_received_bytes(graph: _Graph) -> None:
    """Second hazard pass, now that RingRecvs write the bytes they deliver (known only after matching)."""
    by_core: dict[int, list[int]] = defaultdict(list)
    for nid, node in enumerate(graph.nodes):
        by_core[node.core].append(nid)
    for nids in by_core.values():
        if not any(isinstance(graph.nodes[n].instr, RingRecv) for n in nids):
            continue
        hazards = _Hazards()
        for nid in nids:
            node = graph.nodes[nid]
            node.preds |= hazards.add(nid, node.lane, node.reads, node.writes)


# ---------------------------------------------------------------------------------------------
# Fluid sharing of DRAM and ring links
# ---------------------------------------------------------------------------------------------
class _Sharing:
    """Max-min fair rates for the active flows, by progressive filling. Flows with the same signature get
    the same rate, so the solver works on signature classes and caches each distinct mix."""

    def __init__(self, config: CardConfig):
        self.link_bw = config.ring_link_bandwidth
        self.reduce_link_bw = config.reduction_ring_bytes_per_cycle * config.clock_hz * config.ring_efficiency
        self.t_read = 1.0 / config.dram_read_bandwidth
        self.t_write = 1.0 / config.dram_write_bandwidth
        mixed = config.dram_peak_bandwidth * config.dram_mixed_efficiency
        # Turnaround seconds per byte for a fully interleaved stream; an even mix then costs 1/mixed.
        self.t_turn = max(0.0, 2.0 / mixed - self.t_read - self.t_write)
        self.cache: dict[tuple, dict[tuple, float]] = {}

    def rates(self, classes: dict[tuple, int]) -> tuple[dict[tuple, float], dict[Any, float]]:
        """Rate per flow class, and the fraction of each resource's capacity those rates use."""
        key = tuple(sorted(classes.items()))
        if key not in self.cache:
            uses = self._uses(classes)
            rate = self._fill(classes, uses)
            self.cache[key] = (rate, self._occupancy(classes, uses, rate))
        return self.cache[key]

    def _occupancy(self, classes: dict[tuple, int], uses: dict, rate: dict[tuple, float]) -> dict[Any, float]:
        busy: dict[Any, float] = defaultdict(float)
        for sig, count in classes.items():
            for r, w in uses[sig]:
                busy[r] += count * rate[sig] * w / self._capacity(r)
        return dict(busy)

    def _dram_weights(self, classes: dict[tuple, int]) -> dict[str, float]:
        """DRAM seconds per byte for a read and a write, given the mix of active DRAM flows."""
        reads = sum(n for sig, n in classes.items() if sig[1] == "r")
        writes = sum(n for sig, n in classes.items() if sig[1] == "w")
        total = reads + writes
        if not total:
            return {}
        return {"r": self.t_read + self.t_turn * writes / total, "w": self.t_write + self.t_turn * reads / total}

    def _uses(self, classes: dict[tuple, int]) -> dict[tuple, list[tuple[Any, float]]]:
        dram = self._dram_weights(classes)
        uses = {}
        for sig in classes:
            links, direction, factor, _cap = sig
            use = [(link, 1.0) for link in links]
            if direction:
                use.append(("dram", dram[direction] * factor))
            uses[sig] = use
        return uses

    def _capacity(self, resource: Any) -> float:
        if resource == "dram":
            return 1.0  # DRAM time: one second per second
        return self.reduce_link_bw if resource[0] == "reduce" else self.link_bw

    def _fill(self, classes: dict[tuple, int], uses: dict[tuple, list[tuple[Any, float]]]) -> dict[tuple, float]:
        left = {r: self._capacity(r) for use in uses.values() for r, _ in use}
        rate = {sig: 0.0 for sig in classes}
        active = dict(classes)
        while active:
            load: dict[Any, float] = defaultdict(float)
            for sig, count in active.items():
                for r, w in uses[sig]:
                    load[r] += w * count
            step = min([left[r] / load[r] for r in load if load[r] > 0] + [sig[3] - rate[sig] for sig in active])
            for sig in active:
                rate[sig] += step
            for r, l in load.items():
                left[r] -= step * l
            full = {r for r in load if left[r] <= 1e-9 * self._capacity(r)}
            for sig in list(active):
                if rate[sig] >= sig[3] * (1 - 1e-12) or any(r in full for r, _ in uses[sig]):
                    del active[sig]
        return rate


# ---------------------------------------------------------------------------------------------
# The event loop
# ---------------------------------------------------------------------------------------------
class _Simulation:
    def __init__(self, graph: _Graph, config: CardConfig):
        self.g = graph
        self.sharing = _Sharing(config)
        n = len(graph.nodes)
        self.start = [math.nan] * n
        self.end = [math.nan] * n
        self.pending = [len(node.preds) for node in graph.nodes]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for nid, node in enumerate(graph.nodes):
            for p in node.preds:
                self.succs[p].append(nid)
        self.timers: list[tuple[float, int, str, int]] = []  # time, seq, kind, node
        self.seq = 0
        self.flows: dict[int, list[float]] = {}  # node -> [bytes left, rate]
        self.flows_changed = False
        self.occupancy: dict[Any, float] = {}  # resource -> fraction of its capacity in use now
        self.busy: dict[Any, float] = defaultdict(float)  # resource -> seconds of full use so far
        self.now = 0.0

    def run(self) -> None:
        ready = [nid for nid, p in enumerate(self.pending) if p == 0]
        self._start_all(ready)
        while self.timers or self.flows:
            if self.flows_changed:
                self._share()
            t_next = self._next_event()
            self._advance(t_next)
            self._fire_timers()
            self._finish_flows()
        self._check_all_ran()

    # --- events -------------------------------------------------------------------------------
    def _push(self, t: float, kind: str, nid: int) -> None:
        heapq.heappush(self.timers, (t, self.seq, kind, nid))
        self.seq += 1

    def _start_all(self, nids: list[int]) -> None:
        for nid in nids:
            node = self.g.nodes[nid]
            self.start[nid] = self.now
            self._push(self.now + node.duration, "flow" if node.flow is not None else "end", nid)

    def _next_event(self) -> float:
        t = self.timers[0][0] if self.timers else math.inf
        for left, rate in self.flows.values():
            if rate > 0:
                t = min(t, self.now + left / rate)
        if math.isinf(t):
            raise ProgramError("timing model stalled: flows with no bandwidth")  # a bug, not a program error
        return t

    def _advance(self, t: float) -> None:
        dt = t - self.now
        for f in self.flows.values():
            f[0] -= f[1] * dt
        for r, fraction in self.occupancy.items():
            self.busy[r] += fraction * dt
        self.now = t

    def _fire_timers(self) -> None:
        tol = self.now * 1e-12 + 1e-18
        while self.timers and self.timers[0][0] <= self.now + tol:
            _t, _s, kind, nid = heapq.heappop(self.timers)
            flow = self.g.nodes[nid].flow
            if kind == "flow" and flow is not None and flow.nbytes > 0:
                self.flows[nid] = [flow.nbytes, 0.0]
                self.flows_changed = True
            else:
                self._finish(nid)

    def _finish_flows(self) -> None:
        done = [nid for nid, (left, rate) in self.flows.items() if left <= _EPS_BYTES + rate * self.now * 1e-12]
        for nid in done:
            del self.flows[nid]
            self.flows_changed = True
            self._finish(nid)

    def _finish(self, nid: int) -> None:
        self.end[nid] = self.now
        ready = []
        for s in self.succs[nid]:
            self.pending[s] -= 1
            if self.pending[s] == 0:
                ready.append(s)
        self._start_all(ready)

    def _share(self) -> None:
        classes: dict[tuple, int] = defaultdict(int)
        for nid in self.flows:
            classes[self.g.nodes[nid].flow.signature()] += 1  # type: ignore[union-attr]
        rates, self.occupancy = self.sharing.rates(classes)
        for nid, f in self.flows.items():
            f[1] = rates[self.g.nodes[nid].flow.signature()]  # type: ignore[union-attr]
        self.flows_changed = False

    def _check_all_ran(self) -> None:
        for nid, node in enumerate(self.g.nodes):
            if math.isnan(self.end[nid]):
                raise ProgramError("deadlock: this instruction never becomes ready (circular waits across cores)",
                                   node.core, node.index, node.instr)


# ---------------------------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------------------------
def _union_length(spans: list[tuple[float, float]]) -> float:
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(spans):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def _bytes_moved(graph: _Graph) -> dict[str, int]:
    out = dict.fromkeys(("dram_read", "dram_write", "ring", "reduce_ring", "sp_read", "sp_write"), 0)
    for node in graph.nodes:
        ins = node.instr
        if isinstance(ins, (DmaLoad, DmaGather)):
            out["dram_read"] += int(node.flow.nbytes)  # type: ignore[union-attr]
            out["sp_write"] += int(node.flow.nbytes)  # type: ignore[union-attr]
        elif isinstance(ins, DmaStore):
            out["dram_write"] += ins.pattern.nbytes
            out["sp_read"] += ins.pattern.nbytes
        elif isinstance(ins, RingSend):
            out["reduce_ring" if ins.network == "reduce" else "ring"] += ins.nbytes
            out["sp_read"] += ins.nbytes
            out["sp_write"] += ins.nbytes
        elif isinstance(ins, MatMul):
            out["sp_read"] += ins.a.numel * ins.a.itemsize + ins.b.numel * ins.b.itemsize
            out["sp_read"] += ins.out.numel * ins.out.itemsize if ins.accumulate else 0
            out["sp_write"] += ins.out.numel * ins.out.itemsize
        elif isinstance(ins, Elementwise):
            out["sp_read"] += sum(t.numel * t.itemsize for t in ins.inputs if isinstance(t, SpTensor))
            out["sp_write"] += ins.out.numel * ins.out.itemsize
        elif isinstance(ins, Reduce):
            out["sp_read"] += ins.inp.numel * ins.inp.itemsize
            out["sp_write"] += ins.out.numel * ins.out.itemsize
    return out


def _flops(graph: _Graph) -> tuple[int, int]:
    pe = vec = 0
    for node in graph.nodes:
        ins = node.instr
        if isinstance(ins, MatMul):
            pe += 2 * ins.out.numel * ins.a.shape[-1]
        elif isinstance(ins, Elementwise):
            vec += ins.out.numel
        elif isinstance(ins, Reduce):
            vec += ins.inp.numel
    return pe + vec, pe


def _compute_bound(graph: _Graph, config: CardConfig, pe_flops: int) -> float:
    """Compute at peak on the cores the program uses: PE flops at the PE peak, vector work at one stick
    per cycle per corelet (the vector unit has no faster mode), whichever is longer."""
    cores = max(1, len(graph.cores))
    pe_peak = 2.0 * config.fp16_macs_per_cycle_per_core * config.clock_hz * cores
    vector_s = sum(n.duration for n in graph.nodes if n.engine == "vector") / cores
    return max(pe_flops / pe_peak, vector_s)


def _dram_bound(moved: dict[str, int], config: CardConfig) -> float:
    return moved["dram_read"] / config.dram_read_bandwidth + moved["dram_write"] / config.dram_write_bandwidth


def _busiest_dma_channel_s(graph: _Graph, config: CardConfig) -> float:
    """Bytes of the busiest DMA channel (one core's reads or writes) at the DMA engine's rate."""
    per_channel: dict[tuple[int, Any], float] = defaultdict(float)
    for node in graph.nodes:
        if node.flow is not None and node.flow.dram:
            per_channel[(node.core, node.flow.dram)] += node.flow.nbytes
    return max(per_channel.values(), default=0.0) / (config.dma_bytes_per_cycle * config.clock_hz)


def _verdict(total: float, fixed: float, bounds: dict[str, float]) -> str:
    """Name what limits the kernel: of the busiest engine, the DRAM and the busiest ring link (seconds of
    full use each), the one that fills most of the execution time, if it fills at least half of it."""
    if total <= 0 or fixed >= 0.5 * total:
        return "fixed-cost-bound"
    execution = total - fixed
    name, bound = max(bounds.items(), key=lambda kv: kv[1])
    return name if bound >= 0.5 * execution else "latency/dependency-bound"


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def time_program(program: Program, config: CardConfig) -> ProgramTiming:
    """Time ``program`` on a card with ``config``. Raises ProgramError for programs that cannot finish."""
    for core in program.cores:
        if not 0 <= core < config.num_cores:
            raise ProgramError(f"core {core} does not exist (the card has {config.num_cores})", core)
    graph = _Graph(program, _Coster(config))
    _rescan_received_bytes(graph)
    sim = _Simulation(graph, config)
    sim.run()
    fixed = config.kernel_fixed_cost_s
    makespan = max(sim.end, default=0.0)
    intervals = [
        Interval(n.core, n.index, n.engine, n.instr.OP, fixed + sim.start[i], fixed + sim.end[i])
        for i, n in enumerate(graph.nodes)
    ]
    busy = _busy(graph, intervals)
    moved = _bytes_moved(graph)
    flops, pe_flops = _flops(graph)
    compute_s = _compute_bound(graph, config, pe_flops)
    dram_s = _dram_bound(moved, config)
    dram_busy = sim.busy.get("dram", 0.0)
    ring_s = max((b for r, b in sim.busy.items() if r != "dram"), default=0.0)
    total = fixed + makespan
    bounds = {
        "dram-bound": dram_busy,
        "dma-engine-bound": _busiest_dma_channel_s(graph, config),
        "compute-bound": max((b["pe"] for b in busy.values()), default=0.0),
        "vector-bound": max((b["vector"] for b in busy.values()), default=0.0),
        "ring-bound": ring_s,
    }
    return ProgramTiming(
        program_name=program.name,
        total_s=total,
        fixed_cost_s=fixed,
        intervals=intervals,
        busy_s=busy,
        bytes=moved,
        flops=flops,
        pe_flops=pe_flops,
        compute_bound_s=compute_s,
        dram_bound_s=dram_s,
        dram_busy_s=dram_busy,
        ring_link_busiest_s=ring_s,
        bottleneck=_verdict(total, fixed, bounds),
        config=config,
    )


def _busy(graph: _Graph, intervals: list[Interval]) -> dict[int, dict[str, float]]:
    spans: dict[int, dict[str, list[tuple[float, float]]]] = {c: {e: [] for e in ENGINES} for c in graph.cores}
    for iv in intervals:
        if iv.engine in ENGINES and not (iv.engine == "ring" and iv.op == "ring_recv"):
            spans[iv.core][iv.engine].append((iv.start, iv.end))
    return {c: {e: _union_length(s) for e, s in eng.items()} for c, eng in spans.items()}

"""The static cost of one instruction: engine time, the transfer (flow) it starts, and the scratchpad and
device bytes it touches. No simulation here; the formulas are card/costs.py's."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from ...program import (
    STICK_BYTES,
    TRANSCENDENTAL_OPS,
    Addr,
    Barrier,
    DmaGather,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Reduce,
    RingSend,
    Signal,
    SpTensor,
)
from .. import costs
from ..config import CardConfig


@dataclass
class Flow:
    """A transfer's bytes and the path they take (the part the fluid model shares)."""

    nbytes: float
    links: tuple[Any, ...]  # ring link ids crossed, each at weight 1 byte per byte
    dram: str  # "r", "w" or "" (no DRAM)
    dram_factor: float  # DRAM byte-equivalents per byte (strided patterns > 1)
    cap: float  # bytes/s limit of the issuing engine

    def signature(self) -> tuple:
        return (self.links, self.dram, self.dram_factor, self.cap)


@dataclass
class Node:
    core: int
    index: int
    instr: Instruction
    engine: str  # reporting engine
    lane: Any  # in-order queue the instruction waits for; None = no engine (sync, ring receive)
    duration: float = 0.0  # seconds of engine time (compute, sync latency) or the latency of a transfer
    flow: Flow | None = None
    reads: list[tuple[int, int]] = field(default_factory=list)  # scratchpad byte ranges
    writes: list[tuple[int, int]] = field(default_factory=list)
    dram: list[tuple[str, int, int, bool]] = field(default_factory=list)  # operand, lo, hi, is_write
    preds: set[int] = field(default_factory=set)


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


@functools.lru_cache(maxsize=8192)  # pure, and asked for once per DMA and ring send
def network_path(src: int, dst: int, n: int, net: str) -> tuple[Any, ...]:
    """Links of network ``net`` crossed from stop ``src`` to ``dst`` (``costs.ring_path``)."""
    return tuple((net, *link) for link in costs.ring_path(src, dst, n))


def _direction(path: tuple[Any, ...]) -> str:
    return path[0][1] if path else "cw"


class Coster:
    """Turns one instruction into engine time, a flow and scratchpad accesses (no simulation here)."""

    def __init__(self, config: CardConfig):
        self.cfg = config
        self.clock = config.clock_hz
        self.dma_cap = config.dma_engine_bandwidth
        self.link_bw = config.ring_link_bandwidth
        self.reduce_link_bw = config.reduction_ring_link_bandwidth
        self.handlers = {
            DmaLoad: self.dma_load, DmaStore: self.dma_store, DmaGather: self.dma_gather, MatMul: self.matmul,
            Elementwise: self.elementwise, Reduce: self.reduce, RingSend: self.ring_send, Signal: self.signal,
            Barrier: self.barrier,
        }
        # Compute instructions cost the same on every core; loops repeat them (same buffers, next tile).
        self._compute: dict[Instruction, tuple[float, tuple, tuple]] = {}

    # --- DMA ----------------------------------------------------------------------------------
    def dram_flow(self, core: int, nbytes: int, runs: int, direction: str) -> Flow:
        n, mem = self.cfg.num_cores, self.cfg.memory_ring_stop
        path = network_path(mem, core, n, "data") if direction == "r" else network_path(core, mem, n, "data")
        factor = 1.0 + (runs * self.cfg.dram_run_overhead_bytes / nbytes if nbytes else 0.0)
        return Flow(float(nbytes), path, direction, factor, self.dma_cap)

    def dma_load(self, node: Node, ins: DmaLoad) -> None:
        self.strided_dma(node, ins.src, ins.sp_offset, ins.pattern, "r")

    def dma_store(self, node: Node, ins: DmaStore) -> None:
        self.strided_dma(node, ins.dst, ins.sp_offset, ins.pattern, "w")

    def strided_dma(self, node: Node, addr: Addr, sp_offset: int, pattern: DmaPattern, direction: str) -> None:
        """A load ("r": device -> scratchpad) or a store ("w"): the same costs, the sides swapped."""
        (node.writes if direction == "r" else node.reads).append(pattern.sp_range(sp_offset))
        node.dram.append((addr.operand, *pattern.dram_range(addr.offset), direction == "w"))
        node.flow = self.dram_flow(node.core, pattern.nbytes, _contiguous_runs(pattern), direction)
        node.duration = self.cfg.dram_latency_s

    def dma_gather(self, node: Node, ins: DmaGather) -> None:
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
        batch = math.prod(ins.b.shape[:-2]) if len(ins.b.shape) > 2 else 1
        k, n = ins.a.shape[-1], ins.out.shape[-1]
        m = max(1, math.prod(ins.out.shape[:-1]) // batch)
        return costs.pe_matmul_cycles(self.cfg, m, k, n, ins.a.dtype, batch)

    def matmul(self, node: Node, ins: MatMul) -> None:
        node.reads += [ins.a.byte_span(), ins.b.byte_span()]
        if ins.accumulate:
            node.reads.append(ins.out.byte_span())
        node.writes.append(ins.out.byte_span())
        node.duration = self.matmul_cycles(ins) / self.clock

    def vector_cycles(self, elements: int, itemsize: int, op: str) -> int:
        return costs.vector_cycles(self.cfg, elements, itemsize, op in TRANSCENDENTAL_OPS)

    def elementwise(self, node: Node, ins: Elementwise) -> None:
        tensors = [t for t in ins.inputs if isinstance(t, SpTensor)]
        node.reads += [t.byte_span() for t in tensors]
        node.writes.append(ins.out.byte_span())
        # Broadcast operands (a stride of 0) are read once per stick, so they do not set the width.
        width = max([ins.out.itemsize] + [t.itemsize for t in tensors if 0 not in t.strides])
        node.duration = self.vector_cycles(ins.out.numel, width, ins.op) / self.clock

    def reduce(self, node: Node, ins: Reduce) -> None:
        node.reads.append(ins.inp.byte_span())
        if ins.accumulate:
            node.reads.append(ins.out.byte_span())
        node.writes.append(ins.out.byte_span())
        node.duration = self.vector_cycles(ins.inp.numel, ins.inp.itemsize, ins.op) / self.clock

    # --- ring and sync ------------------------------------------------------------------------
    def ring_send(self, node: Node, ins: RingSend) -> None:
        net = "reduce" if ins.network == "reduce" else "data"
        path = network_path(node.core, ins.dst_core, self.cfg.num_cores, net)
        cap = self.reduce_link_bw if net == "reduce" else self.link_bw
        node.reads.append((ins.src_offset, ins.src_offset + ins.nbytes))
        node.flow = Flow(float(ins.nbytes), path, "", 1.0, cap)
        node.duration = costs.ring_hop_seconds(self.cfg, len(path))
        node.lane = ("ring", net, _direction(path))

    def signal(self, node: Node, ins: Signal) -> None:
        node.duration = costs.ring_hop_seconds(self.cfg, len(network_path(node.core, ins.dst_core, self.cfg.num_cores, "data")))

    def barrier(self, node: Node, ins: Barrier) -> None:
        # Releasing a group takes a token round trip across the ring's diameter.
        node.duration = costs.ring_hop_seconds(self.cfg, self.cfg.num_cores // 2)

    def cost(self, node: Node) -> None:
        ins = node.instr
        cls = type(ins)
        if cls in _CORE_INDEPENDENT:
            known = self._compute.get(ins)
            if known is not None:
                node.duration, reads, writes = known
                node.reads, node.writes = list(reads), list(writes)
                return
            self.handlers[cls](node, ins)
            self._compute[ins] = (node.duration, tuple(node.reads), tuple(node.writes))
            return
        handler = self.handlers.get(cls)
        if handler is not None:
            handler(node, ins)


_CORE_INDEPENDENT = (MatMul, Elementwise, Reduce)  # no flow, no device memory: only durations and spans


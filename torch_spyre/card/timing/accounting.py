"""The kernel's figures from a finished simulation: bytes moved, flops, the roofline bounds, engine busy
time, and the verdict on what limits it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ...program import DmaGather, DmaLoad, DmaStore, Elementwise, MatMul, Reduce, RingSend, SpTensor
from ..config import CardConfig
from .graph import Graph
from .report import ENGINES, Interval


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


def bytes_moved(graph: Graph) -> dict[str, int]:
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


def count_flops(graph: Graph) -> tuple[int, int]:
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


def compute_bound(graph: Graph, config: CardConfig, pe_flops: int) -> float:
    """Compute at peak on the cores the program uses: PE flops at the PE peak, vector work at one stick
    per cycle per corelet (the vector unit has no faster mode), whichever is longer."""
    cores = max(1, len(graph.cores))
    pe_peak = 2.0 * config.fp16_macs_per_cycle_per_core * config.clock_hz * cores
    vector_s = sum(n.duration for n in graph.nodes if n.engine == "vector") / cores
    return max(pe_flops / pe_peak, vector_s)


def dram_bound(moved: dict[str, int], config: CardConfig) -> float:
    return moved["dram_read"] / config.dram_read_bandwidth + moved["dram_write"] / config.dram_write_bandwidth


def busiest_dma_channel_s(graph: Graph, config: CardConfig) -> float:
    """Bytes of the busiest DMA channel (one core's reads or writes) at the DMA engine's rate."""
    per_channel: dict[tuple[int, Any], float] = defaultdict(float)
    for node in graph.nodes:
        if node.flow is not None and node.flow.dram:
            per_channel[(node.core, node.flow.dram)] += node.flow.nbytes
    return max(per_channel.values(), default=0.0) / config.dma_engine_bandwidth


def verdict(total: float, fixed: float, bounds: dict[str, float]) -> str:
    """Name what limits the kernel: of the busiest engine, the DRAM and the busiest ring link (seconds of
    full use each), the one that fills most of the execution time, if it fills at least half of it."""
    if total <= 0 or fixed >= 0.5 * total:
        return "fixed-cost-bound"
    execution = total - fixed
    name, bound = max(bounds.items(), key=lambda kv: kv[1])
    return name if bound >= 0.5 * execution else "latency/dependency-bound"



def busy_seconds(graph: Graph, intervals: list[Interval]) -> dict[int, dict[str, float]]:
    spans: dict[int, dict[str, list[tuple[float, float]]]] = {c: {e: [] for e in ENGINES} for c in graph.cores}
    for iv in intervals:
        if iv.engine in ENGINES and not (iv.engine == "ring" and iv.op == "ring_recv"):
            spans[iv.core][iv.engine].append((iv.start, iv.end))
    return {c: {e: _union_length(s) for e, s in eng.items()} for c, eng in spans.items()}

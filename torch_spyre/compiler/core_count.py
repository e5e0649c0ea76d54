"""How many cores a kernel's work should use: one rule for every generator (which cores: ``placement.py``).

In the timing model a kernel's time on ``c`` cores is about

    fixed cost + the DRAM latencies each core pays in turn + max(a core's share, what the shared DRAM
    and ring links need for all the traffic)

Every transfer a core issues waits one DRAM access latency (``config.dram_latency_s``) before its first
stick arrives, and a core's DMA channel is in order; those latencies are paid whatever the split. What
a split shortens is the share, and only the share: going from ``c`` to more cores saves at most the
share of one core. So the rule stops splitting once each core's share is down to one DRAM latency of
work:

    min work per core  m = dram_latency_s x clock_hz = 150 ns x 1.1 GHz = 165 cycles
    cores              = ceil(W / m), at least 1, at most the card's (or the work items there are)

where ``W`` is the kernel's work in cycles of a core's engines: DMA (``dma_bytes_per_cycle``, one
128-byte stick per cycle), vector and PE cycles (``card/costs.py``). A 64x64 fp32 add (384 sticks of
DMA, 128 vector cycles: W = 512) takes 4 cores; a kernel of more than 31 x 165 = 5,115 cycles takes all
32. Past that point a finer split could save less than one latency (150 ns, under 1 % of the 20 us
kernel fixed cost), and for DMA-bound kernels nothing at all: the shared DRAM (about 1.25 sticks per
cycle for the whole card) and the two ring links out of the memory stop set their pace, while each
extra core adds ring hops and competition for those links.

The timing model confirms it: ``benchmarks/small_kernels.py`` times kernels of every generator on the
rule's core count and on 1 to 32 cores, and ``tests/compiler/test_core_count.py`` checks the rule's
program against the 32-core one. Each generator measures its own work (it knows its DMA, vector and PE
cycles) and records the :class:`CoreCount` in its :class:`~torch_spyre.compiler.decisions.KernelDecisions`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from ..card.config import CardConfig


# Set only by :func:`forcing` (benchmarks and tests timing a kernel on other core counts).
_forced: ContextVar[int | None] = ContextVar("forced_cores", default=None)


def min_cycles_per_core(config: CardConfig) -> int:
    """Cycles of work (a core's engines) per core: one DRAM access latency."""
    return max(1, math.ceil(config.dram_latency_s * config.clock_hz))


def dma_cycles(config: CardConfig, nbytes: float) -> float:
    """Cycles one DMA channel takes to move ``nbytes`` (at ``dma_bytes_per_cycle``)."""
    return nbytes / config.dma_bytes_per_cycle


@dataclass(frozen=True)
class CoreCount:
    """The number of cores a kernel uses and why (recorded in its decisions)."""

    cores: int
    work_cycles: int  # the kernel's work, summed over its engines' cycles (DMA, vector, PE)
    min_cycles_per_core: int
    available: int  # the most cores the kernel could use (the card's, or fewer work items)
    forced: bool = False

    def why(self) -> str:
        if self.forced:
            return f"forced to {self.cores} of {self.available} cores (core_count.forcing)"
        rule = f"a core per {self.min_cycles_per_core} cycles (one DRAM latency) of work"
        if self.cores == self.available:
            return f"{self.work_cycles} cycles of work: {rule}, so all {self.available} cores"
        return f"{self.work_cycles} cycles of work: {rule}, so {self.cores} of {self.available} cores"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "why": self.why()}


def cores_for(work_cycles: float, config: CardConfig, parts: int | None = None) -> CoreCount:
    """Cores for ``work_cycles`` of work: the fewest that leave each at most ``min_cycles_per_core``
    cycles, at least one, at most the card's cores and ``parts`` (the work items there are, if fewer)."""
    available = config.num_cores if parts is None else max(1, min(config.num_cores, parts))
    floor = min_cycles_per_core(config)
    work = max(0, math.ceil(work_cycles))
    forced = _forced.get()
    if forced is not None:
        return CoreCount(min(forced, available), work, floor, available, forced=True)
    return CoreCount(max(1, min(available, -(-work // floor))), work, floor, available)


def forced_cores() -> int | None:
    """The count :func:`forcing` imposes here, or None (program caches key on it)."""
    return _forced.get()


@contextmanager
def forcing(cores: int) -> Iterator[None]:
    """Within the block, every kernel generated takes ``cores`` cores (fewer if it has fewer work items;
    a matmul takes the cheapest plan on at most that many) instead of the rule's count: for timing the
    same kernel on other core counts."""
    if cores < 1:
        raise ValueError(f"forcing({cores}): a kernel needs at least one core")
    token = _forced.set(cores)
    try:
        yield
    finally:
        _forced.reset(token)

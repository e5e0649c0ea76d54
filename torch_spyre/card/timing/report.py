"""What timing a program reports: when each instruction ran, and the figures of the whole kernel."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import CardConfig
from .roofline import OpWork, op_compute_s, op_memory_s, op_roofline_s

ENGINES = ("dma", "pe", "vector", "ring")


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
    compute_bound_s: float  # the program's work at peak rate on the cores (and corelets) the program uses
    dram_bound_s: float  # the program's DRAM bytes at the read/write bandwidths
    dram_busy_s: float  # seconds of fully used DRAM time, turnaround and strided-burst penalties included
    ring_link_busiest_s: float  # seconds of fully used time of the busiest ring link
    bottleneck: str
    config: CardConfig = field(repr=False)
    # The op the program implements (roofline.op_work); set by time_program for each program, since two
    # programs with the same instructions may implement ops of other sizes (a view of a larger buffer).
    op: OpWork | None = None
    vector_corelet_cycles: float = 0.0  # the program's vector work in cycles of one corelet

    @property
    def execution_s(self) -> float:
        """Time from the first instruction to the last (the kernel time without the fixed cost)."""
        return self.total_s - self.fixed_cost_s

    @property
    def op_compute_s(self) -> float:
        """The op's flops at the whole chip's peak (every core, every corelet)."""
        return op_compute_s(self._op, self.config)

    @property
    def op_memory_s(self) -> float:
        """The op's compulsory bytes (inputs read once, outputs written once) at the DRAM bandwidths."""
        return op_memory_s(self._op, self.config)

    @property
    def roofline_s(self) -> float:
        """The op roofline (card/timing/roofline.py): the least time the chip could take for this op,
        max(op flops at the chip's peak, compulsory bytes at DRAM bandwidth) plus the fixed cost."""
        return op_roofline_s(self._op, self.config)

    @property
    def roofline_fraction(self) -> float:
        """Fraction of the op roofline achieved (1.0 = as fast as the chip allows for this op)."""
        return self.roofline_s / self.total_s if self.total_s > 0 else 1.0

    @property
    def program_bound_s(self) -> float:
        """The program's own bound: its work at peak on the cores it uses, or the DRAM bytes it moved,
        whichever is larger, plus the fixed cost. Not the yardstick: a program moving too many bytes on
        too few cores looks efficient against it."""
        return max(self.compute_bound_s, self.dram_bound_s) + self.fixed_cost_s

    @property
    def program_bound_fraction(self) -> float:
        return self.program_bound_s / self.total_s if self.total_s > 0 else 1.0

    @property
    def _op(self) -> OpWork:
        if self.op is not None:
            return self.op
        # A timing built by hand without its program: the program's own flops stand for the op's.
        return OpWork(float(self.pe_flops), self.vector_corelet_cycles, self.bytes["dram_read"],
                      self.bytes["dram_write"], "the program's own bytes (no program given)")

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
            f"  op roofline {self.roofline_s * us:.2f} us (flops at the chip's peak {self.op_compute_s * us:.2f} us, "
            f"compulsory bytes {self._op.read_bytes + self._op.write_bytes:,} at DRAM bandwidth "
            f"{self.op_memory_s * us:.2f} us), achieved {100 * self.roofline_fraction:.1f} % of it",
            f"  program's own bound {self.program_bound_s * us:.2f} us (its work on the cores it used "
            f"{self.compute_bound_s * us:.2f} us, its DRAM bytes {self.dram_bound_s * us:.2f} us), "
            f"{100 * self.program_bound_fraction:.1f} % of it; "
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


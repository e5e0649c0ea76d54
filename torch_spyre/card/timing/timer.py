"""``time_program``: cost every instruction, build the dependency graph, simulate it, report."""

from __future__ import annotations

from ...program import Program, ProgramError
from ..config import CardConfig
from .accounting import (
    busiest_dma_channel_s,
    busy_seconds,
    bytes_moved,
    compute_bound,
    dram_bound,
    count_flops,
    verdict,
)
from .coster import Coster
from .graph import Graph, rescan_received_bytes
from .memo import TimingMemo, program_key
from .report import Interval, ProgramTiming
from .roofline import op_work
from .simulation import Simulation

_memo = TimingMemo()


def time_program(program: Program, config: CardConfig) -> ProgramTiming:
    """Time ``program`` on a card with ``config``. Raises ProgramError for programs that cannot finish.

    A program timed before (up to operand names, see ``memo``) is not simulated again."""
    for core in program.cores:
        if not 0 <= core < config.num_cores:
            raise ProgramError(f"core {core} does not exist (the card has {config.num_cores})", core)
    key = program_key(program, config)
    found = _memo.get(key, program, config)
    timing = found if found is not None else _memo.put(key, simulate_program(program, config))
    timing.op = op_work(program, timing.pe_flops, timing.vector_corelet_cycles)
    return timing


def simulate_program(program: Program, config: CardConfig) -> ProgramTiming:
    """:func:`time_program` without the memo: always simulates (``program``'s cores must exist)."""
    graph = Graph(program, Coster(config))
    rescan_received_bytes(graph)
    sim = Simulation(graph, config)
    sim.run()
    fixed = config.kernel_fixed_cost_s
    makespan = max(sim.end, default=0.0)
    intervals = [
        Interval(n.core, n.index, n.engine, n.instr.OP, fixed + sim.start[i], fixed + sim.end[i])
        for i, n in enumerate(graph.nodes)
    ]
    busy = busy_seconds(graph, intervals)
    moved = bytes_moved(graph)
    flops, pe_flops = count_flops(graph)
    compute_s = compute_bound(graph, config, pe_flops)
    # Vector work as cycles of one corelet (the coster charged it spread over the corelets in use).
    vector_cycles = sum(n.duration for n in graph.nodes if n.engine == "vector") * config.clock_hz * config.corelets_in_use
    dram_s = dram_bound(moved, config)
    dram_busy = sim.busy.get("dram", 0.0)
    ring_s = max((b for r, b in sim.busy.items() if r != "dram"), default=0.0)
    total = fixed + makespan
    bounds = {
        "dram-bound": dram_busy,
        "dma-engine-bound": busiest_dma_channel_s(graph, config),
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
        bottleneck=verdict(total, fixed, bounds),
        config=config,
        vector_corelet_cycles=vector_cycles,
        op=op_work(program, pe_flops, vector_cycles),
    )

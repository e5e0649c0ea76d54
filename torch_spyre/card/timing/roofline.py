"""The op roofline: the yardstick every "of roofline" figure is measured against (one place).

    op roofline = max(op flops / the whole chip's peak, compulsory bytes / device-memory bandwidth) + fixed cost

It depends on the *op*, not on the program that implements it: the chip's peak counts every core and every
corelet whatever the program uses, and the compulsory bytes read each input once and write each output once
whatever the program moved. An inefficient program (too few cores, operands reloaded by every core) is
therefore measured as inefficient. The program's own bound (its DRAM bytes, the cores it used) is kept
beside it as :attr:`ProgramTiming.program_bound_s`, named for what it is.

What the op is comes from ``program.metadata["op"]`` when the generator declared it (``flops`` of the PE
arrays, ``vector_cycles`` of vector work on one corelet, ``read_bytes``, ``write_bytes``: a matmul declares 2*M*N*K
without stick padding and the sticks of its views). Otherwise it is read off the program: PE and vector
work as the instructions do it, and per operand ``min(its device bytes, the bytes the program's DMA moved
for it)`` read for inputs and written for outputs (an operand a kernel only partly reads is not charged
whole).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ...program import DmaGather, DmaLoad, DmaStore, Program
from ..config import CardConfig


@dataclass(frozen=True)
class OpWork:
    """The work of the op a kernel implements."""

    flops: float  # PE (matmul) flops
    vector_cycles: float  # vector-unit work in cycles of one corelet (costs.vector_cycles at one corelet)
    read_bytes: int  # compulsory: each input read once
    write_bytes: int  # compulsory: each output written once
    source: str  # "declared by the generator" or "read off the program"


def chip_pe_peak(config: CardConfig) -> float:
    """fp16 flop/s of the whole chip: every core, every corelet."""
    return config.chip_peak_fp16_flops


def chip_vector_rate(config: CardConfig) -> float:
    """Corelet-cycles of vector work the whole chip does per second (every core, every corelet)."""
    return config.num_cores * config.corelets_per_core * config.clock_hz


def op_work(program: Program, pe_flops: float, vector_cycles: float) -> OpWork:
    """The op's work: declared in ``program.metadata["op"]``, else read off the program (see the module)."""
    declared = program.metadata.get("op")
    if declared:
        return OpWork(float(declared["flops"]), float(declared.get("vector_cycles", 0.0)), int(declared["read_bytes"]),
                      int(declared["write_bytes"]), "declared by the generator")
    loaded: dict[str, int] = defaultdict(int)
    stored: dict[str, int] = defaultdict(int)
    for _, _, ins in program.instructions():
        if isinstance(ins, DmaLoad):
            loaded[ins.src.operand] += ins.pattern.nbytes
        elif isinstance(ins, DmaGather):
            loaded[ins.src.operand] += ins.index.numel * ins.row_sticks * 128
        elif isinstance(ins, DmaStore):
            stored[ins.dst.operand] += ins.pattern.nbytes
    read = sum(min(o.nbytes, loaded[o.name]) for o in program.operands if o.access in ("in", "inout"))
    write = sum(min(o.nbytes, stored[o.name]) for o in program.operands if o.access in ("out", "inout"))
    return OpWork(float(pe_flops), float(vector_cycles), read, write, "read off the program")


def op_compute_s(work: OpWork, config: CardConfig) -> float:
    """The op's flops at the whole chip's peak (PE and vector units run side by side: the longer)."""
    return max(work.flops / chip_pe_peak(config), work.vector_cycles / chip_vector_rate(config))


def op_memory_s(work: OpWork, config: CardConfig) -> float:
    """The compulsory bytes at the device memory's read and write bandwidths."""
    return work.read_bytes / config.dram_read_bandwidth + work.write_bytes / config.dram_write_bandwidth


def op_roofline_s(work: OpWork, config: CardConfig) -> float:
    """The op roofline, fixed cost included."""
    return max(op_compute_s(work, config), op_memory_s(work, config)) + config.kernel_fixed_cost_s

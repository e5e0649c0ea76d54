"""The text form of programs: one readable line per instruction (error messages quote it too)."""

from __future__ import annotations

from typing import Any

from .instructions import (
    Barrier,
    DmaGather,
    DmaLoad,
    DmaStore,
    Elementwise,
    MatMul,
    Reduce,
    RingRecv,
    RingSend,
    Signal,
    Wait,
)
from .operands import Addr, DmaPattern, SpTensor


def format_instruction(ins: Any) -> str:
    """One line a person can read, e.g. ``dma_load sp[0x0] <- %x+0 sticks(4,16) dram(2048,128) sp(2048,128)``."""
    if isinstance(ins, DmaLoad):
        return f"dma_load   sp[{ins.sp_offset:#x}] <- {_fmt_addr(ins.src)} {_fmt_pattern(ins.pattern)}"
    if isinstance(ins, DmaStore):
        return f"dma_store  {_fmt_addr(ins.dst)} <- sp[{ins.sp_offset:#x}] {_fmt_pattern(ins.pattern)}"
    if isinstance(ins, DmaGather):
        return (f"dma_gather sp[{ins.sp_offset:#x}] <- {_fmt_addr(ins.src)}[{_fmt_sp(ins.index)}] "
                f"row={ins.row_sticks} sticks stride={ins.row_stride} rows={ins.num_rows}")
    if isinstance(ins, MatMul):
        acc = " +=" if ins.accumulate else " ="
        return f"matmul     {_fmt_sp(ins.out)}{acc} {_fmt_sp(ins.a)} @ {_fmt_sp(ins.b)}"
    if isinstance(ins, Elementwise):
        args = ", ".join(_fmt_sp(a) if isinstance(a, SpTensor) else repr(a.value) for a in ins.inputs)
        return f"{ins.op:<10} {_fmt_sp(ins.out)} = {args}"
    if isinstance(ins, Reduce):
        acc = " +=" if ins.accumulate else " ="
        return f"reduce.{ins.op:<4} {_fmt_sp(ins.out)}{acc} {_fmt_sp(ins.inp)} axis={ins.axis}"
    if isinstance(ins, RingSend):
        return (f"ring_send  -> core {ins.dst_core} sp[{ins.dst_offset:#x}] <- sp[{ins.src_offset:#x}] "
                f"{ins.nbytes} bytes tag={ins.tag} net={ins.network}")
    if isinstance(ins, RingRecv):
        return f"ring_recv  <- core {ins.src_core} tag={ins.tag}"
    if isinstance(ins, Barrier):
        return f"barrier    tag={ins.tag} cores={format_cores(ins.cores)}"
    if isinstance(ins, Signal):
        return f"signal     -> core {ins.dst_core} tag={ins.tag}"
    if isinstance(ins, Wait):
        return f"wait       <- core {ins.src_core} tag={ins.tag}"
    return repr(ins)


def format_cores(cores: "tuple[int, ...] | None") -> str:
    """A barrier's core group as printed: ``all`` (None: every core with instructions) or the list."""
    return "all" if cores is None else str(list(cores))


def format_program(program: Any) -> str:
    """The whole program: its operands, then each core's numbered instructions."""
    lines = [f"program {program.name}"]
    for o in program.operands:
        desc = f"  operand %{o.name}: {o.nbytes} bytes, {o.access}"
        if o.device_dtype:
            desc += f", {o.device_dtype}{list(o.host_shape or ())} stick_dim={o.stick_dim}"
        lines.append(desc)
    for core, ins in sorted(program.cores.items()):
        lines.append(f"core {core}:")
        for i, instr in enumerate(ins):
            lines.append(f"  {i:4d}  {format_instruction(instr)}")
    return "\n".join(lines)


def _fmt_addr(a: Addr) -> str:
    return f"%{a.operand}+{a.offset}"


def _fmt_pattern(p: DmaPattern) -> str:
    return f"sticks{list(p.shape)} dram{list(p.dram_strides)} sp{list(p.sp_strides)}"


def _fmt_sp(t: SpTensor) -> str:
    return f"sp[{t.offset:#x}]:{t.dtype}{list(t.shape)}/{list(t.strides)}"

"""Runs of alike vector instructions on one core, as one instruction for the fast executor.

The pointwise generator writes one vector instruction per strided box, and an irregular tile is many
small boxes one after the other (a copy of 32 elements per stick, hundreds of times). Consecutive data
instructions of one core with no sync instruction between them may run as one array operation when
they are alike (same op, dtypes, shapes, strides and immediates) and each tensor's offset steps by a
constant number of elements: the run becomes one instruction whose tensors gain a leading dimension of
that step.

Why that gives the same bytes: the program is proved race-free, so any other core's access to bytes the
run touches is ordered by synchronization, which this core does only before or after the whole run;
inside the run, reading every input before writing every output is the sequential order as long as no
instruction's output overlaps a later instruction's input or another instruction's output (checked here
on byte spans, conservatively). Only ops whose result for an element does not depend on its position in
the array are joined (not ``vector_ops.POSITION_DEPENDENT_OPS``), and only ops that cannot fail at run
time (floating-point ops and same-dtype copies: an integer division by zero must name its own
instruction).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ...program import Elementwise, Instruction, Program, Scalar, SpTensor
from .. import vector_ops
from .schedule import SYNC_TYPES

MIN_RUN = 2


def joined_cores(program: Program) -> tuple[dict[int, list[Instruction]], dict[int, list[int]]]:
    """Per core: the instructions with runs joined, and each one's index in the program."""
    cores: dict[int, list[Instruction]] = {}
    origin: dict[int, list[int]] = {}
    for c, instrs in program.cores.items():
        out: list[Instruction] = []
        idx: list[int] = []
        i = 0
        while i < len(instrs):
            n = _run_length(instrs, i)
            out.append(_join(instrs[i:i + n]) if n >= MIN_RUN else instrs[i])
            idx.append(i)
            i += max(n, 1)
        cores[c], origin[c] = out, idx
    return cores, origin


def _joinable(ins: Instruction) -> bool:
    if not isinstance(ins, Elementwise) or ins.op in vector_ops.POSITION_DEPENDENT_OPS:
        return False
    tensors = [x for x in (ins.out, *ins.inputs) if isinstance(x, SpTensor)]
    if any(t.numel == 0 for t in tensors):
        return False
    first = ins.inputs[0] if ins.inputs else None
    if ins.op == "copy" and isinstance(first, SpTensor) and first.dtype == ins.out.dtype:
        return True
    if ins.op == "copy" and all(isinstance(x, Scalar) for x in ins.inputs):
        return True
    floats = [x for x in ins.inputs if isinstance(x, SpTensor)]
    return bool(floats) and ins.op != "where" and ins.op not in vector_ops.BOOL_RESULT_OPS and all(
        x.dtype in vector_ops.FLOAT_DTYPES for x in floats)


def _shape_key(ins: Elementwise) -> tuple:
    return (ins.op, tuple(("t", x.dtype, x.shape, x.strides) if isinstance(x, SpTensor) else ("s", x.value)
                          for x in (ins.out, *ins.inputs)))


def _tensors(ins: Elementwise) -> list[SpTensor | Scalar]:
    return [ins.out, *ins.inputs]


def _run_length(instrs: Sequence[Instruction], i: int) -> int:
    """How many instructions from ``i`` form a joinable run (0 if ``instrs[i]`` cannot start one)."""
    first = instrs[i]
    if isinstance(first, SYNC_TYPES) or not _joinable(first):
        return 0
    key = _shape_key(first)
    n = 1
    steps: list[int] | None = None
    while i + n < len(instrs):
        nxt = instrs[i + n]
        if not isinstance(nxt, Elementwise) or _shape_key(nxt) != key:
            break
        deltas = [b.offset - a.offset if isinstance(a, SpTensor) else 0
                  for a, b in zip(_tensors(instrs[i + n - 1]), _tensors(nxt))]
        if steps is None:
            if any(d < 0 or d % t.itemsize for d, t in zip(deltas, _tensors(first)) if isinstance(t, SpTensor)):
                break
            steps = deltas
        elif deltas != steps:
            break
        if not _independent(first, steps, n + 1):
            break
        n += 1
    return n


def _independent(first: Elementwise, steps: list[int], n: int) -> bool:
    """Instruction ``k = n - 1`` of the run (offsets ``first``'s + k * steps) writes nothing another one
    writes, and no earlier one wrote what it reads (on byte spans: conservative)."""
    k = n - 1
    olo, ohi = first.out.byte_span()
    dout = steps[0]
    if dout < ohi - olo:  # consecutive outputs overlap
        return False
    for x, d in zip(first.inputs, steps[1:]):
        if not isinstance(x, SpTensor):
            continue
        ilo, ihi = x.byte_span()
        ilo, ihi = ilo + d * k, ihi + d * k
        # Output j = [olo + dout * j, ohi + dout * j) meets this input iff ilo - ohi < dout * j < ihi - olo.
        lo_j = (ilo - ohi) // dout + 1
        hi_j = -((olo - ihi) // dout) - 1  # ceil((ihi - olo) / dout) - 1
        if max(lo_j, 0) <= min(hi_j, k - 1):
            return False
    return True


def _join(run: Sequence[Elementwise]) -> Elementwise:
    first, second = run[0], run[1]
    n = len(run)

    def lift(a, b):
        if not isinstance(a, SpTensor):
            return a
        step = (b.offset - a.offset) // a.itemsize
        return replace(a, shape=(n, *a.shape), strides=(step, *a.strides))

    return Elementwise(first.op, lift(first.out, second.out),
                       tuple(lift(a, b) for a, b in zip(first.inputs, second.inputs)))

"""Spyre programs: per-core instruction streams over sticks. The contract between compiler and card.

A :class:`Program` declares its tensor operands by name (symbolic addresses) and gives each core a list
of instructions. Device memory is only touched by DMA instructions, in whole 128-byte sticks, at
``Addr(operand, byte offset)``; the runtime patches operand base addresses in at launch. Everything
else works on the core's scratchpad, addressed in bytes from 0.

Instruction families (see docs/program-format.md for the full reference):
- DMA:     ``DmaLoad``, ``DmaStore`` (strided stick patterns), ``DmaGather`` (rows picked by an index
           tensor held in scratchpad);
- compute: ``MatMul`` (PE arrays, fp32 accumulation), ``Elementwise`` (vector unit, incl.
           transcendentals and dtype casts), ``Reduce`` (vector unit);
- ring:    ``RingSend`` / ``RingRecv`` (scratchpad to scratchpad between cores, a token per transfer);
- sync:    ``Barrier`` (a group of cores), ``Signal`` / ``Wait`` (a token between two cores).

Programs are plain data: this package only builds, validates, serializes and prints them.

- ``operands``: ``STICK_BYTES``, scratchpad dtypes, ``Operand`` / ``Addr`` / ``SpTensor`` / ``Scalar`` /
  ``DmaPattern``;
- ``ops``: the vector unit's op names by arity;
- ``instructions``: the instruction dataclasses and what DMA addresses they reach;
- ``program``: the ``Program`` container; ``serialization``: its JSON file format; ``format``: its text;
- ``errors``: ``ProgramError``.
"""

from .errors import ProgramError
from .format import format_cores, format_instruction, format_program
from .instructions import (
    INSTRUCTION_TYPES,
    Barrier,
    DmaGather,
    DmaLoad,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Reduce,
    RingRecv,
    RingSend,
    Signal,
    Wait,
    dram_addr,
    dram_spans,
)
from .operands import (
    SP_DTYPES,
    STICK_BYTES,
    Addr,
    DmaPattern,
    Operand,
    Scalar,
    SpTensor,
    row_major_strides,
    strided_extent,
)
from .ops import BINARY_OPS, REDUCE_OPS, TERNARY_OPS, TRANSCENDENTAL_OPS, UNARY_OPS
from .program import Program
from .serialization import FORMAT_VERSION

__all__ = [
    "Addr", "BINARY_OPS", "Barrier", "DmaGather", "DmaLoad", "DmaPattern", "DmaStore", "Elementwise",
    "FORMAT_VERSION", "INSTRUCTION_TYPES", "Instruction", "MatMul", "Operand", "Program", "ProgramError",
    "REDUCE_OPS", "Reduce", "RingRecv", "RingSend", "SP_DTYPES", "STICK_BYTES", "Scalar", "Signal",
    "SpTensor", "TERNARY_OPS", "TRANSCENDENTAL_OPS", "UNARY_OPS", "Wait", "dram_addr", "dram_spans",
    "format_cores", "format_instruction", "format_program", "row_major_strides", "strided_extent",
]

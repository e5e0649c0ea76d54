"""The instruction set: one frozen dataclass per instruction, each naming its op and the engine that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

from .operands import STICK_BYTES, Addr, DmaPattern, Scalar, SpTensor


@dataclass(frozen=True)
class Instruction:
    OP: ClassVar[str] = ""
    ENGINE: ClassVar[str] = ""  # "dma", "pe", "vector", "ring", "sync"


@dataclass(frozen=True)
class DmaLoad(Instruction):
    """Device memory -> scratchpad."""

    OP: ClassVar[str] = "dma_load"
    ENGINE: ClassVar[str] = "dma"
    src: Addr
    sp_offset: int
    pattern: DmaPattern


@dataclass(frozen=True)
class DmaStore(Instruction):
    """Scratchpad -> device memory."""

    OP: ClassVar[str] = "dma_store"
    ENGINE: ClassVar[str] = "dma"
    dst: Addr
    sp_offset: int
    pattern: DmaPattern


@dataclass(frozen=True)
class DmaGather(Instruction):
    """For each of the ``index.numel`` indices i held in scratchpad, load ``row_sticks`` contiguous
    sticks from ``src + i * row_stride`` (bytes) to ``sp_offset + n * row_sticks * 128``."""

    OP: ClassVar[str] = "dma_gather"
    ENGINE: ClassVar[str] = "dma"
    src: Addr
    index: SpTensor
    row_stride: int
    row_sticks: int
    sp_offset: int
    num_rows: int  # rows that exist at src: an index outside [0, num_rows) is an error

    def sp_range(self) -> tuple[int, int]:
        """The scratchpad bytes [lo, hi) the gathered rows are written to."""
        return self.sp_offset, self.sp_offset + self.index.numel * self.row_sticks * STICK_BYTES


@dataclass(frozen=True)
class MatMul(Instruction):
    """out[M, N] (+)= a[M, K] @ b[K, N] on the PE arrays, accumulating in fp32; the result is rounded
    to out's dtype when written."""

    OP: ClassVar[str] = "matmul"
    ENGINE: ClassVar[str] = "pe"
    out: SpTensor
    a: SpTensor
    b: SpTensor
    accumulate: bool = False


@dataclass(frozen=True)
class Elementwise(Instruction):
    """out = op(*inputs) on the vector unit, computed in fp32 (integers in their own type) and rounded
    to out's dtype. Inputs broadcast through stride-0 views; ``cast`` converts dtype."""

    OP: ClassVar[str] = "elementwise"
    ENGINE: ClassVar[str] = "vector"
    op: str
    out: SpTensor
    inputs: tuple[Union[SpTensor, Scalar], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))


@dataclass(frozen=True)
class Reduce(Instruction):
    """out = op over ``axis`` of inp, accumulated in fp32; out has inp's shape with ``axis`` of size 1.
    With ``accumulate`` the result is combined with out's current value (same op)."""

    OP: ClassVar[str] = "reduce"
    ENGINE: ClassVar[str] = "vector"
    op: str
    out: SpTensor
    inp: SpTensor
    axis: int
    accumulate: bool = False


@dataclass(frozen=True)
class RingSend(Instruction):
    """Copy ``nbytes`` from this core's scratchpad to ``dst_core``'s scratchpad over the ring
    (``network`` "data" is the 128 B/cycle ring, "reduce" the 32 B/cycle reduction ring). The
    receiver's matching ``RingRecv(src_core=this core, tag)`` completes when the data has arrived."""

    OP: ClassVar[str] = "ring_send"
    ENGINE: ClassVar[str] = "ring"
    dst_core: int
    src_offset: int
    dst_offset: int
    nbytes: int
    tag: int
    network: str = "data"


@dataclass(frozen=True)
class RingRecv(Instruction):
    OP: ClassVar[str] = "ring_recv"
    ENGINE: ClassVar[str] = "ring"
    src_core: int
    tag: int


@dataclass(frozen=True)
class Barrier(Instruction):
    """Every core in ``cores`` (None: all cores that have instructions) waits here for the others."""

    OP: ClassVar[str] = "barrier"
    ENGINE: ClassVar[str] = "sync"
    tag: int
    cores: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.cores is not None:
            object.__setattr__(self, "cores", tuple(sorted(self.cores)))


@dataclass(frozen=True)
class Signal(Instruction):
    OP: ClassVar[str] = "signal"
    ENGINE: ClassVar[str] = "sync"
    dst_core: int
    tag: int


@dataclass(frozen=True)
class Wait(Instruction):
    OP: ClassVar[str] = "wait"
    ENGINE: ClassVar[str] = "sync"
    src_core: int
    tag: int


INSTRUCTION_TYPES: dict[str, type[Instruction]] = {
    cls.OP: cls for cls in (DmaLoad, DmaStore, DmaGather, MatMul, Elementwise, Reduce, RingSend, RingRecv, Barrier, Signal, Wait)
}


def dram_addr(ins: Instruction) -> Addr | None:
    """The symbolic device address of a DMA instruction (None for the others)."""
    if isinstance(ins, (DmaLoad, DmaGather)):
        return ins.src
    if isinstance(ins, DmaStore):
        return ins.dst
    return None


def dram_spans(instructions: "list[Instruction]") -> dict[str, tuple[int, int]]:
    """Per operand, the [lo, hi) byte range of device memory that strided DMA loads and stores reach:
    what one core addresses in a kernel (bounded by config.core_address_span_bytes)."""
    spans: dict[str, list[int]] = {}
    for i in instructions:
        if isinstance(i, (DmaLoad, DmaStore)):
            addr = dram_addr(i)
            lo, hi = i.pattern.dram_range(addr.offset)
            cur = spans.setdefault(addr.operand, [lo, hi])
            cur[0], cur[1] = min(cur[0], lo), max(cur[1], hi)
    return {name: (lo, hi) for name, (lo, hi) in spans.items()}

"""Static checks of a Spyre program against a card configuration.

``validate(program, config)`` raises :class:`~torch_spyre.program.ProgramError` for the first problem,
naming the core and the instruction (the error formats that). It checks what can be known without
data: operand names, core ids, scratchpad bounds (the plannable part), DMA alignment and operand
bounds, dtypes, ops, shapes, and that every ring_send/signal/barrier has its partners. What depends
on data or on scheduling (gather indices, races, deadlocks, reads of unwritten bytes) is checked by
:func:`torch_spyre.card.execute.execute`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ..program import (
    BINARY_OPS,
    REDUCE_OPS,
    SP_DTYPES,
    STICK_BYTES,
    TERNARY_OPS,
    UNARY_OPS,
    Addr,
    Barrier,
    DmaGather,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Operand,
    Program,
    ProgramError,
    Reduce,
    RingRecv,
    RingSend,
    Scalar,
    Signal,
    SpTensor,
    Wait,
)

OPERAND_ACCESS = ("in", "out", "inout")
RING_NETWORKS = ("data", "reduce")
INTEGER_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8", "bool"})


class _Checker:
    """Checks one instruction; ``fail`` builds the error naming where it is."""

    def __init__(self, program: Program, config: Any):
        self.program = program
        self.config = config
        self.limit = config.scratchpad_plannable_bytes
        self.operands: dict[str, Operand] = {o.name: o for o in program.operands}
        self.core = 0
        self.index = 0
        self.instr: Instruction | None = None

    def fail(self, message: str) -> ProgramError:
        return ProgramError(message, self.core, self.index, self.instr)

    # --- pieces ----------------------------------------------------------------------------------
    def sp_range(self, lo: int, hi: int, what: str) -> None:
        if lo < 0:
            raise self.fail(f"{what} starts at scratchpad byte {lo}, before the scratchpad")
        if hi > self.limit:
            raise self.fail(
                f"{what} reaches scratchpad byte {hi}: the plan overflows the scratchpad, needing {hi} bytes "
                f"but only {self.limit} are plannable (config.scratchpad_plannable_bytes). Tile the work smaller."
            )

    def sp_tensor(self, t: Any, what: str) -> None:
        if not isinstance(t, SpTensor):
            raise self.fail(f"{what} must be a scratchpad tensor (SpTensor), got {type(t).__name__}")
        if t.dtype not in SP_DTYPES:
            raise self.fail(f"{what} has unknown dtype {t.dtype!r}; known: {', '.join(SP_DTYPES)}")
        if len(t.strides) != len(t.shape):
            raise self.fail(f"{what} has {len(t.shape)} sizes {list(t.shape)} but {len(t.strides)} strides "
                            f"{list(t.strides)}; give one stride per dimension")
        if any(s < 0 for s in t.shape):
            raise self.fail(f"{what} has a negative size in {list(t.shape)}")
        self.sp_range(*t.byte_span(), what)

    def out_tensor(self, t: Any) -> None:
        self.sp_tensor(t, "out")
        if any(st == 0 and s > 1 for s, st in zip(t.shape, t.strides)):
            raise self.fail(f"out has a broadcast (stride 0) dimension {list(t.shape)}/{list(t.strides)}: "
                            "several results would land on one element")

    def operand(self, addr: Addr, write: bool) -> Operand:
        op = self.operands.get(addr.operand)
        if op is None:
            raise self.fail(f"unknown operand %{addr.operand}; declared: "
                            f"{', '.join('%' + n for n in self.operands) or 'none'}")
        if write and op.access == "in":
            raise self.fail(f"writes to operand %{op.name}, which is declared access='in'; declare it out or inout")
        if addr.offset % STICK_BYTES:
            raise self.fail(f"device offset {addr.offset} into %{op.name} is not {STICK_BYTES}-byte aligned "
                            "(DMA moves whole sticks)")
        return op

    def dram_range(self, op: Operand, lo: int, hi: int) -> None:
        if lo < 0 or hi > op.nbytes:
            raise self.fail(f"device bytes [{lo}, {hi}) are outside operand %{op.name}, which has {op.nbytes} bytes")

    def pattern(self, p: Any) -> None:
        if not isinstance(p, DmaPattern):
            raise self.fail(f"pattern must be a DmaPattern, got {type(p).__name__}")
        if not len(p.shape) == len(p.dram_strides) == len(p.sp_strides):
            raise self.fail(f"DMA pattern has {len(p.shape)} loops but {len(p.dram_strides)} dram strides and "
                            f"{len(p.sp_strides)} sp strides; give one stride per loop on each side")
        if any(s < 0 for s in p.shape):
            raise self.fail(f"DMA pattern has a negative loop count in {list(p.shape)}")
        for side, strides in (("dram", p.dram_strides), ("sp", p.sp_strides)):
            if any(st % STICK_BYTES for st in strides):
                raise self.fail(f"DMA {side} strides {list(strides)} must be multiples of {STICK_BYTES} bytes "
                                "(every stick is aligned)")

    def sp_offset(self, offset: int) -> None:
        if offset % STICK_BYTES:
            raise self.fail(f"scratchpad offset {offset} is not {STICK_BYTES}-byte aligned (DMA moves whole sticks)")

    def core_id(self, core: Any, what: str) -> None:
        n = self.config.num_cores
        if not isinstance(core, int) or not 0 <= core < n:
            raise self.fail(f"{what} {core!r} is not a core of this card (0..{n - 1})")
        if core == self.core:
            raise self.fail(f"{what} is this core itself; the ring and tokens connect different cores")

    # --- instructions ----------------------------------------------------------------------------
    def check(self, ins: Instruction) -> list[tuple[str, int, int]]:
        """Check ``ins``; return the device ranges it touches as (operand, lo, hi)."""
        method = getattr(self, "_" + type(ins).__name__, None)
        if method is None:
            raise self.fail(f"unknown instruction type {type(ins).__name__}")
        return method(ins) or []

    def _DmaLoad(self, ins: DmaLoad) -> list[tuple[str, int, int]]:
        return self._dma(ins.src, ins.sp_offset, ins.pattern, write=False)

    def _DmaStore(self, ins: DmaStore) -> list[tuple[str, int, int]]:
        return self._dma(ins.dst, ins.sp_offset, ins.pattern, write=True)

    def _dma(self, addr: Addr, sp_offset: int, p: DmaPattern, write: bool) -> list[tuple[str, int, int]]:
        op = self.operand(addr, write)
        self.pattern(p)
        self.sp_offset(sp_offset)
        if not p.sticks:
            return []
        lo, hi = p.dram_range(addr.offset)
        self.dram_range(op, lo, hi)
        self.sp_range(*p.sp_range(sp_offset), "the DMA's scratchpad side")
        return [(op.name, lo, hi)]

    def _DmaGather(self, ins: DmaGather) -> list[tuple[str, int, int]]:
        op = self.operand(ins.src, write=False)
        self.sp_tensor(ins.index, "index")
        if ins.index.dtype not in INTEGER_DTYPES - {"bool"}:
            raise self.fail(f"gather index must have an integer dtype, got {ins.index.dtype}")
        self.sp_offset(ins.sp_offset)
        if ins.row_sticks < 1 or ins.num_rows < 0:
            raise self.fail(f"gather needs row_sticks >= 1 and num_rows >= 0, got {ins.row_sticks} and {ins.num_rows}")
        if ins.row_stride % STICK_BYTES or ins.row_stride < 0:
            raise self.fail(f"gather row_stride {ins.row_stride} must be a non-negative multiple of {STICK_BYTES}")
        row_bytes = ins.row_sticks * STICK_BYTES
        self.sp_range(*ins.sp_range(), "the gather destination")
        if ins.num_rows == 0:
            return []
        hi = ins.src.offset + (ins.num_rows - 1) * ins.row_stride + row_bytes
        self.dram_range(op, ins.src.offset, hi)
        return [(op.name, ins.src.offset, hi)]

    def _MatMul(self, ins: MatMul) -> None:
        self.out_tensor(ins.out)
        self.sp_tensor(ins.a, "a")
        self.sp_tensor(ins.b, "b")
        for name, t in (("out", ins.out), ("a", ins.a), ("b", ins.b)):
            if len(t.shape) != 2:
                raise self.fail(f"matmul {name} must be 2-d, got shape {list(t.shape)}")
        (m, k), (k2, n) = ins.a.shape, ins.b.shape
        if k != k2 or ins.out.shape != (m, n):
            raise self.fail(f"matmul shapes do not agree: out{list(ins.out.shape)} = a{list(ins.a.shape)} @ "
                            f"b{list(ins.b.shape)}; need a[M, K], b[K, N], out[M, N]")
        floats = [t.dtype not in INTEGER_DTYPES for t in (ins.a, ins.b)]
        if floats[0] != floats[1]:
            raise self.fail(f"matmul mixes a {ins.a.dtype} and b {ins.b.dtype}; cast one first")

    def _Elementwise(self, ins: Elementwise) -> None:
        arity = 1 if ins.op in UNARY_OPS else 2 if ins.op in BINARY_OPS else 3 if ins.op in TERNARY_OPS else None
        if arity is None:
            known = sorted(UNARY_OPS | BINARY_OPS | TERNARY_OPS)
            raise self.fail(f"unknown elementwise op {ins.op!r}; known: {', '.join(known)}")
        if len(ins.inputs) != arity:
            raise self.fail(f"{ins.op} takes {arity} input(s), got {len(ins.inputs)}")
        self.out_tensor(ins.out)
        for k, x in enumerate(ins.inputs):
            if isinstance(x, Scalar):
                continue
            self.sp_tensor(x, f"input {k}")
            if x.shape != ins.out.shape:
                raise self.fail(f"input {k} has shape {list(x.shape)} but out has {list(ins.out.shape)}; "
                                "broadcast with a stride-0 view of out's shape")
        if ins.op == "copy" and isinstance(ins.inputs[0], SpTensor) and ins.inputs[0].dtype != ins.out.dtype:
            raise self.fail(f"copy keeps the dtype ({ins.inputs[0].dtype} -> {ins.out.dtype}); use cast to convert")

    def _Reduce(self, ins: Reduce) -> None:
        if ins.op not in REDUCE_OPS:
            raise self.fail(f"unknown reduce op {ins.op!r}; known: {', '.join(sorted(REDUCE_OPS))}")
        self.sp_tensor(ins.inp, "inp")
        self.out_tensor(ins.out)
        rank = len(ins.inp.shape)
        if not isinstance(ins.axis, int) or not 0 <= ins.axis < rank:
            raise self.fail(f"reduce axis {ins.axis} is out of range for a {rank}-d input (0..{rank - 1})")
        expected = tuple(1 if d == ins.axis else s for d, s in enumerate(ins.inp.shape))
        if ins.out.shape != expected:
            raise self.fail(f"reduce out has shape {list(ins.out.shape)}, expected {list(expected)} "
                            "(inp's shape with the reduced axis of size 1)")

    def _RingSend(self, ins: RingSend) -> None:
        self.core_id(ins.dst_core, "ring destination core")
        if ins.network not in RING_NETWORKS:
            raise self.fail(f"unknown ring network {ins.network!r}; known: {', '.join(RING_NETWORKS)}")
        for name, v in (("src_offset", ins.src_offset), ("dst_offset", ins.dst_offset), ("nbytes", ins.nbytes)):
            if v % STICK_BYTES:
                raise self.fail(f"ring {name} {v} is not a multiple of {STICK_BYTES} (the ring moves whole sticks)")
        if ins.nbytes <= 0:
            raise self.fail(f"ring_send must move at least one stick, got nbytes={ins.nbytes}")
        self.sp_range(ins.src_offset, ins.src_offset + ins.nbytes, "the ring source")
        self.sp_range(ins.dst_offset, ins.dst_offset + ins.nbytes, f"the ring destination on core {ins.dst_core}")

    def _RingRecv(self, ins: RingRecv) -> None:
        self.core_id(ins.src_core, "ring source core")

    def _Signal(self, ins: Signal) -> None:
        self.core_id(ins.dst_core, "signal destination core")

    def _Wait(self, ins: Wait) -> None:
        self.core_id(ins.src_core, "wait source core")

    def _Barrier(self, ins: Barrier) -> None:
        if ins.cores is None:
            return
        n = self.config.num_cores
        bad = [c for c in ins.cores if not 0 <= c < n]
        if bad:
            raise self.fail(f"barrier cores {bad} are not cores of this card (0..{n - 1})")
        if self.core not in ins.cores:
            raise self.fail(f"core {self.core} runs a barrier whose core set {list(ins.cores)} does not include it")


# ---------------------------------------------------------------------------------------------
# Whole-program checks
# ---------------------------------------------------------------------------------------------
def _check_operands(program: Program) -> None:
    seen: set[str] = set()
    for o in program.operands:
        if o.name in seen:
            raise ProgramError(f"operand %{o.name} is declared twice")
        seen.add(o.name)
        if o.access not in OPERAND_ACCESS:
            raise ProgramError(f"operand %{o.name} has access {o.access!r}; use one of {', '.join(OPERAND_ACCESS)}")
        if o.nbytes < 0:
            raise ProgramError(f"operand %{o.name} has a negative size ({o.nbytes} bytes)")
        if o.device_dtype is not None and o.device_dtype not in SP_DTYPES:
            raise ProgramError(f"operand %{o.name} has unknown device dtype {o.device_dtype!r}; known: {', '.join(SP_DTYPES)}")


def _check_span(core: int, touched: dict[str, list[int]], limit: int) -> None:
    """A core can address at most ``limit`` bytes of device memory in one kernel."""
    spans = {name: hi - lo for name, (lo, hi) in touched.items()}
    total = sum(spans.values())
    if total > limit:
        biggest = ", ".join(f"%{n}: {b} bytes" for n, b in sorted(spans.items(), key=lambda kv: -kv[1])[:4])
        raise ProgramError(
            f"this core touches {total} bytes of device memory ({biggest}), more than the "
            f"{limit} bytes one core can address in a kernel (config.core_address_span_bytes); "
            "split the work over more cores or kernels", core)


def _check_pairs(program: Program) -> None:
    """Every ring_send has its ring_recv and every signal its wait (and the reverse), in equal numbers."""
    sends: dict[tuple, list[tuple[int, int, Instruction]]] = defaultdict(list)
    recvs: dict[tuple, list[tuple[int, int, Instruction]]] = defaultdict(list)
    for core, i, ins in program.instructions():
        if isinstance(ins, RingSend):
            sends[("ring", core, ins.dst_core, ins.tag)].append((core, i, ins))
        elif isinstance(ins, RingRecv):
            recvs[("ring", ins.src_core, core, ins.tag)].append((core, i, ins))
        elif isinstance(ins, Signal):
            sends[("token", core, ins.dst_core, ins.tag)].append((core, i, ins))
        elif isinstance(ins, Wait):
            recvs[("token", ins.src_core, core, ins.tag)].append((core, i, ins))
    for key in sorted(set(sends) | set(recvs)):
        s, r = sends.get(key, []), recvs.get(key, [])
        if len(s) == len(r):
            continue
        kind, src, dst, tag = key
        if len(s) > len(r):
            core, i, ins = s[len(r)]
            want = "ring_recv" if kind == "ring" else "wait"
            raise ProgramError(f"has no matching {want} <- core {src} tag={tag} on core {dst} "
                               f"({len(s)} sent, {len(r)} received)", core, i, ins)
        core, i, ins = r[len(s)]
        want = "ring_send" if kind == "ring" else "signal"
        raise ProgramError(f"has no matching {want} -> core {dst} tag={tag} on core {src} "
                           f"({len(s)} sent, {len(r)} received)", core, i, ins)


def _check_barriers(program: Program) -> None:
    """All barriers with one tag name the same cores, and each of those cores reaches it equally often."""
    active = tuple(sorted(c for c, ins in program.cores.items() if ins))
    groups: dict[int, tuple[tuple[int, ...], int, int, Instruction]] = {}
    counts: dict[int, Counter] = defaultdict(Counter)
    for core, i, ins in program.instructions():
        if not isinstance(ins, Barrier):
            continue
        group = active if ins.cores is None else ins.cores
        if ins.tag in groups and groups[ins.tag][0] != group:
            first = groups[ins.tag]
            raise ProgramError(f"barrier tag {ins.tag} names cores {list(group)} here but cores {list(first[0])} "
                               f"at core {first[1]}, instruction {first[2]}; one tag, one core set", core, i, ins)
        groups.setdefault(ins.tag, (group, core, i, ins))
        counts[ins.tag][core] += 1
    for tag, (group, core, i, ins) in groups.items():
        n = {c: counts[tag][c] for c in group}
        if len(set(n.values())) > 1:
            short = [c for c in group if n[c] < max(n.values())]
            raise ProgramError(f"barrier tag {tag} is reached {max(n.values())} time(s) by some cores but fewer by "
                               f"core(s) {short} ({n}); the others would wait forever", core, i, ins)


def validate(program: Program, config: Any) -> None:
    """Raise :class:`ProgramError` for the first thing wrong with ``program`` on a card with ``config``."""
    _check_operands(program)
    checker = _Checker(program, config)
    for core, instrs in sorted(program.cores.items()):
        if not isinstance(core, int) or not 0 <= core < config.num_cores:
            raise ProgramError(f"core id {core!r} is outside this card's cores 0..{config.num_cores - 1}")
        touched: dict[str, list[int]] = {}
        for i, ins in enumerate(instrs):
            checker.core, checker.index, checker.instr = core, i, ins
            for name, lo, hi in checker.check(ins):
                span = touched.setdefault(name, [lo, hi])
                span[0], span[1] = min(span[0], lo), max(span[1], hi)
        _check_span(core, touched, config.core_address_span_bytes)
    _check_pairs(program)
    _check_barriers(program)

"""Functional execution of a Spyre program on the simulated card, with the checks real hardware skips.

Each core owns a real scratchpad (``config.scratchpad_bytes`` of ``np.uint8``). Data moves only through
DMA (device memory <-> scratchpad) and the ring (scratchpad -> scratchpad); compute instructions read
and write strided views of the scratchpad, vectorized with numpy over whole views.

Besides computing results, execution catches what a real card would turn into silent garbage, and
raises :class:`ExecutionError` naming the core and the instruction:

- a scratchpad access outside the plannable scratchpad;
- a read of scratchpad bytes that nothing wrote in this execution (a written-mask per byte);
- a DMA whose device range is not inside one live allocation;
- two cores touching the same device sticks, at least one writing, with no happens-before between
  them (vector clocks; Signal/Wait, RingSend/RingRecv and Barrier order cores);
- a gather index outside ``[0, num_rows)``;
- a deadlock: every unfinished core blocked, each named with what it waits for.

Cores run one at a time, each until it blocks on Wait/RingRecv/Barrier, round-robin. A RingSend copies
its bytes into the destination scratchpad at once but marks them written only when the receiver's
RingRecv completes: until then the receiver may neither read nor write them.

Time is not computed here (see card/timing.py); :class:`ExecutionStats` only counts work.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..program import (
    BINARY_OPS,
    REDUCE_OPS,
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
from .dlfloat16 import from_float32, to_float32
from .memory import InvalidAddressError

ENGINES = ("dma", "pe", "vector", "ring", "sync")

# How each scratchpad dtype is held in numpy (dlfloat16 as its raw bits).
NP_DTYPES: dict[str, np.dtype] = {
    "dlfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
FLOAT_DTYPES = frozenset({"dlfloat16", "float32"})

class ExecutionError(ProgramError):
    """A program that went wrong while running (the message names the core and the instruction)."""


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------
@dataclass
class ExecutionStats:
    """What one execution did (counts and bytes; no time)."""

    instructions: dict[int, dict[str, int]] = field(default_factory=dict)  # core -> engine -> count
    dma_read_bytes: dict[int, int] = field(default_factory=dict)  # core -> bytes device -> scratchpad
    dma_write_bytes: dict[int, int] = field(default_factory=dict)  # core -> bytes scratchpad -> device
    ring_bytes: dict[int, int] = field(default_factory=dict)  # core -> bytes it sent over the ring

    def _add(self, table: dict[int, int], core: int, n: int) -> None:
        table[core] = table.get(core, 0) + n

    def count(self, core: int, engine: str) -> None:
        per = self.instructions.setdefault(core, dict.fromkeys(ENGINES, 0))
        per[engine] += 1

    @property
    def total_instructions(self) -> dict[str, int]:
        out = dict.fromkeys(ENGINES, 0)
        for per in self.instructions.values():
            for engine, n in per.items():
                out[engine] += n
        return out

    @property
    def total_dma_read_bytes(self) -> int:
        return sum(self.dma_read_bytes.values())

    @property
    def total_dma_write_bytes(self) -> int:
        return sum(self.dma_write_bytes.values())

    @property
    def total_ring_bytes(self) -> int:
        return sum(self.ring_bytes.values())


# ---------------------------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------------------------
def dram_addr(ins: Instruction) -> Addr | None:
    """The symbolic device address of a DMA instruction (None for the others)."""
    if isinstance(ins, DmaLoad) or isinstance(ins, DmaGather):
        return ins.src
    if isinstance(ins, DmaStore):
        return ins.dst
    return None


def resolve_addresses(program: Program, bases: dict[str, int]) -> dict[int, np.ndarray]:
    """Per core, the absolute device address of each instruction's DRAM side (0 for non-DMA
    instructions): ``bases[operand] + offset``. The simple form of the runtime's patching."""
    out: dict[int, np.ndarray] = {}
    for core, instrs in program.cores.items():
        addrs = np.zeros(len(instrs), dtype=np.int64)
        for i, ins in enumerate(instrs):
            a = dram_addr(ins)
            if a is not None:
                if a.operand not in bases:
                    raise ProgramError(f"no base address for operand %{a.operand}", core, i, ins)
                addrs[i] = int(bases[a.operand]) + a.offset
        out[core] = addrs
    return out


# ---------------------------------------------------------------------------------------------
# Scratchpads, kept per card across executions (allocating 2 MiB x 32 per launch costs more than
# the typical kernel's work)
# ---------------------------------------------------------------------------------------------
class _Scratchpads:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.data: dict[int, np.ndarray] = {}
        self.written: dict[int, np.ndarray] = {}  # per byte: written in this execution
        self.dirty_hi: dict[int, int] = {}  # written-mask bytes below this may be set
        self.lock = threading.Lock()

    def get(self, core: int) -> tuple[np.ndarray, np.ndarray]:
        if core not in self.data:
            self.data[core] = np.zeros(self.nbytes, dtype=np.uint8)
            self.written[core] = np.zeros(self.nbytes, dtype=np.bool_)
            self.dirty_hi[core] = 0
        # A new execution starts with nothing written: clear only what the last one dirtied.
        self.written[core][: self.dirty_hi[core]] = False
        self.dirty_hi[core] = 0
        return self.data[core], self.written[core]


_SCRATCHPADS: "weakref.WeakKeyDictionary[Any, _Scratchpads]" = weakref.WeakKeyDictionary()
_SCRATCHPADS_LOCK = threading.Lock()


def _scratchpads(card: Any) -> _Scratchpads:
    with _SCRATCHPADS_LOCK:
        sp = _SCRATCHPADS.get(card)
        if sp is None or sp.nbytes != card.config.scratchpad_bytes:
            sp = _Scratchpads(card.config.scratchpad_bytes)
            _SCRATCHPADS[card] = sp
        return sp


# ---------------------------------------------------------------------------------------------
# Per-core state
# ---------------------------------------------------------------------------------------------
@dataclass
class _Core:
    id: int
    instrs: list[Instruction]
    addrs: np.ndarray
    sp: np.ndarray
    written: np.ndarray
    vc: np.ndarray  # vector clock: vc[id] is this core's epoch (from 1), the rest what it knows of others
    touched: np.ndarray  # per scratchpad stick: this core's epoch when it last accessed it (0: never)
    pc: int = 0
    segment: int | None = None  # index of the current vector-clock snapshot used by DMA records
    barrier_key: tuple | None = None  # the barrier instance this core has arrived at
    barrier_count: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def done(self) -> bool:
        return self.pc >= len(self.instrs)

    def release(self) -> np.ndarray:
        """Publish this core's clock (to a Signal, RingSend or Barrier) and start a new epoch."""
        snapshot = self.vc.copy()
        self.vc[self.id] += 1
        self.segment = None
        return snapshot

    def acquire(self, other: np.ndarray) -> None:
        np.maximum(self.vc, other, out=self.vc)
        self.segment = None


@dataclass
class _Access:
    """One DMA's device sticks, for the race check."""

    core: int
    index: int
    segment: int
    write: bool
    sticks: np.ndarray  # device stick numbers (address // 128)


@dataclass
class _InFlight:
    src_core: int
    src_index: int
    dst_offset: int
    nbytes: int
    vc: np.ndarray


# ---------------------------------------------------------------------------------------------
# Elementwise and reduce semantics
# ---------------------------------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    return torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    return torch.nn.functional.gelu(torch.from_numpy(np.ascontiguousarray(x)), approximate=approximate).numpy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return torch.sigmoid(torch.from_numpy(np.ascontiguousarray(x))).numpy()


# Ops whose result is floating point whatever the inputs (torch promotes integers for them).
FLOAT_RESULT_OPS = frozenset(
    {"exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "sin", "cos", "gelu",
     "gelu_tanh", "silu", "div"}
)
# Ops whose result is 0/1.
BOOL_RESULT_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not"})

_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "abs": np.abs,
    "relu": lambda x: np.maximum(x, x.dtype.type(0)),  # NaN propagates, like torch.relu
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "reciprocal": lambda x: np.float32(1) / x,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "erf": _erf,
    "sin": np.sin,
    "cos": np.cos,
    "floor": lambda x: x if x.dtype.kind == "i" else np.floor(x),
    "ceil": lambda x: x if x.dtype.kind == "i" else np.ceil(x),
    "round": lambda x: x if x.dtype.kind == "i" else np.round(x),  # half to even, like torch.round
    "sign": np.sign,
    "logical_not": lambda x: x == 0,
    "square": np.square,
    "gelu": lambda x: _gelu(x, "none"),
    "gelu_tanh": lambda x: _gelu(x, "tanh"),
    "silu": lambda x: x * _sigmoid(x),
    "copy": lambda x: x,
    "cast": lambda x: x,
}

_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,  # NaN propagates, like torch.maximum
    "minimum": np.minimum,
    "pow": np.power,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "logical_and": lambda a, b: (a != 0) & (b != 0),
    "logical_or": lambda a, b: (a != 0) | (b != 0),
    "remainder": np.mod,  # sign of the divisor, like torch.remainder / Python's %
    "floordiv": np.floor_divide,
}

_TERNARY: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "where": lambda c, a, b: np.where(c != 0, a, b),
    "fma": lambda a, b, c: a * b + c,
}

_REDUCE: dict[str, tuple[Callable[..., np.ndarray], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    # op -> (reduction over an axis, how to combine with the previous value when accumulating)
    "sum": (np.sum, np.add),
    "max": (np.max, np.maximum),
    "min": (np.min, np.minimum),
    "prod": (np.prod, np.multiply),
}


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """Computed values (fp32, int64 or bool) in the scratchpad representation of ``dtype``."""
    if dtype == "dlfloat16":
        return from_float32(np.asarray(values, dtype=np.float32))
    if dtype == "float32":
        return np.asarray(values, dtype=np.float32)
    if dtype == "bool":
        return np.asarray(values) != 0
    values = np.asarray(values)
    if values.dtype.kind == "f":
        # Float to integer truncates toward zero, like torch's .to(int).
        with np.errstate(invalid="ignore"):
            return np.trunc(values).astype(NP_DTYPES[dtype])
    return values.astype(NP_DTYPES[dtype])


# ---------------------------------------------------------------------------------------------
# The execution
# ---------------------------------------------------------------------------------------------
class _Execution:
    def __init__(self, card: Any, program: Program, dma_addresses: dict[int, np.ndarray]):
        self.card = card
        self.program = program
        self.config = card.config
        self.limit = self.config.scratchpad_plannable_bytes
        self.stats = ExecutionStats()
        self.pads = _scratchpads(card)
        n = self.config.num_cores
        self.cores: dict[int, _Core] = {}
        for c, instrs in sorted(program.cores.items()):
            if not 0 <= c < n:
                raise ExecutionError(f"core id {c} is outside this card's cores 0..{n - 1}")
            addrs = np.asarray(dma_addresses.get(c, np.zeros(0, dtype=np.int64)), dtype=np.int64)
            if any(dram_addr(i) is not None for i in instrs) and len(addrs) != len(instrs):
                raise ExecutionError(
                    f"dma_addresses[{c}] has {len(addrs)} entries but core {c} has {len(instrs)} instructions; "
                    "give one device address per instruction (see resolve_addresses)"
                )
            vc = np.zeros(n, dtype=np.int64)
            vc[c] = 1  # epoch 0 means "nothing yet": what another core knows of this one before any sync
            touched = np.zeros(-(-self.config.scratchpad_bytes // STICK_BYTES), dtype=np.int64)
            self.cores[c] = _Core(c, instrs, addrs, *self.pads.get(c), vc=vc, touched=touched)
        self.active = [c for c, st in self.cores.items() if st.instrs]
        self.signals: dict[tuple[int, int, int], deque] = defaultdict(deque)  # (src, dst, tag)
        self.ring: dict[tuple[int, int, int], deque] = defaultdict(deque)  # (src, dst, tag)
        self.in_flight: dict[int, list[_InFlight]] = defaultdict(list)  # dst core -> transfers
        self.barriers: dict[tuple, dict[str, Any]] = {}
        self.segments: list[tuple[int, int, np.ndarray]] = []  # (core, epoch, vector clock)
        self.accesses: list[_Access] = []

    # --- scheduling ------------------------------------------------------------------------------
    def run(self) -> ExecutionStats:
        while True:
            progressed = False
            for c in self.active:
                progressed |= self._run_core(self.cores[c])
            pending = [c for c in self.active if not self.cores[c].done]
            if not pending:
                break
            if not progressed:
                self._deadlock(pending)
        self._check_leftovers()
        self._check_races()
        return self.stats

    def _run_core(self, st: _Core) -> bool:
        """Run ``st`` until it blocks or ends; True if it executed anything."""
        progressed = False
        while not st.done:
            ins = st.instrs[st.pc]
            try:
                ran = self._step(st, ins)
            except ExecutionError:
                raise
            except ProgramError as e:
                raise ExecutionError(str(e), st.id, st.pc, ins) from None
            if not ran:
                return progressed
            self.stats.count(st.id, ins.ENGINE)
            st.pc += 1
            progressed = True
        return progressed

    def _step(self, st: _Core, ins: Instruction) -> bool:
        handler = self._HANDLERS.get(type(ins))
        if handler is None:
            raise ExecutionError(f"unknown instruction type {type(ins).__name__}", st.id, st.pc, ins)
        return handler(self, st, ins)

    def _fail(self, st: _Core, message: str) -> ExecutionError:
        return ExecutionError(message, st.id, st.pc, st.instrs[st.pc])

    def _deadlock(self, pending: list[int]) -> None:
        parts = []
        for c in pending:
            st = self.cores[c]
            ins = st.instrs[st.pc]
            parts.append(f"core {c} at instruction {st.pc} ({_waiting_for(ins)})")
        first = self.cores[pending[0]]
        raise ExecutionError(
            "deadlock: every unfinished core is blocked: " + "; ".join(parts)
            + ". Check that each wait/ring_recv has a matching signal/ring_send that is not itself "
            "behind a blocked instruction, and that barrier groups agree.",
            first.id, first.pc, first.instrs[first.pc],
        )

    def _check_leftovers(self) -> None:
        for (src, dst, tag), q in self.ring.items():
            if q:
                t = q[0]
                raise ExecutionError(f"ring data sent to core {dst} with tag {tag} was never received "
                                     f"(add a ring_recv <- core {src} tag={tag} on core {dst})",
                                     src, t.src_index, self.cores[src].instrs[t.src_index])
        for (src, dst, tag), q in self.signals.items():
            if q:
                idx = q[0][1]
                raise ExecutionError(f"signal to core {dst} tag {tag} was never waited for "
                                     f"(add a wait <- core {src} tag={tag} on core {dst})",
                                     src, idx, self.cores[src].instrs[idx])

    # --- scratchpad access -----------------------------------------------------------------------
    def _check_span(self, st: _Core, lo: int, hi: int, what: str) -> None:
        if lo < 0 or hi > self.limit:
            raise self._fail(st, f"{what} touches scratchpad bytes [{lo}, {hi}) outside the plannable "
                                 f"scratchpad [0, {self.limit}): the plan needs {hi} bytes")

    def _view(self, st: _Core, t: SpTensor, what: str) -> np.ndarray:
        """A numpy view of scratchpad tensor ``t`` (no copy)."""
        if t.dtype not in NP_DTYPES:
            raise self._fail(st, f"{what} has unknown dtype {t.dtype!r}")
        lo, hi = t.byte_span()
        self._check_span(st, lo, hi, what)
        self._touch(st, lo, hi)
        isz = t.itemsize
        return np.ndarray(t.shape, NP_DTYPES[t.dtype], buffer=st.sp, offset=t.offset,
                          strides=tuple(s * isz for s in t.strides))

    def _touch(self, st: _Core, lo: int, hi: int) -> None:
        """Note that ``st`` accesses scratchpad bytes [lo, hi) now, for the ring's overwrite check."""
        st.touched[lo // STICK_BYTES: -(-hi // STICK_BYTES)] = st.vc[st.id]

    def _mask_view(self, st: _Core, t: SpTensor) -> np.ndarray:
        isz = t.itemsize
        return np.ndarray((*t.shape, isz), np.bool_, buffer=st.written, offset=t.offset,
                          strides=(*(s * isz for s in t.strides), 1))

    def _require_written(self, st: _Core, mask: np.ndarray, base: int, what: str) -> None:
        if mask.all():
            return
        # Find the first missing byte to say exactly where: the mask view's byte offsets.
        missing = np.argwhere(~mask)[0]
        offset = base + int(sum(int(i) * s for i, s in zip(missing, mask.strides)))
        note = ""
        for t in self.in_flight.get(st.id, []):
            if t.dst_offset <= offset < t.dst_offset + t.nbytes:
                note = (f"; it is in flight from core {t.src_core}'s ring_send (instruction {t.src_index}): "
                        f"ring_recv it before reading")
                break
        raise self._fail(st, f"{what} reads scratchpad byte {offset} ({offset:#x}), which nothing wrote in "
                             f"this execution{note}. Load or compute it first.")

    def _read(self, st: _Core, t: SpTensor, what: str) -> np.ndarray:
        """The values of ``t`` for computing: fp32 for floats, int64 for integers, bool for bool."""
        view = self._view(st, t, what)
        self._require_written(st, self._mask_view(st, t), t.offset, what)
        if t.dtype == "dlfloat16":
            return to_float32(view)
        if t.dtype == "float32" or t.dtype == "bool":
            return np.array(view)
        return view.astype(np.int64)

    def _write(self, st: _Core, t: SpTensor, values: np.ndarray, what: str = "out") -> None:
        view = self._view(st, t, what)
        encoded = _encode(values, t.dtype)
        view[...] = np.broadcast_to(encoded, view.shape)
        self._mark_written(st, self._mask_view(st, t), t.byte_span()[1])

    def _mark_written(self, st: _Core, mask: np.ndarray, hi: int) -> None:
        mask[...] = True
        if hi > self.pads.dirty_hi[st.id]:
            self.pads.dirty_hi[st.id] = hi

    def _sp_sticks(self, st: _Core, offset: int, pattern: DmaPattern, mask: bool = False) -> np.ndarray:
        """The scratchpad side of a DMA as a (*shape, 128) byte view (of the data or the mask)."""
        lo, hi = pattern.span(pattern.sp_strides)
        self._check_span(st, offset + lo, offset + hi, "the DMA's scratchpad side")
        if not mask:
            self._touch(st, offset + lo, offset + hi)
        buf = st.written if mask else st.sp
        return np.ndarray((*pattern.shape, STICK_BYTES), buf.dtype, buffer=buf, offset=offset,
                          strides=(*pattern.sp_strides, 1))

    # --- device memory ---------------------------------------------------------------------------
    def _device_buffer(self, st: _Core, address: int, lo: int, hi: int) -> tuple[np.ndarray, int]:
        """The allocation buffer holding device bytes [address+lo, address+hi), and address's offset in it."""
        ins = st.instrs[st.pc]
        if (address + lo) % STICK_BYTES:
            raise self._fail(st, f"device address {address + lo:#x} is not {STICK_BYTES}-byte aligned")
        try:
            alloc, off = self.card.memory.find(address + lo)
        except InvalidAddressError as e:
            raise self._fail(st, f"{e}; was operand %{dram_addr(ins).operand} bound to a live tensor?") from None
        if address + hi > alloc.end:
            raise self._fail(st, f"device range [{address + lo:#x}, {address + hi:#x}) runs past the end of its "
                                 f"allocation [{alloc.address:#x}, {alloc.end:#x}); the operand is too small "
                                 "for this transfer")
        return alloc.buffer, off - lo

    def _dram_sticks(self, st: _Core, address: int, pattern: DmaPattern) -> tuple[np.ndarray, np.ndarray]:
        """The device side of a DMA as a (*shape, 128) byte view, and its stick numbers."""
        lo, hi = pattern.span(pattern.dram_strides)
        buf, off = self._device_buffer(st, address, lo, hi)
        view = np.ndarray((*pattern.shape, STICK_BYTES), np.uint8, buffer=buf, offset=off,
                          strides=(*pattern.dram_strides, 1))
        sticks = np.full(pattern.shape, address // STICK_BYTES, dtype=np.int64)
        for d, stride in enumerate(pattern.dram_strides):
            shape = [1] * len(pattern.shape)
            shape[d] = pattern.shape[d]
            sticks += (np.arange(pattern.shape[d], dtype=np.int64) * (stride // STICK_BYTES)).reshape(shape)
        return view, sticks.reshape(-1)

    def _record(self, st: _Core, sticks: np.ndarray, write: bool) -> None:
        if st.segment is None:
            st.segment = len(self.segments)
            self.segments.append((st.id, int(st.vc[st.id]), st.vc.copy()))
        self.accesses.append(_Access(st.id, st.pc, st.segment, write, sticks))

    # --- DMA -------------------------------------------------------------------------------------
    def _dma_load(self, st: _Core, ins: DmaLoad) -> bool:
        if ins.pattern.sticks:
            dram, sticks = self._dram_sticks(st, int(st.addrs[st.pc]), ins.pattern)
            self._sp_sticks(st, ins.sp_offset, ins.pattern)[...] = dram
            hi = ins.sp_offset + ins.pattern.span(ins.pattern.sp_strides)[1]
            self._mark_written(st, self._sp_sticks(st, ins.sp_offset, ins.pattern, mask=True), hi)
            self._record(st, sticks, write=False)
        self.stats._add(self.stats.dma_read_bytes, st.id, ins.pattern.nbytes)
        return True

    def _dma_store(self, st: _Core, ins: DmaStore) -> bool:
        if ins.pattern.sticks:
            src = self._sp_sticks(st, ins.sp_offset, ins.pattern)
            mask = self._sp_sticks(st, ins.sp_offset, ins.pattern, mask=True)
            if not mask.all():
                self._require_written(st, mask, ins.sp_offset, "dma_store")
            dram, sticks = self._dram_sticks(st, int(st.addrs[st.pc]), ins.pattern)
            dram[...] = src
            self._record(st, sticks, write=True)
        self.stats._add(self.stats.dma_write_bytes, st.id, ins.pattern.nbytes)
        return True

    def _gather_origin(self) -> str:
        """Which tensors a gather reads, when the compiler recorded it (program.metadata["gather"])."""
        g = self.program.metadata.get("gather")
        if not isinstance(g, dict) or "index_operand" not in g:
            return ""
        return (f"; the index tensor is %{g['index_operand']}, whose values must be valid rows of "
                f"%{g.get('source_operand', '?')} along dim {g.get('dim', 0)}")

    def _dma_gather(self, st: _Core, ins: DmaGather) -> bool:
        index = self._read(st, ins.index, "index").reshape(-1)
        if index.dtype.kind != "i":
            raise self._fail(st, f"gather index must be an integer tensor, got {ins.index.dtype}")
        bad = np.flatnonzero((index < 0) | (index >= ins.num_rows))
        if bad.size:
            raise self._fail(st, f"gather index {int(index[bad[0]])} at position {int(bad[0])} is outside "
                                 f"[0, {ins.num_rows}) ({bad.size} indices out of range){self._gather_origin()}")
        row_bytes = ins.row_sticks * STICK_BYTES
        n = index.size
        self._check_span(st, ins.sp_offset, ins.sp_offset + n * row_bytes, "the gather destination")
        self._touch(st, ins.sp_offset, ins.sp_offset + n * row_bytes)
        if n:
            address = int(st.addrs[st.pc])
            rows_hi = (ins.num_rows - 1) * ins.row_stride + row_bytes if ins.num_rows else 0
            buf, off = self._device_buffer(st, address, 0, max(rows_hi, row_bytes))
            rows = np.ndarray((max(ins.num_rows, 1), row_bytes), np.uint8, buffer=buf, offset=off,
                              strides=(ins.row_stride, 1))
            st.sp[ins.sp_offset: ins.sp_offset + n * row_bytes] = rows[index].reshape(-1)
            mask = st.written[ins.sp_offset: ins.sp_offset + n * row_bytes]
            self._mark_written(st, mask, ins.sp_offset + n * row_bytes)
            first = (address + index * ins.row_stride) // STICK_BYTES
            sticks = (first[:, None] + np.arange(ins.row_sticks, dtype=np.int64)[None, :]).reshape(-1)
            self._record(st, sticks, write=False)
        self.stats._add(self.stats.dma_read_bytes, st.id, n * row_bytes)
        return True

    # --- compute ---------------------------------------------------------------------------------
    def _matmul(self, st: _Core, ins: MatMul) -> bool:
        a = self._read(st, ins.a, "a")
        b = self._read(st, ins.b, "b")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or ins.out.shape != (a.shape[0], b.shape[1]):
            raise self._fail(st, f"matmul shapes do not agree: out{list(ins.out.shape)} = "
                                 f"a{list(a.shape)} @ b{list(b.shape)}")
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            # The PE arrays accumulate in fp32: an fp32 GEMM over the decoded values.
            result = np.matmul(a.astype(np.float32, copy=False), b.astype(np.float32, copy=False))
        else:
            result = np.matmul(a.astype(np.int64, copy=False), b.astype(np.int64, copy=False))
        if ins.accumulate:
            result = result + self._read(st, ins.out, "out (accumulate)")
        self._write(st, ins.out, result)
        return True

    def _elementwise(self, st: _Core, ins: Elementwise) -> bool:
        op = ins.op
        arity = 1 if op in UNARY_OPS else 2 if op in BINARY_OPS else 3 if op in TERNARY_OPS else None
        if arity is None:
            raise self._fail(st, f"unknown elementwise op {op!r}")
        if len(ins.inputs) != arity:
            raise self._fail(st, f"{op} takes {arity} input(s), got {len(ins.inputs)}")
        if op == "copy" and all(isinstance(x, SpTensor) for x in ins.inputs) and ins.inputs[0].dtype == ins.out.dtype:
            # A copy moves bits (keeps NaN payloads, int64 exactly).
            src = ins.inputs[0]
            bits = np.array(self._view(st, src, "input 0"))
            self._require_written(st, self._mask_view(st, src), src.offset, "input 0")
            view = self._view(st, ins.out, "out")
            view[...] = np.broadcast_to(bits, view.shape)
            self._mark_written(st, self._mask_view(st, ins.out), ins.out.byte_span()[1])
            return True
        values = [self._operand_value(st, x, k) for k, x in enumerate(ins.inputs)]
        values = _promote(op, values)
        with np.errstate(all="ignore"):
            result = self._apply(st, op, values)
        self._write(st, ins.out, np.broadcast_to(result, ins.out.shape))
        return True

    def _operand_value(self, st: _Core, x: SpTensor | Scalar, k: int) -> np.ndarray:
        if isinstance(x, Scalar):
            # Like a Python scalar in torch: an int keeps integer math, a float makes it fp32.
            if isinstance(x.value, (bool, int, np.integer)):
                return np.array(int(x.value), dtype=np.int64)
            return np.array(x.value, dtype=np.float32)
        if x.shape != st.instrs[st.pc].out.shape:
            raise self._fail(st, f"input {k} has shape {list(x.shape)} but out has {list(st.instrs[st.pc].out.shape)}; "
                                 "broadcast with stride-0 views of out's shape")
        return self._read(st, x, f"input {k}")

    def _apply(self, st: _Core, op: str, values: list[np.ndarray]) -> np.ndarray:
        if op in _UNARY:
            return _UNARY[op](values[0])
        if op in _BINARY:
            a, b = values
            if a.dtype.kind in "iub" and b.dtype.kind in "iub":
                if op in ("remainder", "floordiv") and np.any(b == 0):
                    raise self._fail(st, f"integer {op} by zero")
                if op == "pow" and np.any(b < 0):
                    raise self._fail(st, "integers to negative integer powers are not allowed (cast to float first)")
            return _BINARY[op](a, b)
        return _TERNARY[op](*values)

    def _reduce(self, st: _Core, ins: Reduce) -> bool:
        if ins.op not in REDUCE_OPS:
            raise self._fail(st, f"unknown reduce op {ins.op!r}")
        x = self._read(st, ins.inp, "inp")
        if not 0 <= ins.axis < x.ndim:
            raise self._fail(st, f"reduce axis {ins.axis} is out of range for a {x.ndim}-d input")
        if x.dtype == np.bool_:
            x = x.astype(np.int64)
        reduce, combine = _REDUCE[ins.op]
        with np.errstate(all="ignore"):
            result = reduce(x, axis=ins.axis, keepdims=True)  # fp32 stays fp32: fp32 accumulation
            if ins.accumulate:
                result = combine(self._read(st, ins.out, "out (accumulate)"), result)
        if result.shape != ins.out.shape:
            raise self._fail(st, f"reduce out has shape {list(ins.out.shape)}, expected {list(result.shape)}")
        self._write(st, ins.out, result)
        return True

    # --- ring ------------------------------------------------------------------------------------
    def _ring_send(self, st: _Core, ins: RingSend) -> bool:
        if ins.dst_core not in self.cores or ins.dst_core == st.id:
            raise self._fail(st, f"ring destination core {ins.dst_core} is not another core of this program")
        self._check_span(st, ins.src_offset, ins.src_offset + ins.nbytes, "the ring source")
        self._check_span(st, ins.dst_offset, ins.dst_offset + ins.nbytes, "the ring destination")
        src = slice(ins.src_offset, ins.src_offset + ins.nbytes)
        dst = slice(ins.dst_offset, ins.dst_offset + ins.nbytes)
        self._require_written(st, st.written[src], ins.src_offset, "ring_send")
        self._touch(st, src.start, src.stop)
        for t in self.in_flight[ins.dst_core]:
            if t.dst_offset < dst.stop and dst.start < t.dst_offset + t.nbytes:
                raise self._fail(st, f"destination bytes [{dst.start}, {dst.stop}) of core {ins.dst_core} overlap a "
                                     f"transfer still in flight from core {t.src_core} (instruction {t.src_index}); "
                                     "the receiver must ring_recv it first")
        target = self.cores[ins.dst_core]
        self._check_overwrite(st, target, dst)
        target.sp[dst] = st.sp[src]
        # Until the receiver's ring_recv, the bytes are in flight: not readable there.
        target.written[dst] = False
        transfer = _InFlight(st.id, st.pc, ins.dst_offset, ins.nbytes, st.release())
        self.in_flight[ins.dst_core].append(transfer)
        self.ring[(st.id, ins.dst_core, ins.tag)].append(transfer)
        self.stats._add(self.stats.ring_bytes, st.id, ins.nbytes)
        return True

    def _check_overwrite(self, st: _Core, target: _Core, dst: slice) -> None:
        """The receiver's earlier uses of the destination bytes must happen before this send lands, or
        the data could arrive while the receiver still reads or writes them (whatever order this
        simulation happened to run the cores in)."""
        sticks = target.touched[dst.start // STICK_BYTES: -(-dst.stop // STICK_BYTES)]
        last = int(sticks.max()) if sticks.size else 0
        if last > st.vc[target.id]:
            raise self._fail(st, f"core {target.id} uses scratchpad bytes [{dst.start}, {dst.stop}) with nothing "
                                 f"ordering that before this ring_send overwrites them; have core {target.id} "
                                 "signal this core when the buffer is free, and wait for that before sending")

    def _ring_recv(self, st: _Core, ins: RingRecv) -> bool:
        q = self.ring.get((ins.src_core, st.id, ins.tag))
        if not q:
            return False
        t = q.popleft()
        dst = slice(t.dst_offset, t.dst_offset + t.nbytes)
        if st.written[dst].any():
            raise self._fail(st, f"this core wrote scratchpad bytes [{dst.start}, {dst.stop}) while core "
                                 f"{t.src_core}'s ring_send (instruction {t.src_index}) was in flight into them")
        self.in_flight[st.id].remove(t)
        self._mark_written(st, st.written[dst], dst.stop)
        st.acquire(t.vc)
        return True

    # --- synchronization -------------------------------------------------------------------------
    def _signal(self, st: _Core, ins: Signal) -> bool:
        if ins.dst_core not in self.cores or ins.dst_core == st.id:
            raise self._fail(st, f"signal destination core {ins.dst_core} is not another core of this program")
        self.signals[(st.id, ins.dst_core, ins.tag)].append((st.release(), st.pc))
        return True

    def _wait(self, st: _Core, ins: Wait) -> bool:
        q = self.signals.get((ins.src_core, st.id, ins.tag))
        if not q:
            return False
        vc, _ = q.popleft()
        st.acquire(vc)
        return True

    def _barrier(self, st: _Core, ins: Barrier) -> bool:
        group = tuple(self.active) if ins.cores is None else ins.cores
        if st.id not in group:
            raise self._fail(st, f"core {st.id} is not in the barrier's core set {list(group)}")
        if st.barrier_key is None:
            key = (ins.tag, group, st.barrier_count[ins.tag])
            inst = self.barriers.setdefault(key, {"arrived": {}, "vc": None})
            inst["arrived"][st.id] = st.vc.copy()
            st.barrier_key = key
            if len(inst["arrived"]) == len(group):
                inst["vc"] = np.max(np.stack(list(inst["arrived"].values())), axis=0)
        inst = self.barriers[st.barrier_key]
        if inst["vc"] is None:
            return False
        st.acquire(inst["vc"])
        st.release()
        st.barrier_count[ins.tag] += 1
        st.barrier_key = None
        return True

    _HANDLERS: dict[type, Callable[..., bool]] = {
        DmaLoad: _dma_load,
        DmaStore: _dma_store,
        DmaGather: _dma_gather,
        MatMul: _matmul,
        Elementwise: _elementwise,
        Reduce: _reduce,
        RingSend: _ring_send,
        RingRecv: _ring_recv,
        Signal: _signal,
        Wait: _wait,
        Barrier: _barrier,
    }

    # --- races on device memory ------------------------------------------------------------------
    def _check_races(self) -> None:
        """Two cores touching one device stick, one of them writing, with neither access ordered
        before the other by the vector clocks."""
        acc = self.accesses
        if len({a.core for a in acc}) < 2 or not any(a.write for a in acc):
            return
        unordered = [(x, y) for x, y in _conflict_candidates(acc)
                     if not (self._ordered(acc[x], acc[y]) or self._ordered(acc[y], acc[x]))]
        if unordered:
            # Report the race whose earliest instruction comes first, so the message is deterministic.
            x, y = min(unordered, key=lambda p: min((acc[p[0]].core, acc[p[0]].index), (acc[p[1]].core, acc[p[1]].index)))
            self._race(acc[x], acc[y])

    def _ordered(self, a: _Access, b: _Access) -> bool:
        """Does access a happen before access b?"""
        core_a, epoch_a, _ = self.segments[a.segment]
        return epoch_a <= self.segments[b.segment][2][core_a]

    def _race(self, a: _Access, b: _Access) -> None:
        if (b.core, b.index) < (a.core, a.index):
            a, b = b, a
        shared = np.intersect1d(a.sticks, b.sticks)
        ia, ib = self.cores[a.core].instrs[a.index], self.cores[b.core].instrs[b.index]
        kinds = {True: "writes", False: "reads"}
        raise ExecutionError(
            f"data race on device memory: this instruction {kinds[a.write]} and core {b.core}, instruction "
            f"{b.index} ({_short(ib)}) {kinds[b.write]} the same {shared.size} stick(s) starting at device "
            f"address {int(shared[0]) * STICK_BYTES:#x} of operand %{dram_addr(ia).operand}, with nothing "
            "ordering them. Order the cores with signal/wait, a barrier or the ring, or give each core its own bytes.",
            a.core, a.index, ia,
        )


def _concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop."""
    return np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths) + np.repeat(starts, lengths)


def _near_writes(acc: list[_Access]) -> np.ndarray:
    """Indices of the accesses whose stick range overlaps some write's stick range: a cheap filter
    that drops, e.g., every read of a matmul's inputs before the exact per-stick check."""
    spans = np.array([(a.sticks.min(), a.sticks.max()) if a.sticks.size else (1, 0) for a in acc], dtype=np.int64)
    writes = spans[[a.write for a in acc]]
    if len(acc) * len(writes) > 10_000_000:  # too many to compare pairwise: keep everything
        return np.arange(len(acc), dtype=np.int64)
    overlap = (writes[None, :, 0] <= spans[:, None, 1]) & (writes[None, :, 1] >= spans[:, None, 0])
    return np.flatnonzero(overlap.any(axis=1)).astype(np.int64)


def _conflict_candidates(acc: list[_Access]) -> list[tuple[int, int]]:
    """Pairs of accesses (by index in ``acc``) from different cores that share a device stick, the
    first one writing. One sort over all sticks: correct programs, whose cores write disjoint sticks,
    cost no pairwise work at all."""
    candidates = _near_writes(acc)
    sizes = np.array([acc[i].sticks.size for i in candidates], dtype=np.int64)
    sticks = np.concatenate([acc[i].sticks for i in candidates])
    ids = np.repeat(candidates, sizes)
    order = np.lexsort((ids, sticks))
    sticks, ids = sticks[order], ids[order]
    keep = np.r_[True, (sticks[1:] != sticks[:-1]) | (ids[1:] != ids[:-1])]  # one entry per (stick, access)
    sticks, ids = sticks[keep], ids[keep]
    core = np.array([a.core for a in acc], dtype=np.int64)[ids]
    write = np.array([a.write for a in acc], dtype=np.bool_)[ids]
    # Group entries by stick; keep the groups with several cores and at least one write.
    starts = np.flatnonzero(np.r_[True, sticks[1:] != sticks[:-1]])
    lengths = np.diff(np.r_[starts, sticks.size])
    several = np.minimum.reduceat(core, starts) != np.maximum.reduceat(core, starts)
    suspicious = several & np.logical_or.reduceat(write, starts)
    if not suspicious.any():
        return []
    g_start, g_len = starts[suspicious], lengths[suspicious]
    entries = _concat_ranges(g_start, g_len)
    group = np.repeat(np.arange(g_start.size), g_len)
    is_writer = write[entries]
    writers, w_group = entries[is_writer], group[is_writer]
    # Pair every writer with every entry of its group, then keep the cross-core pairs.
    first = np.repeat(writers, g_len[w_group])
    second = _concat_ranges(g_start[w_group], g_len[w_group])
    cross = core[first] != core[second]
    pairs = np.unique(np.stack([ids[first[cross]], ids[second[cross]]], axis=1), axis=0)
    return [tuple(p) for p in pairs.tolist()]


def _promote(op: str, values: list[np.ndarray]) -> list[np.ndarray]:
    """Bring inputs to one computation type: fp32 if any is floating point (or the op always gives a
    float), else int64. ``where``'s condition keeps its own type."""
    typed = values[1:] if op == "where" else values
    is_float = op in FLOAT_RESULT_OPS or any(v.dtype.kind == "f" for v in typed)
    target = np.float32 if is_float else np.int64
    if op == "cast":
        return values
    if op == "where":
        return [values[0]] + [np.asarray(v, dtype=target) for v in typed]
    return [np.asarray(v, dtype=target) for v in values]


def _short(ins: Instruction) -> str:
    from ..program import format_instruction

    return " ".join(format_instruction(ins).split())


def _waiting_for(ins: Instruction) -> str:
    if isinstance(ins, Wait):
        return f"waits for a signal from core {ins.src_core} tag {ins.tag}"
    if isinstance(ins, RingRecv):
        return f"waits for ring data from core {ins.src_core} tag {ins.tag}"
    if isinstance(ins, Barrier):
        return f"waits at barrier tag {ins.tag} for cores {'all' if ins.cores is None else list(ins.cores)}"
    return _short(ins)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
_POOL_CONTROLLER: Any = None


def _single_threaded_pools() -> contextlib.AbstractContextManager:
    """Run BLAS and OpenMP (torch's CPU kernels) on one thread while executing. Each core's tiles are
    small, and thread pools on a busy machine spin against other processes: measured 20x slower for
    the 1024^3 program's 32 GEMMs (250 ms instead of 12 ms, 2 cores shared) and 400x for torch's gelu
    on a 128x64 tile. Uses threadpoolctl when installed, else leaves the pools as they are."""
    global _POOL_CONTROLLER
    if _POOL_CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _POOL_CONTROLLER = False
        else:
            _POOL_CONTROLLER = ThreadpoolController()
    if _POOL_CONTROLLER is False:
        return contextlib.nullcontext()
    return _POOL_CONTROLLER.limit(limits=1)


def execute(card: Any, program: Program, dma_addresses: dict[int, np.ndarray]) -> ExecutionStats:
    """Run ``program`` on ``card``. ``dma_addresses[core][i]`` is the absolute device address of
    instruction i's DRAM side (ignored for non-DMA instructions). Raises :class:`ExecutionError`."""
    pads = _scratchpads(card)
    with pads.lock, _single_threaded_pools():  # one execution at a time per card: they share the scratchpads
        return _Execution(card, program, dma_addresses).run()

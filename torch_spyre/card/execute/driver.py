"""The driver: one execution of a program, running each core's instruction stream in turn, each until it
blocks on Wait/RingRecv/Barrier, round-robin; then the end-of-run checks (leftover transfers, scratchpad
and device memory races)."""

from __future__ import annotations

import contextlib
from collections import defaultdict, deque
from typing import Any, Callable

import numpy as np

from ...program import (
    Barrier,
    DmaGather,
    DmaLoad,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Program,
    ProgramError,
    Reduce,
    RingRecv,
    RingSend,
    Signal,
    Wait,
    dram_addr,
    format_cores,
)
from .access import ScratchpadAccess
from .compute import ComputeUnits
from .dma import DmaEngine
from .races import RaceCheck
from .scratchpad_races import ScratchpadRaceCheck
from .ring import RingAndSync
from .state import CoreState, DeviceAccess, ExecutionError, InFlight, Received, scratchpads, short
from .stats import ExecutionStats


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


class Execution(ScratchpadAccess, DmaEngine, ComputeUnits, RingAndSync, ScratchpadRaceCheck, RaceCheck):
    """One run of ``program`` on ``card``: the state every engine's handler reads and writes."""

    def __init__(self, card: Any, program: Program, dma_addresses: dict[int, np.ndarray]):
        self.card = card
        self.program = program
        self.config = card.config
        self.limit = self.config.scratchpad_plannable_bytes
        self.stats = ExecutionStats()
        self.pads = scratchpads(card)
        n = self.config.num_cores
        self.cores: dict[int, CoreState] = {}
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
            self.cores[c] = CoreState(c, instrs, addrs, *self.pads.get(c), vc=vc)
        self.active = [c for c, st in self.cores.items() if st.instrs]
        self.signals: dict[tuple[int, int, int], deque] = defaultdict(deque)  # (src, dst, tag)
        self.ring: dict[tuple[int, int, int], deque] = defaultdict(deque)  # (src, dst, tag)
        self.in_flight: dict[int, list[InFlight]] = defaultdict(list)  # dst core -> transfers
        self.barriers: dict[tuple, dict[str, Any]] = {}
        self.segments: list[tuple[int, int, np.ndarray]] = []  # (core, epoch, vector clock)
        self.accesses: list[DeviceAccess] = []
        self.received: list[Received] = []  # completed ring transfers, for the scratchpad race check

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
        self._check_scratchpad_races()
        self._check_races()
        return self.stats

    def _run_core(self, st: CoreState) -> bool:
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

    def _step(self, st: CoreState, ins: Instruction) -> bool:
        handler = self._HANDLERS.get(type(ins))
        if handler is None:
            raise ExecutionError(f"unknown instruction type {type(ins).__name__}", st.id, st.pc, ins)
        return handler(self, st, ins)

    # Each instruction type to its engine's handler: True when it ran, False while its core is blocked.
    _HANDLERS: dict[type, Callable[..., bool]] = {
        DmaLoad: DmaEngine._dma_load,
        DmaStore: DmaEngine._dma_store,
        DmaGather: DmaEngine._dma_gather,
        MatMul: ComputeUnits._matmul,
        Elementwise: ComputeUnits._elementwise,
        Reduce: ComputeUnits._reduce,
        RingSend: RingAndSync._ring_send,
        RingRecv: RingAndSync._ring_recv,
        Signal: RingAndSync._signal,
        Wait: RingAndSync._wait,
        Barrier: RingAndSync._barrier,
    }

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


def _waiting_for(ins: Instruction) -> str:
    if isinstance(ins, Wait):
        return f"waits for a signal from core {ins.src_core} tag {ins.tag}"
    if isinstance(ins, RingRecv):
        return f"waits for ring data from core {ins.src_core} tag {ins.tag}"
    if isinstance(ins, Barrier):
        return f"waits at barrier tag {ins.tag} for cores {format_cores(ins.cores)}"
    return short(ins)


_POOL_CONTROLLER: Any = None


def single_threaded_pools() -> contextlib.AbstractContextManager:
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
    pads = scratchpads(card)
    with pads.lock, single_threaded_pools():  # one execution at a time per card: they share the scratchpads
        return Execution(card, program, dma_addresses).run()

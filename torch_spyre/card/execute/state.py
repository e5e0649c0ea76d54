"""The executor's state: its error, each core's registers and clocks, the records the checks keep, and
the scratchpads, which persist per card across executions."""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...program import Instruction, ProgramError, format_instruction


class ExecutionError(ProgramError):
    """A program that went wrong while running (the message names the core and the instruction)."""


def short(ins: Instruction) -> str:
    """An instruction's text on one line with single spaces, for quoting inside a message."""
    return " ".join(format_instruction(ins).split())


def ring_race_fix(receiver: int, sender: str, first: str | None = None, live_from: int | None = None) -> str:
    """The generator's two ways out of a race on a ring transfer's destination bytes in core ``receiver``'s
    scratchpad: bytes of their own, or an order by Signal/Wait before ``sender``'s ring_send (``sender``:
    "core 2", or "the second sender" when either may be). ``first``: the transfer that the send races with,
    when two race; else the transfer races with a use of its bytes, by the buffer live from the receiver's
    instruction ``live_from`` (None: unknown) to its ring_recv."""
    if first is not None:
        bytes_ = "give the two transfers disjoint destination bytes"
        after = f"after it receives (and last reads) {first}"
    else:
        bytes_ = "give the transfer bytes of its own"
        if live_from is not None:
            bytes_ += (f" (none that a buffer live between core {receiver}'s instruction {live_from} and its "
                       "ring_recv shares)")
        after = "once done with them"
    return (f"Fix the generator: {bytes_}, or have core {receiver} signal {sender} {after}, and {sender} wait "
            "for it before its ring_send")


# Scratchpads are kept per card across executions: allocating 2 MiB x 32 per launch costs more than the
# typical kernel's work. All cores' scratchpads are rows of one block, so that the fast executor can view
# one instruction's tensor on several cores as one strided array (a core's row is ``block[core]``).
class Scratchpads:
    def __init__(self, nbytes: int, num_cores: int):
        self.nbytes = nbytes
        self.num_cores = num_cores
        self.block = np.zeros((num_cores, nbytes), dtype=np.uint8)  # pages are mapped on first touch
        self.written_block = np.zeros((num_cores, nbytes), dtype=np.bool_)  # per byte: written in this execution
        self.dirty_hi = [0] * num_cores  # written-mask bytes below this may be set
        self.lock = threading.Lock()

    def get(self, core: int) -> tuple[np.ndarray, np.ndarray]:
        """Core ``core``'s scratchpad and written-mask, the mask cleared for a new checked execution."""
        # A new execution starts with nothing written: clear only what the last one dirtied.
        self.written_block[core, : self.dirty_hi[core]] = False
        self.dirty_hi[core] = 0
        return self.block[core], self.written_block[core]


_SCRATCHPADS: "weakref.WeakKeyDictionary[Any, Scratchpads]" = weakref.WeakKeyDictionary()
_SCRATCHPADS_LOCK = threading.Lock()


def scratchpads(card: Any) -> Scratchpads:
    """The card's scratchpads (made on first use, remade if the configured size changed)."""
    with _SCRATCHPADS_LOCK:
        sp = _SCRATCHPADS.get(card)
        cfg = card.config
        if sp is None or (sp.nbytes, sp.num_cores) != (cfg.scratchpad_bytes, cfg.num_cores):
            sp = Scratchpads(cfg.scratchpad_bytes, cfg.num_cores)
            _SCRATCHPADS[card] = sp
        return sp


@dataclass
class CoreState:
    id: int
    instrs: list[Instruction]
    addrs: np.ndarray
    sp: np.ndarray
    written: np.ndarray
    vc: np.ndarray  # vector clock: vc[id] is this core's epoch (from 1), the rest what it knows of others
    # Scratchpad uses, in program order, for the scratchpad race check: (pc, lo, hi, received) per access
    # of bytes [lo, hi) by this core's instruction pc (received -1), or per ring_recv completing
    # ``Execution.received[received]`` into them.
    uses: list[tuple[int, int, int, int]] = field(default_factory=list)
    # epoch_start[e]: the first instruction of this core's epoch e (epochs count from 1; [0] is a pad).
    epoch_start: list[int] = field(default_factory=lambda: [0, 0])
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
        self.epoch_start.append(self.pc + 1)  # this instruction's own uses belong to the epoch it ends
        self.segment = None
        return snapshot

    def acquire(self, other: np.ndarray) -> None:
        np.maximum(self.vc, other, out=self.vc)
        self.segment = None


@dataclass
class DeviceAccess:
    """One DMA's device sticks, for the race check."""

    core: int
    index: int
    segment: int
    write: bool
    sticks: np.ndarray  # device stick numbers (address // 128)


@dataclass
class Received:
    """A completed ring transfer: core ``src_core``'s RingSend ``src_index`` wrote bytes [lo, hi) of core
    ``dst_core``'s scratchpad, at some moment between the send and ``dst_core``'s RingRecv ``recv_index``.
    ``known`` is the receiver's epoch the sender knew of when sending (its uses up to it happen before)."""

    src_core: int
    src_index: int
    dst_core: int
    recv_index: int
    lo: int
    hi: int
    known: int


@dataclass
class InFlight:
    """A ring transfer sent but not yet received."""

    src_core: int
    src_index: int
    dst_offset: int
    nbytes: int
    vc: np.ndarray

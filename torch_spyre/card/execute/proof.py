"""One program on one card: checked until proved, fast afterwards.

The checked executor's checks on a program do not depend on the data it moves: scratchpad bounds, reads
of unwritten bytes, deadlocks and races (in device memory and in scratchpads) follow from the instructions
alone, and from which operands share device memory (two operands bound to overlapping bytes can race where disjoint
ones cannot). So the first run of a program, which is checked, proves them for every later run whose
operands overlap in the same way; those run on the fast executor (``fast``). What does depend on data is
still checked every time: gather indices, integer division by zero. A program whose gathers read an
operand that the program also writes (through any alias) has races that depend on the indices: it is
always run checked.

``TORCH_SPYRE_CHECK=1`` runs every launch checked; ``TORCH_SPYRE_CHECK=compare`` runs every proved
launch both ways from the same memory and raises :class:`FastExecutionMismatch` if any byte differs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ...errors import SpyreError
from ...program import DmaGather, DmaStore, Program
from .driver import execute
from .fast import FastPlan
from .stats import ExecutionStats

CHECK_ENV = "TORCH_SPYRE_CHECK"
_MODES = {"": "fast", "0": "fast", "1": "checked", "compare": "compare"}


class FastExecutionMismatch(SpyreError, AssertionError):
    """The fast executor's result differs from the checked executor's (TORCH_SPYRE_CHECK=compare)."""


def check_mode() -> str:
    """How proved programs run: "fast", "checked" (TORCH_SPYRE_CHECK=1) or "compare"."""
    value = os.environ.get(CHECK_ENV, "").strip().lower()
    mode = _MODES.get(value)
    if mode is None:
        raise SpyreError(f"{CHECK_ENV}={value!r} is not understood; use 1 (check every launch), compare (run "
                         "fast and checked, compare) or 0 / unset (check the first launch of each program)")
    return mode


def overlap_signature(bases: np.ndarray, nbytes: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Which operands' device ranges overlap, as sorted (i, j) pairs of operand indices: () when none do.
    (In Python lists: a program has a handful of operands, and every launch asks.)"""
    if len(bases) < 2:
        return ()
    lo, size = bases.tolist(), nbytes.tolist()
    order = sorted(range(len(lo)), key=lo.__getitem__)  # stable, as argsort(kind="stable")
    end = lo[order[0]] + size[order[0]]
    for i in order[1:]:
        if lo[i] < end:
            break
        end = max(end, lo[i] + size[i])
    else:
        return ()
    pairs = [(min(i, j), max(i, j)) for a, i in enumerate(order) for j in order[a + 1:]
             if lo[j] < lo[i] + size[i] and lo[i] < lo[j] + size[j]]
    return tuple(sorted(pairs))


class ProvedExecutor:
    """Runs one program on one card: checked until a checked run proves it, then fast."""

    def __init__(self, program: Program, card: Any, operand_names: tuple[str, ...]):
        self.program = program
        self.card = card
        self.operand_names = operand_names
        self.proved: set[tuple] = set()  # overlap signatures a checked run has passed with
        self.stats: ExecutionStats | None = None  # what every run does (the proving run's counts)
        self.plan: FastPlan | None = None
        # For bindings where an operand the plan's matmul chains read from device memory overlaps one the
        # program stores to: the chains would read bytes a store has changed since their DMA loads.
        self.unfused_plan: FastPlan | None = None
        self._gathered = {operand_names.index(i.src.operand) for _, _, i in program.instructions()
                          if isinstance(i, DmaGather)}
        self._stored = {operand_names.index(i.dst.operand) for _, _, i in program.instructions()
                        if isinstance(i, DmaStore)}
        self._lock = threading.Lock()

    def run(self, dma_addresses: dict[int, np.ndarray], bases: np.ndarray, nbytes: np.ndarray) -> ExecutionStats:
        """Run once with operand ``i`` at device ``bases[i]`` (``nbytes[i]`` long) and every DMA's patched
        address in ``dma_addresses``. Raises ``ExecutionError``."""
        mode = check_mode()
        signature = overlap_signature(bases, nbytes)
        if mode == "checked" or signature not in self.proved or self._indices_race(signature):
            stats = execute(self.card, self.program, dma_addresses)
            self.proved.add(signature)
            self.stats = stats
            return stats
        if mode == "compare":
            return self._compare(dma_addresses, bases, nbytes, signature)
        self._run_fast(dma_addresses, signature)
        return self.stats

    def _indices_race(self, signature: tuple) -> bool:
        """Do gathers read an operand that the program writes (itself or through an overlapping one)?"""
        if not self._gathered or not self._stored:
            return False
        if self._gathered & self._stored:
            return True
        return any((i in self._gathered and j in self._stored) or (j in self._gathered and i in self._stored)
                   for i, j in signature)

    def _run_fast(self, dma_addresses: dict[int, np.ndarray], signature: tuple) -> None:
        with self._lock:
            if self.plan is None or not self.plan.valid_for(self.card):
                self.plan = FastPlan(self.program, self.card)
                self.unfused_plan = None
            plan = self.plan
            chained = plan.chain_operands
            if chained and any((i in chained and j in self._stored) or (j in chained and i in self._stored)
                               for i, j in signature):
                if self.unfused_plan is None:
                    self.unfused_plan = FastPlan(self.program, self.card, fuse=False)
                plan = self.unfused_plan
        plan.run(self.card.memory, dma_addresses)

    def _compare(self, dma_addresses: dict[int, np.ndarray], bases: np.ndarray, nbytes: np.ndarray,
                 signature: tuple) -> ExecutionStats:
        memory = self.card.memory
        regions = [(int(b), int(n)) for b, n in zip(bases, nbytes)]
        before = [memory.read(b, n).copy() for b, n in regions]
        self._run_fast(dma_addresses, signature)
        fast = [memory.read(b, n).copy() for b, n in regions]
        for (b, _), data in zip(regions, before):
            memory.write(b, data)
        stats = execute(self.card, self.program, dma_addresses)
        for name, (b, n), got in zip(self.operand_names, regions, fast):
            want = memory.read(b, n)
            if not np.array_equal(got, want):
                at = int(np.flatnonzero(got != want)[0])
                raise FastExecutionMismatch(
                    f"program {self.program.name!r}: the fast executor wrote byte {at} of operand %{name} as "
                    f"{int(got[at])}, the checked executor as {int(want[at])}. This is a bug in "
                    "torch_spyre/card/execute/fast.py; run with TORCH_SPYRE_CHECK=1 meanwhile.")
        return stats

"""Races on device memory: two cores touching one device stick, at least one writing, with neither
access ordered before the other by the vector clocks (Signal/Wait, the ring and barriers order cores).
Checked once, after the run, over every DMA's recorded sticks."""

from __future__ import annotations

import numpy as np

from ...program import STICK_BYTES, dram_addr
from .state import DeviceAccess, ExecutionError, short


class RaceCheck:
    """Mixed into the execution; reads its ``accesses``, ``segments`` and ``cores``."""

    def _check_races(self) -> None:
        """Two cores touching one device stick, one of them writing, with neither access ordered
        before the other by the vector clocks."""
        acc = self.accesses
        if len({a.core for a in acc}) < 2 or not any(a.write for a in acc):
            return
        unordered = [(x, y) for x, y in conflict_candidates(acc)
                     if not (self._ordered(acc[x], acc[y]) or self._ordered(acc[y], acc[x]))]
        if unordered:
            # Report the race whose earliest instruction comes first, so the message is deterministic.
            x, y = min(unordered, key=lambda p: min((acc[p[0]].core, acc[p[0]].index), (acc[p[1]].core, acc[p[1]].index)))
            self._race(acc[x], acc[y])

    def _ordered(self, a: DeviceAccess, b: DeviceAccess) -> bool:
        """Does access a happen before access b?"""
        core_a, epoch_a, _ = self.segments[a.segment]
        return epoch_a <= self.segments[b.segment][2][core_a]

    def _race(self, a: DeviceAccess, b: DeviceAccess) -> None:
        if (b.core, b.index) < (a.core, a.index):
            a, b = b, a
        shared = np.intersect1d(a.sticks, b.sticks)
        ia, ib = self.cores[a.core].instrs[a.index], self.cores[b.core].instrs[b.index]
        kinds = {True: "writes", False: "reads"}
        raise ExecutionError(
            f"data race on device memory: this instruction {kinds[a.write]} and core {b.core}, instruction "
            f"{b.index} ({short(ib)}) {kinds[b.write]} the same {shared.size} stick(s) starting at device "
            f"address {int(shared[0]) * STICK_BYTES:#x} of operand %{dram_addr(ia).operand}, with nothing "
            "ordering them. Order the cores with signal/wait, a barrier or the ring, or give each core its own bytes.",
            a.core, a.index, ia,
        )


def _concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop."""
    return np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths) + np.repeat(starts, lengths)


def _near_writes(acc: list[DeviceAccess]) -> np.ndarray:
    """Indices of the accesses whose stick range overlaps some write's stick range: a cheap filter
    that drops, e.g., every read of a matmul's inputs before the exact per-stick check."""
    spans = np.array([(a.sticks.min(), a.sticks.max()) if a.sticks.size else (1, 0) for a in acc], dtype=np.int64)
    writes = spans[[a.write for a in acc]]
    if len(acc) * len(writes) > 10_000_000:  # too many to compare pairwise: keep everything
        return np.arange(len(acc), dtype=np.int64)
    overlap = (writes[None, :, 0] <= spans[:, None, 1]) & (writes[None, :, 1] >= spans[:, None, 0])
    return np.flatnonzero(overlap.any(axis=1)).astype(np.int64)


def conflict_candidates(acc: list[DeviceAccess]) -> list[tuple[int, int]]:
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

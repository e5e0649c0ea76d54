"""Races in a scratchpad, from happens-before alone (not from the order the simulator ran the cores in).

A core's own instructions use its scratchpad in program order. The only other writer is the ring: a
RingSend from another core writes the destination bytes at some moment between the send and the
receiver's RingRecv, which real hardware does not pin down. So a transfer races with a receiver's use of
overlapping bytes (its own instruction, or its receive of another transfer) unless that use happens
before the send (the sender knew of it through Signal/Wait, the ring or a barrier) or comes after the
RingRecv in the receiver's program order. Since a core's epoch only grows along its program, the uses not
ordered with a transfer are exactly those from the first instruction of the first epoch the sender did
not know of, up to the RingRecv: one window per transfer, checked after the run.

A receive of another transfer counts as a use at its RingRecv: two transfers into overlapping bytes race
unless the first one's RingRecv happens before the second one's send (else they may land in either
order, and the receiver reads whichever landed last)."""

from __future__ import annotations

import numpy as np

from .races import _concat_ranges
from .state import ExecutionError, Received, ring_race_fix, short

_PAIRS = 1 << 20


class ScratchpadRaceCheck:
    """Mixed into the execution; reads its ``cores`` (each core's ``uses`` and ``epoch_start``) and
    ``received``."""

    def _check_scratchpad_races(self) -> None:
        if not self.received:
            return
        by_core: dict[int, list[int]] = {}
        for k, t in enumerate(self.received):
            by_core.setdefault(t.dst_core, []).append(k)
        for core in sorted(by_core):
            st = self.cores[core]
            uses = np.array(st.uses, dtype=np.int64).reshape(-1, 4)
            ts = [self.received[k] for k in by_core[core]]  # in the receiver's program order
            known = np.array([t.known for t in ts], dtype=np.int64)
            t_lo = np.array([t.lo for t in ts], dtype=np.int64)
            t_hi = np.array([t.hi for t in ts], dtype=np.int64)
            # Each transfer's window of uses: from the first instruction of the first epoch its sender did
            # not know of, up to (not including) its ring_recv.
            first = np.asarray(st.epoch_start, dtype=np.int64)[known + 1]
            begin = np.searchsorted(uses[:, 0], first, side="left")
            end = np.searchsorted(uses[:, 0], np.array([t.recv_index for t in ts], dtype=np.int64), side="left")
            lengths = np.maximum(end - begin, 0)
            # All windows at once, in chunks of at most _PAIRS (transfer, use) pairs to bound memory.
            before = np.cumsum(lengths) - lengths
            lo = 0
            while lo < len(ts):
                hi = max(lo + 1, int(np.searchsorted(before, before[lo] + _PAIRS, side="right")))
                n = lengths[lo:hi]
                pos = _concat_ranges(begin[lo:hi], n)
                tid = np.repeat(np.arange(lo, hi), n)
                clash = np.flatnonzero((uses[pos, 1] < t_hi[tid]) & (uses[pos, 2] > t_lo[tid]))
                if clash.size:  # the first transfer (in receive order) with a race, and its first racing use
                    pc, u_lo, u_hi, received = (int(v) for v in uses[pos[clash[0]]])
                    self._scratchpad_race(ts[int(tid[clash[0]])], pc, u_lo, u_hi, received)
                lo = hi

    def _scratchpad_race(self, t: Received, pc: int, lo: int, hi: int, received: int) -> None:
        dst = self.cores[t.dst_core]
        send = self.cores[t.src_core].instrs[t.src_index]
        ins = dst.instrs[pc]
        shared = f"[{max(lo, t.lo)}, {min(hi, t.hi)})"
        if received >= 0:
            other = self.received[received]
            what = (f"core {t.dst_core}'s ring_recv (instruction {pc}) of core {other.src_core}'s ring_send "
                    f"(instruction {other.src_index}) into bytes [{lo}, {hi})")
            why = ("that receive does not happen before this send, so the two transfers may land in either "
                   "order and the receiver may read the wrong one's bytes")
            fix = ring_race_fix(t.dst_core, f"core {t.src_core}", "that transfer")
        else:
            what = f"core {t.dst_core}'s instruction {pc} ({short(ins)}), which uses bytes [{lo}, {hi})"
            why = ("that instruction neither happens before this send nor comes after the ring_recv "
                   f"(instruction {t.recv_index}) that completes it, so the transfer may land while it "
                   "reads or writes those bytes")
            fix = ring_race_fix(t.dst_core, f"core {t.src_core}", live_from=pc)
        raise ExecutionError(
            f"scratchpad race on core {t.dst_core}: this ring_send writes its bytes [{t.lo}, {t.hi}) and "
            f"races with {what}: bytes {shared} of both, with nothing ordering them; {why}. This does not "
            f"depend on the order the simulator runs the cores in. {fix}.",
            t.src_core, t.src_index, send,
        )

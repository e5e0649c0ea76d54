"""The ring (scratchpad to scratchpad between cores) and the sync instructions (Signal/Wait, Barrier).
Each orders cores: the vector clocks travel with the data or token, and the race check reads them.

A RingSend copies its bytes into the destination scratchpad at once but marks them written only when
the receiver's RingRecv completes: until then the receiver may neither read nor write them. Whether the
receiver's other uses of those bytes are ordered against the transfer is checked after the run, from
happens-before alone (``scratchpad_races``).
A handler returns False while its core is blocked (nothing to receive, a barrier not yet full)."""

from __future__ import annotations

import numpy as np

from ...program import Barrier, RingRecv, RingSend, Signal, Wait
from .state import CoreState, InFlight, Received, ring_race_fix


class RingAndSync:
    """Mixed into the execution; uses its ``cores``, ``active``, ``signals``, ``ring``, ``in_flight``,
    ``barriers`` and ``stats``."""

    def _check_peer(self, st: CoreState, core: int, what: str) -> None:
        if core not in self.cores or core == st.id:
            raise self._fail(st, f"{what} core {core} is not another core of this program")

    def _ring_send(self, st: CoreState, ins: RingSend) -> bool:
        self._check_peer(st, ins.dst_core, "ring destination")
        self._check_span(st, ins.src_offset, ins.src_offset + ins.nbytes, "the ring source")
        self._check_span(st, ins.dst_offset, ins.dst_offset + ins.nbytes, "the ring destination")
        src = slice(ins.src_offset, ins.src_offset + ins.nbytes)
        dst = slice(ins.dst_offset, ins.dst_offset + ins.nbytes)
        self._require_written(st, st.written[src], ins.src_offset, "ring_send")
        self._touch(st, src.start, src.stop)
        for t in self.in_flight[ins.dst_core]:
            if t.dst_offset < dst.stop and dst.start < t.dst_offset + t.nbytes:
                # Its receive cannot happen before this send: a race whatever the order (see scratchpad_races).
                raise self._fail(st, f"scratchpad race on core {ins.dst_core}: this ring_send writes its bytes "
                                     f"[{dst.start}, {dst.stop}) while core {t.src_core}'s ring_send (instruction "
                                     f"{t.src_index}) into bytes [{t.dst_offset}, {t.dst_offset + t.nbytes}) is still "
                                     "in flight, so the two transfers may land in either order. "
                                     + ring_race_fix(ins.dst_core, "the second sender", "the first transfer") + ".")
        target = self.cores[ins.dst_core]
        target.sp[dst] = st.sp[src]
        # Until the receiver's ring_recv, the bytes are in flight: not readable there.
        target.written[dst] = False
        transfer = InFlight(st.id, st.pc, ins.dst_offset, ins.nbytes, st.release())
        self.in_flight[ins.dst_core].append(transfer)
        self.ring[(st.id, ins.dst_core, ins.tag)].append(transfer)
        self.stats._add(self.stats.ring_bytes, st.id, ins.nbytes)
        return True

    def _ring_recv(self, st: CoreState, ins: RingRecv) -> bool:
        q = self.ring.get((ins.src_core, st.id, ins.tag))
        if not q:
            return False
        t = q.popleft()
        dst = slice(t.dst_offset, t.dst_offset + t.nbytes)
        if st.written[dst].any():
            raise self._fail(st, f"scratchpad race on core {st.id}: this core wrote scratchpad bytes [{dst.start}, "
                                 f"{dst.stop}) while core {t.src_core}'s ring_send (instruction {t.src_index}) was in "
                                 "flight into them. " + ring_race_fix(st.id, f"core {t.src_core}") + ".")
        self.in_flight[st.id].remove(t)
        self._mark_written(st, st.written[dst], dst.stop)
        # The transfer wrote these bytes at some moment between its send and now: record it as a use here,
        # for the scratchpad race check (which orders it against this core's other uses).
        st.uses.append((st.pc, dst.start, dst.stop, len(self.received)))
        self.received.append(Received(t.src_core, t.src_index, st.id, st.pc, dst.start, dst.stop,
                                      int(t.vc[st.id])))
        st.acquire(t.vc)
        return True

    def _signal(self, st: CoreState, ins: Signal) -> bool:
        self._check_peer(st, ins.dst_core, "signal destination")
        self.signals[(st.id, ins.dst_core, ins.tag)].append((st.release(), st.pc))
        return True

    def _wait(self, st: CoreState, ins: Wait) -> bool:
        q = self.signals.get((ins.src_core, st.id, ins.tag))
        if not q:
            return False
        vc, _ = q.popleft()
        st.acquire(vc)
        return True

    def _barrier(self, st: CoreState, ins: Barrier) -> bool:
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

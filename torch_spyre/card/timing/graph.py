"""The dependency graph: every instruction a node, with the nodes that must finish before it starts
(scratchpad and device-memory hazards, in-order engine lanes, fences, and the cross-core pairs)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from ...program import (
    Barrier,
    DmaGather,
    DmaLoad,
    DmaStore,
    Instruction,
    Program,
    ProgramError,
    RingRecv,
    RingSend,
    Signal,
    Wait,
)
from .coster import Coster, Node


class _Bucket:
    """Records of one kind (reads or writes) whose lengths share a power-of-two class, sorted by start."""

    __slots__ = ("starts", "records", "longest", "shortest")

    def __init__(self, length_class: int) -> None:
        self.starts: list[int] = []
        self.records: list[tuple[int, int, int, Any]] = []  # lo, hi, node id, lane
        self.longest = 0  # the longest record ever put here: at most twice the shortest possible
        self.shortest = 1 << (length_class - 1)


class Hazards:
    """Access records of one address space (a core's scratchpad, or one device-memory operand); finds the
    RAW/WAR/WAW predecessors of a new instruction.

    Records are kept sorted by start in buckets, one per kind (read or write) and power-of-two length
    class. A record of a bucket can overlap [lo, hi) only if it starts in (lo - the bucket's longest, hi),
    and the bucket's longest is under twice its shortest, so the records a query scans either overlap it
    or end less than their own length before lo: one long record (a wide strided span) no longer widens
    the window of every other query (it did with a single list). A read scans only the writes. Records
    that can no longer matter are dropped: one fully covered by a later write (that write already depends
    on it, so whatever depends on the write is ordered after it too), and a read covered by a later read on
    the same in-order engine (which finishes after it). A write's scan drops what it covers as it goes.
    ``examined`` counts the records the scans looked at."""

    def __init__(self) -> None:
        self.reads: dict[int, _Bucket] = {}  # length class (bit length of hi - lo) -> bucket
        self.writes: dict[int, _Bucket] = {}
        self.examined = 0

    def add(self, node_id: int, lane: Any, reads: list[tuple[int, int]], writes: list[tuple[int, int]]) -> set[int]:
        preds: set[int] = set()
        if self.reads or self.writes:
            for lo, hi in reads:  # RAW: earlier writes
                self._scan(self.writes, lo, hi, preds, False)
            for lo, hi in writes:  # WAW and WAR: any earlier access; what the write covers is superseded
                self._scan(self.writes, lo, hi, preds, True)
                self._scan(self.reads, lo, hi, preds, True)
            if lane is not None:  # and so is a read covered by a read on the same in-order engine
                for lo, hi in reads:
                    self._drop_read(lane, lo, hi)
        for accesses, table in ((reads, self.reads), (writes, self.writes)):
            for lo, hi in accesses:
                if hi > lo:
                    length_class = (hi - lo).bit_length()
                    bucket = table.get(length_class)
                    if bucket is None:
                        bucket = table[length_class] = _Bucket(length_class)
                    i = bisect.bisect_right(bucket.starts, lo)
                    bucket.starts.insert(i, lo)
                    bucket.records.insert(i, (lo, hi, node_id, lane))
                    if hi - lo > bucket.longest:
                        bucket.longest = hi - lo
        preds.discard(node_id)
        return preds

    def _scan(self, table: dict[int, _Bucket], lo: int, hi: int, preds: set[int], drop: bool) -> None:
        """Add the nodes of ``table``'s records that overlap [lo, hi) to ``preds``; with ``drop``, delete
        those inside [lo, hi) (their nodes are predecessors already, so later scans need not find them)."""
        for bucket in table.values():
            starts = bucket.starts
            i = bisect.bisect_right(starts, lo - bucket.longest)
            j = bisect.bisect_left(starts, hi)  # so every record scanned starts before hi
            if i < j:
                self.examined += j - i
                doomed = []
                for n, (rlo, rhi, other, _) in enumerate(bucket.records[i:j], i):
                    if lo < rhi:
                        preds.add(other)
                        if drop and rhi <= hi and lo <= rlo:
                            doomed.append(n)
                if doomed:
                    _delete(starts, bucket.records, doomed)

    def _drop_read(self, lane: Any, lo: int, hi: int) -> None:
        """Delete the read records of ``lane`` inside [lo, hi)."""
        for bucket in self.reads.values():
            starts = bucket.starts
            # A covered record starts in [lo, hi - its length], and its length is at least the shortest.
            i = bisect.bisect_left(starts, lo)
            j = bisect.bisect_right(starts, hi - bucket.shortest)
            if i < j:
                self.examined += j - i
                records = bucket.records
                doomed = [n for n in range(i, j) if records[n][1] <= hi and records[n][3] == lane]
                if doomed:
                    _delete(starts, records, doomed)


def _delete(starts: list[int], records: list, indices: list[int]) -> None:
    """Delete the given sorted indices from both lists, a run of consecutive ones at a time."""
    end = len(indices)
    while end:
        first = end - 1
        while first and indices[first - 1] == indices[first] - 1:
            first -= 1
        del starts[indices[first]:indices[end - 1] + 1]
        del records[indices[first]:indices[end - 1] + 1]
        end = first


def _lane_of(ins: Instruction) -> Any:
    """The in-order queue an instruction waits in. The DMA engine has a read channel and a write channel
    (reads enter the core's ring stop, writes leave it: opposite directions of the ring)."""
    if isinstance(ins, (DmaLoad, DmaGather)):
        return "dma_read"
    if isinstance(ins, DmaStore):
        return "dma_write"
    return {"pe": "pe", "vector": "vector"}.get(ins.ENGINE)


def _dram_hazards(tables: dict[str, "Hazards"], nid: int, lane: Any, accesses: list[tuple[str, int, int, bool]]) -> set[int]:
    """Same-core ordering of DMA on overlapping bytes of one operand (symbolic: operand and offset only)."""
    preds: set[int] = set()
    for operand, lo, hi, is_write in accesses:
        table = tables.get(operand)
        if table is None:
            table = tables[operand] = Hazards()
        rng = [(lo, hi)]
        preds |= table.add(nid, lane, [] if is_write else rng, rng if is_write else [])
    return preds


class Graph:
    """Every instruction as a node with the set of nodes that must finish before it starts."""

    def __init__(self, program: Program, coster: Coster):
        self.program = program
        self.nodes: list[Node] = []
        self.cores = sorted(c for c, ins in program.cores.items() if ins)
        for core in self.cores:
            self._add_core(core, program.cores[core], coster)
        self._link_cross_core()

    def _add_core(self, core: int, instrs: list[Instruction], coster: Coster) -> None:
        hazards = Hazards()
        dram_hazards: dict[str, Hazards] = {}
        last_in_lane: dict[Any, int] = {}
        holding: int | None = None  # the latest Wait/Barrier: later instructions start after it
        for index, ins in enumerate(instrs):
            nid = len(self.nodes)
            node = Node(core, index, ins, ins.ENGINE, _lane_of(ins))
            coster.cost(node)
            self.nodes.append(node)
            node.preds |= hazards.add(nid, node.lane, node.reads, node.writes)
            node.preds |= _dram_hazards(dram_hazards, nid, node.lane, node.dram)
            if node.lane is not None and node.lane in last_in_lane:
                node.preds.add(last_in_lane[node.lane])
            if holding is not None:
                node.preds.add(holding)
            if isinstance(ins, (Signal, Barrier)):
                node.preds |= set(last_in_lane.values())  # fence: earlier work is done and visible
            if node.lane is not None:
                last_in_lane[node.lane] = nid
            if isinstance(ins, RingRecv):
                last_in_lane[("recv", ins.src_core, ins.tag, nid)] = nid  # fences also wait for receives
            if isinstance(ins, (Wait, Barrier)):
                holding = nid

    def _link_cross_core(self) -> None:
        """Match Signal/Wait, RingSend/RingRecv (in order per sender, receiver and tag) and Barriers."""
        signals, sends, barriers = defaultdict(list), defaultdict(list), defaultdict(list)
        for nid, node in enumerate(self.nodes):
            ins = node.instr
            if isinstance(ins, Signal):
                signals[(node.core, ins.dst_core, ins.tag)].append(nid)
            elif isinstance(ins, RingSend):
                sends[(node.core, ins.dst_core, ins.tag)].append(nid)
            elif isinstance(ins, Barrier):
                group = ins.cores if ins.cores is not None else tuple(self.cores)
                barriers[(ins.tag, group, node.core)].append(nid)
        for nid, node in enumerate(self.nodes):
            ins = node.instr
            if isinstance(ins, Wait):
                node.preds.add(self._take(signals, (ins.src_core, node.core, ins.tag), node, "Signal"))
            elif isinstance(ins, RingRecv):
                send = self._take(sends, (ins.src_core, node.core, ins.tag), node, "RingSend")
                node.preds.add(send)
                sent: RingSend = self.nodes[send].instr  # type: ignore[assignment]
                self._retarget_receive(nid, sent)
        self._check_unmatched(signals, "Signal", "Wait")
        self._check_unmatched(sends, "RingSend", "RingRecv")
        self._join_barriers(barriers)

    def _take(self, table: dict, key: tuple, node: Node, what: str) -> int:
        if not table.get(key):
            raise ProgramError(f"no matching {what} from core {key[0]} with tag {key[2]}: the core would wait forever",
                               node.core, node.index, node.instr)
        return table[key].pop(0)

    def _check_unmatched(self, table: dict, what: str, partner: str) -> None:
        for nids in table.values():
            if nids:
                n = self.nodes[nids[0]]
                raise ProgramError(f"{what} has no matching {partner} on the destination core", n.core, n.index, n.instr)

    def _retarget_receive(self, recv_id: int, sent: RingSend) -> None:
        """Make the RingRecv the writer of the bytes it delivers, so that the receiver's readers of them
        depend on it (applied by :func:`rescan_received_bytes`, once every send is matched)."""
        self.nodes[recv_id].writes.append((sent.dst_offset, sent.dst_offset + sent.nbytes))

    def _join_barriers(self, barriers: dict) -> None:
        occurrences: dict[tuple, list[list[int]]] = defaultdict(list)
        for (tag, group, core), nids in barriers.items():
            if core not in group:
                n = self.nodes[nids[0]]
                raise ProgramError(f"barrier group {list(group)} does not include this core", n.core, n.index, n.instr)
            for k, nid in enumerate(nids):
                while len(occurrences[(tag, group)]) <= k:
                    occurrences[(tag, group)].append([])
                occurrences[(tag, group)][k].append(nid)
        for (tag, group), rounds in occurrences.items():
            for members in rounds:
                if len(members) != len(group):
                    n = self.nodes[members[0]]
                    raise ProgramError(f"barrier tag {tag}: only {len(members)} of the {len(group)} cores reach it",
                                       n.core, n.index, n.instr)
                arrival: set[int] = set()
                for nid in members:
                    arrival |= self.nodes[nid].preds
                for nid in members:
                    self.nodes[nid].preds = set(arrival)


def rescan_received_bytes(graph: Graph) -> None:
    """Second hazard pass, now that RingRecvs write the bytes they deliver (known only after matching)."""
    by_core: dict[int, list[int]] = defaultdict(list)
    for nid, node in enumerate(graph.nodes):
        by_core[node.core].append(nid)
    for nids in by_core.values():
        if not any(isinstance(graph.nodes[n].instr, RingRecv) for n in nids):
            continue
        hazards = Hazards()
        for nid in nids:
            node = graph.nodes[nid]
            node.preds |= hazards.add(nid, node.lane, node.reads, node.writes)


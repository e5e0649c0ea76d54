"""The timing graph's access records (``card.timing.graph.Hazards``): the same predecessors as scanning
every record, and a scan whose size does not depend on the longest record seen."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spyre.card.timing.graph import Hazards

LANES = [None, "pe", "vector", "dma_read", "dma_write"]


class BruteForce:
    """The reference: every record is checked against every access."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int, int, bool, Any]] = []  # lo, hi, node id, is_write, lane

    def add(self, node_id: int, lane: Any, reads: list[tuple[int, int]], writes: list[tuple[int, int]]) -> set[int]:
        overlaps = lambda r, lo, hi: r[0] < hi and lo < r[1]  # noqa: E731
        preds = {r[2] for lo, hi in reads for r in self.records if r[3] and overlaps(r, lo, hi)}
        preds |= {r[2] for lo, hi in writes for r in self.records if overlaps(r, lo, hi)}
        covering = [(lo, hi, True) for lo, hi in writes]
        covering += [(lo, hi, False) for lo, hi in reads] if lane is not None else []
        self.records = [r for r in self.records if not any(
            lo <= r[0] and r[1] <= hi and (by_write or (not r[3] and r[4] == lane)) for lo, hi, by_write in covering)]
        self.records += [(lo, hi, node_id, False, lane) for lo, hi in reads if hi > lo]
        self.records += [(lo, hi, node_id, True, lane) for lo, hi in writes if hi > lo]
        preds.discard(node_id)
        return preds


def _kept(h: Hazards) -> Counter:
    return Counter((lo, hi, node, is_write, lane) for table, is_write in ((h.reads, False), (h.writes, True))
                   for bucket in table.values() for lo, hi, node, lane in bucket.records)


_point = st.integers(-4, 40)  # a small space: many overlaps and exact edges
_short = st.tuples(_point, st.integers(-2, 12)).map(lambda t: (t[0], t[0] + t[1]))  # some empty or inverted
_long = st.sampled_from([(0, 1 << 30), (-1000, 5000), (3, 39), (100, 1 << 20)])
_range = st.one_of(_short, _short, _short, _long)
_access = st.tuples(st.booleans(), st.sampled_from(LANES), st.lists(_range, max_size=3), st.lists(_range, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(_access, min_size=1, max_size=60))
def test_predecessors_and_kept_records_equal_the_brute_force_scan(accesses):
    fast, ref = Hazards(), BruteForce()
    node = 0
    for same_node, lane, reads, writes in accesses:
        node += 0 if same_node else 1  # one node may add several accesses (a DMA on one operand)
        assert fast.add(node, lane, reads, writes) == ref.add(node, lane, reads, writes)
        assert _kept(fast) == Counter(ref.records)


def test_a_long_record_does_not_widen_later_scans():
    def examined(n: int) -> int:
        h = Hazards()
        h.add(0, "dma_read", [], [(0, 1 << 30)])  # one wide strided span, never superseded
        for k in range(1, n + 1):
            lo = 128 * k
            assert h.add(2 * k, "vector", [], [(lo, lo + 128)]) == {0}
            assert h.add(2 * k + 1, "dma_write", [(lo, lo + 128)], []) == {0, 2 * k}
        return h.examined

    small, large = examined(1000), examined(2000)
    # Each access looks at a few neighbours and the long record; scanning every earlier record (the window
    # of the longest record ever seen) would examine about n^2 / 2 and quadruple when n doubles.
    assert small <= 8 * 1000 and large <= 8 * 2000
    assert large <= 2.2 * small


def test_reads_scan_only_the_writes():
    h = Hazards()
    for k in range(100):
        h.add(k, LANES[1 + k % 4], [(k, k + (1 << 20))], [])  # overlapping reads, none covering another
    before = h.examined
    assert h.add(100, "pe", [(64, 128)], []) == set()
    assert h.examined == before  # no writes to look at, and no read could fit inside (64, 128)
    assert h.add(101, "pe", [], [(64, 128)]) == set(range(101))  # a write waits for every reader

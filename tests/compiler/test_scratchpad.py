"""Scratchpad planning by liveness."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, SpBuffer, plan


def test_buffers_with_disjoint_lifetimes_share_bytes():
    a = SpBuffer("a", 1000, 0, 1)
    b = SpBuffer("b", 1000, 2, 3)
    p = plan([a, b], 1024)
    assert a.offset == b.offset == 0
    assert p.peak_bytes == 1024


def test_live_buffers_never_overlap_and_are_aligned():
    bufs = [SpBuffer("x", 300, 0, 5), SpBuffer("y", 129, 1, 2), SpBuffer("z", 64, 2, 6)]
    plan(bufs, 4096)
    for b in bufs:
        assert b.offset % 128 == 0
    assert {b.offset for b in bufs} == {0, 384, 640} or len({b.offset for b in bufs}) == 3


def test_overflow_names_the_live_buffers():
    with pytest.raises(ScratchpadOverflowError, match=r"needs 2048 bytes .* only 1536 .*big \(1024 B\)"):
        plan([SpBuffer("big", 1024, 0, 3), SpBuffer("other", 1024, 2, 4)], 1536)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 10)), min_size=1, max_size=12))
def test_plan_is_valid_whenever_it_succeeds(specs):
    bufs = [SpBuffer(f"b{i}", n, s, s + d) for i, (n, s, d) in enumerate(specs)]
    cap = 16 * 1024
    try:
        p = plan(bufs, cap)
    except ScratchpadOverflowError as e:
        assert e.needed > cap
        return
    for i, a in enumerate(bufs):
        assert a.offset + a.aligned_bytes <= cap
        for b in bufs[i + 1:]:
            if a.overlaps_in_time(b):
                assert a.offset + a.aligned_bytes <= b.offset or b.offset + b.aligned_bytes <= a.offset
    assert p.peak_bytes <= cap

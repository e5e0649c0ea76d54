"""Streams, events and the simulated device clock (runtime/stream.py)."""

import pytest

from torch_spyre.runtime import stream as S


@pytest.fixture
def card():
    # A card index no other test uses, with a clean clock.
    c = 7
    S.clock(c).reset()
    yield c
    S.clock(c).reset()


def test_work_on_one_stream_is_sequential(card):
    s = S.Stream(card)
    a = s.enqueue("a", 10e-6)
    b = s.enqueue("b", 5e-6)
    assert (a.start, a.end) == (0.0, 10e-6)
    assert b.start == pytest.approx(10e-6) and b.end == pytest.approx(15e-6)


def test_two_streams_overlap_on_different_resources(card):
    s1, s2 = S.Stream(card), S.Stream(card)
    k = s1.enqueue("kernel", 100e-6, resource="compute")
    c = s2.enqueue("copy", 40e-6, kind="copy_h2d", resource="h2d")
    assert c.start == 0.0 and k.start == 0.0  # they overlap in simulated time
    k2 = s2.enqueue("kernel2", 10e-6, resource="compute")
    assert k2.start == pytest.approx(100e-6)  # the cores are busy until the first kernel ends


def test_wait_event_and_wait_stream_order_work(card):
    s1, s2 = S.Stream(card), S.Stream(card)
    s1.enqueue("producer", 50e-6, resource="h2d")
    e = s1.record_event()
    s2.wait_event(e)
    r = s2.enqueue("consumer", 1e-6, resource="compute")
    assert r.start == pytest.approx(50e-6)
    s3 = S.Stream(card)
    s3.wait_stream(s2)
    assert s3.enqueue("after", 1e-6, resource="d2h").start == pytest.approx(51e-6)


def test_elapsed_time_is_simulated_milliseconds(card):
    s = S.Stream(card)
    start, end = S.Event(enable_timing=True), S.Event(enable_timing=True)
    start.record(s)
    s.enqueue("k", 250e-6)
    end.record(s)
    assert start.elapsed_time(end) == pytest.approx(0.25)


def test_elapsed_time_errors(card):
    s = S.Stream(card)
    a, b = S.Event(enable_timing=True), S.Event(enable_timing=False)
    a.record(s)
    b.record(s)
    with pytest.raises(RuntimeError, match="enable_timing"):
        a.elapsed_time(b)
    with pytest.raises(RuntimeError, match="recorded"):
        a.elapsed_time(S.Event(enable_timing=True))


def test_synchronize_makes_later_work_start_after_what_the_host_saw(card):
    s1, s2 = S.Stream(card), S.Stream(card)
    s1.enqueue("long", 1e-3, resource="h2d")
    s1.synchronize()  # the host waited 1 ms of device time
    r = s2.enqueue("next", 1e-6, resource="compute")
    assert r.start == pytest.approx(1e-3)


def test_stream_context_and_current_stream(card):
    s = S.Stream(card)
    assert S.current_stream(card) == S.default_stream(card)
    with S.stream_context(s):
        assert S.current_stream() is s and S.current_card() == card
    assert S.current_stream(card) == S.default_stream(card)


def test_listeners_see_every_piece_of_work(card):
    seen = []
    S.add_listener(seen.append)
    try:
        S.Stream(card).enqueue("x", 1e-6, kind="fallback")
    finally:
        S.remove_listener(seen.append)
    assert [(r.name, r.kind, r.card) for r in seen] == [("x", "fallback", card)]


def test_bad_work_is_rejected(card):
    s = S.Stream(card)
    with pytest.raises(ValueError, match="resource"):
        s.enqueue("x", 1e-6, resource="gpu")
    with pytest.raises(ValueError, match="negative"):
        s.enqueue("x", -1.0)
    other = S.Stream(card + 1)
    with pytest.raises(RuntimeError, match="spyre"):
        s.wait_stream(other)


def test_streams_carry_their_device_like_torch_streams(card):
    s = S.Stream(card)
    assert s.device_index == card
    assert str(s.device) == f"spyre:{card}" or s.device.index == card


def test_a_record_reports_its_queued_duration_wherever_it_runs(card):
    s = S.Stream(card)
    length = 2.227641884779499e-05  # a kernel time whose end - start rounds differently late on the clock
    s.enqueue("earlier work", 0.1234567891)
    rec = s.enqueue("kernel", length)
    assert rec.end - rec.start != length  # the rounding this guards against
    assert rec.duration == length

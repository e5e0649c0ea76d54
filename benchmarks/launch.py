"""Host cost of the runtime's prepare/launch split, and host wall time of executing real programs.

    /work/venv/bin/python benchmarks/launch.py [--repeat N] [--quick]

Prints three tables (medians over ``--repeat`` samples; every ratio compares figures measured in this
same run, on this machine):

1. host cost of launching a prepared program vs preparing it every time: (a) the runtime's own cost,
   functional execution excluded, with the patching alone (steps 1-3) vs a per-instruction Python loop
   (``card.execute.resolve_addresses``); (b) the same including the simulator's functional execution;
2. host wall time of executing the 1024^3 matmul over 32 cores (functional execution through launch);
3. host wall time of launching each MiniLM-layer-sized program, next to the simulated device time.

Host wall time is what this machine spends simulating; the simulated device time is what the card
would take. They are separate figures and never mixed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.programs import ALL_BUILDERS, Built, build_matmul_1024, build_minilm_layer  # noqa: E402
from torch_spyre.card import Card, load_config  # noqa: E402
from torch_spyre.card.execute import resolve_addresses  # noqa: E402
from torch_spyre.runtime import launch as launch_mod  # noqa: E402
from torch_spyre.runtime import stream as S  # noqa: E402
from torch_spyre.runtime.launch import apply_patch, compute_patch, launch, prepare, resolve_bindings  # noqa: E402


def per_call(fn: Callable[[], object], repeat: int, min_sample_s: float = 0.02) -> float:
    """Median seconds per call of ``fn``: each sample runs enough calls to last ``min_sample_s``, so
    microsecond-scale costs are not lost in timer resolution."""
    fn()  # warm up (first-use allocations, imports)
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, int(min_sample_s / once))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def timed_launches(p, args: dict, repeat: int) -> tuple[list[float], object]:
    """Host seconds of ``repeat`` launches after one warm-up launch, and the last LaunchRecord."""
    rec = launch(p, args)  # warm-up: first touch of device pages and scratchpads
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        rec = launch(p, args)
        samples.append(time.perf_counter() - t0)
    return samples, rec


def bind(card: Card, built: Built) -> dict:
    """Allocate every operand of a built program (contents do not change host cost or device time)."""
    return {op.name: card.memory.allocate(op.nbytes) for op in built.program.operands}


def fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    print(f"\n{title}")
    print("-" * len(line(header)))
    print(line(header))
    print("-" * len(line(header)))
    for r in rows:
        print(line(r))
    print("-" * len(line(header)))


# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def runtime_only():
    """Launch without the card's functional execution, to measure the runtime's own host cost: on a
    real card the program runs on the device, and a launch costs the host only this part."""
    real = launch_mod.execute
    launch_mod.execute = lambda card, program, dma_addresses: None
    try:
        yield
    finally:
        launch_mod.execute = real


def table_launch_cost(card: Card, names: list[str], repeat: int) -> None:
    runtime_rows, full_rows = [], []
    for name in names:
        built = ALL_BUILDERS[name]()
        p = prepare(built.program, card)
        args = bind(card, built)
        bases = {k: a.address for k, a in args.items()}
        patch = per_call(lambda: apply_patch(p, compute_patch(p, resolve_bindings(p, args))), repeat)
        loop = per_call(lambda: resolve_addresses(built.program, bases), repeat)
        with runtime_only():
            launched = per_call(lambda: launch(p, args), repeat)
            each_time = per_call(lambda: launch(prepare(built.program, card), args), repeat)
        runtime_rows.append([name, str(len(p.patches)), fmt_s(patch), fmt_s(loop), f"{loop / patch:.1f}x",
                             fmt_s(launched), fmt_s(each_time), f"{each_time / launched:,.0f}x"])
        full = per_call(lambda: launch(p, args), repeat)
        full_each = per_call(lambda: launch(prepare(built.program, card), args), repeat)
        full_rows.append([name, fmt_s(full), fmt_s(full_each), f"{full_each / full:.2f}x"])
    print_table("1a. Runtime host cost per launch, functional execution excluded (what a real card's host pays)",
                ["program", "DMA patches", "patch (steps 1-3)", "per-instr loop", "loop/patch",
                 "prepared launch", "prepare+launch", "ratio"], runtime_rows)
    print_table("1b. The same, including the simulator's functional execution",
                ["program", "prepared launch", "prepare+launch", "ratio"], full_rows)


def table_matmul(card: Card, repeat: int) -> None:
    built = build_matmul_1024()
    t0 = time.perf_counter()
    p = prepare(built.program, card)
    prep = time.perf_counter() - t0
    samples, rec = timed_launches(p, bind(card, built), repeat)
    host = statistics.median(samples)
    rows = [[built.program.name, str(len(p.program.cores)), fmt_s(prep), fmt_s(host), fmt_s(min(samples)),
             fmt_s(rec.duration), f"{host / rec.duration:,.0f}x", f"{100 * rec.roofline_fraction:.1f}%",
             rec.bottleneck]]
    print_table(f"2. 1024^3 matmul over 32 cores: host wall time of a launch (median of {repeat})",
                ["program", "cores", "prepare", "launch (median)", "launch (min)", "device time",
                 "host/device", "op roofline", "bottleneck"], rows)


def table_minilm(card: Card, repeat: int) -> None:
    rows, host_total, dev_total = [], 0.0, 0.0
    for name, built in build_minilm_layer().items():
        p = prepare(built.program, card)
        samples, rec = timed_launches(p, bind(card, built), repeat)
        host = statistics.median(samples)
        host_total, dev_total = host_total + host, dev_total + rec.duration
        n_ins = sum(len(v) for v in built.program.cores.values())
        rows.append([name, str(len(built.program.cores)), str(n_ins), fmt_s(host), fmt_s(rec.duration),
                     f"{host / rec.duration:,.0f}x", f"{100 * rec.roofline_fraction:.1f}%", rec.bottleneck])
    rows.append(["layer total", "", "", fmt_s(host_total), fmt_s(dev_total), f"{host_total / dev_total:,.0f}x", "", ""])
    print_table(f"3. MiniLM layer (batch 1, seq 128): host wall time of each launch (median of {repeat})",
                ["program", "cores", "instrs", "host launch", "device time", "host/device", "op roofline",
                 "bottleneck"], rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15, help="samples per figure (the median is printed)")
    ap.add_argument("--quick", action="store_true", help="3 samples per figure (a smoke run)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads for the card's arithmetic (default: torch's own choice)")
    args = ap.parse_args(argv)
    repeat = 3 if args.quick else args.repeat
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    card = Card(0, load_config())
    S.clock(0).reset()
    print(f"torch-spyre launch benchmark: {card}, {repeat} samples per figure, torch threads "
          f"{torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    table_launch_cost(card, ["elementwise", "minilm_ln1", "minilm_qkv_proj", "matmul_1024"], repeat)
    table_matmul(card, repeat)
    table_minilm(card, repeat)


if __name__ == "__main__":
    main()

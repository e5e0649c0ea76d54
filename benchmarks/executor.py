"""Host time of the card's two executors on the hand-written programs: checked against fast.

    python benchmarks/executor.py [--repeat N] [name ...]

For each program of benchmarks/programs.py: the median host time of one run on the checked executor
(``card.execute.execute``: every check, core by core) and on the fast one (``FastPlan.run``: the proved
program in lockstep rounds, alike instructions of several cores as one array operation), measured in the
same run from the same device memory, the ratio, and the fast plan's size (steps against instructions).
The two results are compared byte for byte after the timed runs. Host time is this machine's (noisy on
a shared machine: read the ratios); simulated device time does not depend on the executor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.eager import median_seconds  # noqa: E402
from benchmarks.programs import ALL_BUILDERS, encode, operand_layout  # noqa: E402
from torch_spyre.card import Card  # noqa: E402
from torch_spyre.card.config import load_config  # noqa: E402
from torch_spyre.card.execute import FastPlan, execute, resolve_addresses  # noqa: E402
from torch_spyre.card.validate import validate  # noqa: E402


def measure(card: Card, name: str, repeat: int) -> dict:
    built = ALL_BUILDERS[name]()
    program = built.program
    validate(program, card.config)
    inputs = built.make_inputs(0)
    allocs = {op.name: card.memory.allocate(op.nbytes) for op in program.operands}
    try:
        for op in program.operands:
            if op.name in inputs:
                card.memory.write(allocs[op.name].address, operand_layout(op).pack(encode(inputs[op.name], op.device_dtype)))
        addresses = resolve_addresses(program, {n: a.address for n, a in allocs.items()})
        checked_s = median_seconds(lambda: execute(card, program, addresses), repeat, warmup=1)
        checked = {n: a.buffer.copy() for n, a in allocs.items()}
        plan = FastPlan(program, card)
        fast_s = median_seconds(lambda: plan.run(card.memory, addresses), repeat, warmup=1)
        same = all(np.array_equal(checked[n], a.buffer) for n, a in allocs.items())
    finally:
        for a in allocs.values():
            card.memory.free(a)
    return {"program": name, "cores": len(program.cores), "instructions": sum(len(v) for v in program.cores.values()),
            "fast_steps": len(plan.steps), "checked_ms": checked_s * 1e3, "fast_ms": fast_s * 1e3,
            "speedup": checked_s / fast_s, "identical": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"programs (default: all of {', '.join(ALL_BUILDERS)})")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    card = Card(0, load_config(environ={}))
    rows = [measure(card, n, args.repeat) for n in (args.names or ALL_BUILDERS)]
    print(f"{'program':<20} {'cores':>5} {'instrs':>7} {'steps':>6} {'checked ms':>11} {'fast ms':>9} {'speedup':>8}  bits")
    for r in rows:
        print(f"{r['program']:<20} {r['cores']:>5} {r['instructions']:>7} {r['fast_steps']:>6} {r['checked_ms']:>11.2f} "
              f"{r['fast_ms']:>9.2f} {r['speedup']:>7.1f}x  {'identical' if r['identical'] else 'DIFFER'}")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

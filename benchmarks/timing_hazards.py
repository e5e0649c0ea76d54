"""Host cost of the timing graph's hazard records (``card.timing.graph.Hazards``) against the previous
structure, in one run, with the predecessors of both compared.

    python benchmarks/timing_hazards.py                    # synthetic rows and the benchmark programs
    python benchmarks/timing_hazards.py --sizes 2500,5000  # synthetic sizes for both structures
    python benchmarks/timing_hazards.py --programs DIR     # also every pickled Program in DIR (*.pkl)
    python benchmarks/timing_hazards.py --prefixes FILE    # one pickled Program's busiest core, by prefix

The previous structure kept every record in one list sorted by start and scanned the starts in
(lo - the longest record ever seen, hi), so one long record (a wide strided span) made every later query
scan nearly every record. The synthetic rows are that case: one long write, then n short writes and
reads of the next 128 bytes on two engines (2n accesses). ``--new-only`` sizes run only the new structure
(the previous one is quadratic there). For programs the whole dependency graph is built with each
structure (``Graph`` plus ``rescan_received_bytes``, which is the hazard-dependent part of timing) and every
node's predecessors must be equal. ``--prefixes`` replays the hazard calls of a program's busiest core
(scratchpad and device-memory tables, as ``Graph`` makes them) on doubling prefixes, for programs too big
to build twice; the previous structure stops after ``--budget`` seconds. Host times are wall clock on a
shared machine: compare within a run.
"""

from __future__ import annotations

import argparse
import bisect
import pickle
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch_spyre.card.config import CardConfig  # noqa: E402
from torch_spyre.card.timing import graph as graph_module  # noqa: E402
from torch_spyre.card.timing.coster import Coster  # noqa: E402
from torch_spyre.program import Program  # noqa: E402


class LongestWindowHazards:
    """The previous ``Hazards`` (before the length-class buckets), verbatim but for the name."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.records: list[tuple[int, int, int, bool, Any]] = []  # lo, hi, node id, is_write, lane
        self.longest = 0

    def add(self, node_id: int, lane: Any, reads: list[tuple[int, int]], writes: list[tuple[int, int]]) -> set[int]:
        preds: set[int] = set()
        starts, records = self.starts, self.records
        if records:
            longest = self.longest
            for lo, hi in reads:
                for i in range(bisect.bisect_right(starts, lo - longest), bisect.bisect_left(starts, hi)):
                    rlo, rhi, other, is_write, _ = records[i]
                    if is_write and rlo < hi and lo < rhi:
                        preds.add(other)
            for lo, hi in writes:
                for i in range(bisect.bisect_right(starts, lo - longest), bisect.bisect_left(starts, hi)):
                    rlo, rhi, other, _, _ = records[i]
                    if rlo < hi and lo < rhi:
                        preds.add(other)
            self._drop_superseded(lane, reads, writes)
        for accesses, is_write in ((reads, False), (writes, True)):
            for lo, hi in accesses:
                if hi > lo:
                    i = bisect.bisect_right(starts, lo)
                    starts.insert(i, lo)
                    records.insert(i, (lo, hi, node_id, is_write, lane))
                    if hi - lo > self.longest:
                        self.longest = hi - lo
        preds.discard(node_id)
        return preds

    def _drop_superseded(self, lane: Any, reads: list[tuple[int, int]], writes: list[tuple[int, int]]) -> None:
        starts, records = self.starts, self.records
        doomed: set[int] = set()
        for (lo, hi), by_write in [(w, True) for w in writes] + [(r, False) for r in reads if lane is not None]:
            for i in range(bisect.bisect_left(starts, lo), bisect.bisect_left(starts, hi)):
                rlo, rhi, _, is_write, rec_lane = records[i]
                if rhi <= hi and (by_write or (not is_write and rec_lane == lane)):
                    doomed.add(i)
        for i in sorted(doomed, reverse=True):
            del starts[i]
            del records[i]


STRUCTURES = {"previous": LongestWindowHazards, "buckets": graph_module.Hazards}


def synthetic(cls: type, n: int) -> tuple[float, list[set[int]]]:
    """One long write, then per k a short write (vector) and a read of it (DMA): host s and every pred set."""
    h = cls()
    start = time.perf_counter()
    out = [h.add(0, "dma_read", [], [(0, 1 << 30)])]
    for k in range(1, n + 1):
        lo = 128 * k
        out.append(h.add(2 * k, "vector", [], [(lo, lo + 128)]))
        out.append(h.add(2 * k + 1, "dma_write", [(lo, lo + 128)], []))
    return time.perf_counter() - start, out


def build_graph(cls: type, program: Program, cfg: CardConfig) -> tuple[float, list[set[int]]]:
    """The dependency graph of ``program`` with ``cls`` as the hazard records: host s and every pred set."""
    saved = graph_module.Hazards
    graph_module.Hazards = cls
    try:
        start = time.perf_counter()
        g = graph_module.Graph(program, Coster(cfg))
        graph_module.rescan_received_bytes(g)
        return time.perf_counter() - start, [n.preds for n in g.nodes]
    finally:
        graph_module.Hazards = saved


def hazard_calls(program: Program, cfg: CardConfig) -> list[list[tuple]]:
    """Every ``Hazards.add`` call building ``program``'s graph makes, one list per Hazards instance."""
    logs: list[list[tuple]] = []

    class Recorder(graph_module.Hazards):
        def __init__(self) -> None:
            super().__init__()
            self.log: list[tuple] = []
            logs.append(self.log)

        def add(self, node_id: int, lane: Any, reads: list, writes: list) -> set[int]:
            self.log.append((node_id, lane, list(reads), list(writes)))
            return super().add(node_id, lane, reads, writes)

    build_graph(Recorder, program, cfg)
    return [log for log in logs if log]


def replay(cls: type, logs: list[list[tuple]]) -> float:
    """Host s of making the recorded calls on fresh ``cls`` instances: the hazard records alone."""
    start = time.perf_counter()
    for log in logs:
        h = cls()
        for call in log:
            h.add(*call)
    return time.perf_counter() - start


def core_calls(program: Program, cfg: CardConfig) -> list[tuple]:
    """The hazard calls ``Graph`` makes for ``program``'s busiest core: (table, node, lane, reads, writes)."""
    from torch_spyre.card.timing.coster import Node
    core = max(program.cores, key=lambda c: len(program.cores[c]))
    coster, calls = Coster(cfg), []
    for index, ins in enumerate(program.cores[core]):
        node = Node(core, index, ins, ins.ENGINE, graph_module._lane_of(ins))
        coster.cost(node)
        calls.append(("scratchpad", index, node.lane, list(node.reads), list(node.writes)))
        for operand, lo, hi, is_write in node.dram:
            rng = [(lo, hi)]
            calls.append((operand, index, node.lane, [] if is_write else rng, rng if is_write else []))
    return calls


def replay_prefix(cls: type, calls: list[tuple], budget_s: float) -> tuple[list[set[int]] | None, float]:
    """Make ``calls`` on fresh tables of ``cls``: every pred set and the host s (None once over budget)."""
    tables: dict[str, Any] = {}
    out = []
    start = time.perf_counter()
    for k, (key, nid, lane, reads, writes) in enumerate(calls):
        table = tables.get(key)
        if table is None:
            table = tables[key] = cls()
        out.append(table.add(nid, lane, reads, writes))
        if k % 1000 == 0 and time.perf_counter() - start > budget_s:
            return None, time.perf_counter() - start
    return out, time.perf_counter() - start


def prefixes(path: Path, budget_s: float) -> None:
    start = time.perf_counter()
    program = pickle.loads(path.read_bytes())
    calls = core_calls(program, CardConfig())
    print(f"{program.name}: {sum(len(v) for v in program.cores.values()):,} instructions on "
          f"{len(program.cores)} cores, {len(calls):,} hazard calls for its busiest core "
          f"(loaded in {time.perf_counter() - start:.0f} s)")
    print()
    print("| calls | previous host s | buckets host s | previous / buckets |")
    print("|---:|---:|---:|---:|")
    sizes = [n for n in (5000 * 2 ** k for k in range(40)) if n < len(calls)] + [len(calls)]
    for n in sizes:
        new, new_s = replay_prefix(graph_module.Hazards, calls[:n], float("inf"))
        old, old_s = replay_prefix(LongestWindowHazards, calls[:n], budget_s)
        if old is None:
            print(f"| {n:,} | stopped after {old_s:.0f} s | {new_s:.3f} | |")
            continue
        if old != new:
            raise SystemExit(f"{path}: the predecessors of the first {n} calls differ")
        print(f"| {n:,} | {old_s:.3f} | {new_s:.3f} | {old_s / new_s:.1f} |")
    print()


def best_of(repeat: int, *runs: Any) -> list[float]:
    """The least host s of each run over ``repeat`` rounds (the runs alternate within a round)."""
    best = [float("inf")] * len(runs)
    for _ in range(repeat):
        for k, run in enumerate(runs):
            best[k] = min(best[k], run())
    return best


def benchmark_programs() -> list[tuple[str, Program]]:
    from benchmarks import programs as bp
    out = [(name, getattr(bp, f"build_{name}")().program) for name in (
        "elementwise", "row_reduce", "matmul", "matmul_ksplit", "all_to_all", "softmax_scratchpad",
        "softmax_roundtrip", "attention", "layernorm")]
    out += [(f"minilm_layer/{k}", b.program) for k, b in bp.build_minilm_layer().items()]
    return out


def compare(rows: list[tuple[str, int, float, float, float, float]], label: str) -> None:
    print(f"| {label} | instructions | graph s previous | graph s buckets | ratio "
          "| hazards s previous | hazards s buckets | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, count, g_old, g_new, h_old, h_new in rows:
        print(f"| {name} | {count:,} | {g_old:.3f} | {g_new:.3f} | {g_old / g_new:.2f} "
              f"| {h_old:.3f} | {h_new:.3f} | {h_old / h_new:.2f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2500,5000,10000", help="synthetic n for both structures")
    ap.add_argument("--new-only", default="100000", help="synthetic n for the new structure only")
    ap.add_argument("--programs", type=Path, help="a directory of pickled Programs to compare as well")
    ap.add_argument("--no-benchmark-programs", action="store_true", help="skip benchmarks/programs.py's")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per program (the least host time is kept)")
    ap.add_argument("--prefixes", type=Path, help="a pickled Program: its busiest core's calls by prefix, only")
    ap.add_argument("--budget", type=float, default=120.0, help="--prefixes: seconds for the previous structure")
    args = ap.parse_args(argv)
    if args.prefixes is not None:
        prefixes(args.prefixes, args.budget)
        return

    print("synthetic: one long write, then n short writes and reads (2n + 1 accesses); preds compared")
    print()
    print("| n | previous host s | buckets host s | previous / buckets |")
    print("|---:|---:|---:|---:|")
    for n in (int(x) for x in args.sizes.split(",") if x):
        old_s, old = synthetic(LongestWindowHazards, n)
        new_s, new = synthetic(graph_module.Hazards, n)
        if old != new:
            raise SystemExit(f"synthetic n={n}: the predecessors differ")
        print(f"| {n:,} | {old_s:.3f} | {new_s:.3f} | {old_s / new_s:.1f} |")
    for n in (int(x) for x in args.new_only.split(",") if x):
        new_s, _ = synthetic(graph_module.Hazards, n)
        print(f"| {n:,} | (not run) | {new_s:.3f} | |")
    print()

    cfg = CardConfig()
    sets: list[tuple[str, list[tuple[str, Program]]]] = []
    if not args.no_benchmark_programs:
        sets.append(("benchmark program", benchmark_programs()))
    if args.programs is not None:
        files = sorted(args.programs.glob("*.pkl"))
        if not files:
            raise SystemExit(f"no *.pkl in {args.programs}")
        sets.append((f"{args.programs}", [(f.stem, pickle.loads(f.read_bytes())) for f in files]))
    for label, progs in sets:
        rows = []
        for name, program in progs:
            _, old = build_graph(LongestWindowHazards, program, cfg)
            _, new = build_graph(graph_module.Hazards, program, cfg)
            if old != new:
                raise SystemExit(f"{name}: the predecessors differ")
            logs = hazard_calls(program, cfg)
            times = best_of(args.repeat,
                            lambda: build_graph(LongestWindowHazards, program, cfg)[0],
                            lambda: build_graph(graph_module.Hazards, program, cfg)[0],
                            lambda: replay(LongestWindowHazards, logs),
                            lambda: replay(graph_module.Hazards, logs))
            rows.append((name, sum(len(v) for v in program.cores.values()), *times))
        total = ("total", sum(r[1] for r in rows), *(sum(r[k] for r in rows) for k in range(2, 6)))
        if len(rows) > 20:  # a directory of many: the slowest ten and the total
            rows = sorted(rows, key=lambda r: -r[2])[:10]
        print(f"dependency graphs (Graph + rescan_received_bytes) and their Hazards.add calls alone, least of "
              f"{args.repeat}; predecessors equal for all {len(progs)} programs")
        print()
        compare(rows + [total], label)
        print()


if __name__ == "__main__":
    main()

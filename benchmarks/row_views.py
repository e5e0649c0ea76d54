"""Eager ops on views of whole rows (``x[i] + 1``, an encode's ``torch.stack`` of its batch's rows) with the
``row_views`` optimization off and on (``compiler/row_views.py``).

    python benchmarks/row_views.py [--rows N] [--batches N] [--no-encode]

Both modes run in one process from an empty eager cache:

- the loop ``y = x[i] + 1`` over rows 0..N-1 of a 64x64 fp32 tensor: host wall time of each call after
  the first (which compiles in both modes), eager compiles and the kernels' generated programs;
  then the same loop again over rows already seen (every call a cached launch in both modes: what placing a
  view at offset 0 costs a launch);
- ``SentenceTransformer(path, device="spyre").encode(batch, convert_to_tensor=True)`` over N batches of 8
  sentences, each batch's sentences in another order (ST sorts them by length and stacks the embeddings
  back in the caller's order), after a first encode in each mode: eager compiles per encode and each
  encode's host time, the two modes taking turns on each batch.

Host time is noisy on a shared machine: compare the two modes' figures from one run. The embeddings of
the two modes are checked equal, and the loop's values against the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import torch_spyre  # noqa: E402, F401
from torch_spyre.compiler import eager, kernel_runtime, optimizations  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.host_speed import sentence_batches  # noqa: E402

MODES = {"off": ("row_views",), "on": ()}


def _fresh() -> None:
    eager.reset_cache()
    kernel_runtime.reset_shape_cache_stats()


def row_loop(rows: int) -> dict[str, dict[str, float]]:
    xc = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    (xc.to("spyre") * 2).cpu()  # the process's first compile (Inductor's imports and set-up): in neither mode
    out = {}
    for mode, off in MODES.items():
        with optimizations.disabled(*off):
            _fresh()
            x = xc.to("spyre")
            new, seen = [], []
            for i in range(rows):
                t = time.perf_counter()
                y = x[i] + 1
                new.append(time.perf_counter() - t)
                if not torch.equal(y.cpu(), xc[i] + 1):
                    raise AssertionError(f"row {i} ({mode}): not the CPU's values")
            stats, programs = eager.cache_stats(), kernel_runtime.shape_cache_stats()["programs"]
            for _ in range(3):
                for i in range(rows):
                    t = time.perf_counter()
                    x[i] + 1
                    seen.append(time.perf_counter() - t)
        out[mode] = {"first_s": new[0], "new_row_s": statistics.median(new[1:]), "seen_row_s": statistics.median(seen),
                     "compiles": stats["compiles"], "hits": stats["hits"], "programs": programs}
    return out


def encodes(batches: int) -> dict[str, dict[str, list[float]]] | None:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    from torch_spyre.jobs import embed as job

    rng = random.Random(0)
    orders = []
    for r in range(batches + 1):
        batch = list(sentence_batches()[r % 6])
        rng.shuffle(batch)
        orders.append(batch)
    model = SentenceTransformer(str(job.model_path()), device="spyre")
    _fresh()
    for off in MODES.values():  # the first encode compiles every op: not counted
        with optimizations.disabled(*off):
            model.encode(orders[0], convert_to_tensor=True)
    out = {mode: {"compiles": [], "seconds": []} for mode in MODES}
    for batch in orders[1:]:  # the modes interleaved, each meeting each batch's order for the first time
        embs = []
        for mode, off in MODES.items():
            with optimizations.disabled(*off):
                before = eager.cache_stats()["compiles"]
                t = time.perf_counter()
                embs.append(model.encode(batch, convert_to_tensor=True).cpu())
                out[mode]["seconds"].append(time.perf_counter() - t)
                out[mode]["compiles"].append(eager.cache_stats()["compiles"] - before)
        if not torch.equal(*embs):
            raise AssertionError("the embeddings differ between row_views off and on")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=12, help="rows of the x[i] + 1 loop")
    parser.add_argument("--batches", type=int, default=6, help="encodes, each a batch in another order")
    parser.add_argument("--no-encode", action="store_true", help="only the x[i] + 1 loop")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    loop = row_loop(args.rows)
    print(f"y = x[i] + 1 over {args.rows} rows of a 64x64 fp32 tensor (host wall time per call, medians)\n")
    print("| row_views | first call | a new row | a row seen before | eager compiles | eager hits | programs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, r in loop.items():
        print(f"| {mode} | {r['first_s'] * 1e3:.1f} ms | {r['new_row_s'] * 1e3:.2f} ms "
              f"| {r['seen_row_s'] * 1e3:.3f} ms | {r['compiles']} | {r['hits']} | {r['programs']} |")
    print(f"\na new row: off / on = {loop['off']['new_row_s'] / loop['on']['new_row_s']:.1f}x; "
          f"a row seen before: on / off = {loop['on']['seen_row_s'] / loop['off']['seen_row_s']:.2f}x")

    if not args.no_encode:
        enc = encodes(args.batches)
        if enc is None:
            print("\nsentence_transformers is not installed: no encode rows")
            return 0
        print(f"\nencode(convert_to_tensor=True) of {args.batches} batches of 8 sentences after a first "
              "(compiling) one, each in another order, the two modes interleaved\n")
        print("| row_views | eager compiles per encode | host wall time per encode (median) |")
        print("|---|---|---:|")
        for mode, r in enc.items():
            print(f"| {mode} | {', '.join(map(str, r['compiles']))} | {statistics.median(r['seconds']) * 1e3:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

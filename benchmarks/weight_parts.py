"""Cached eager ``SentenceTransformer(path, device="spyre").encode`` of 8 sentences with the fp32 weights' DLFloat16
parts cached (``compiler/weight_parts.py``) and split at every call (``TORCH_SPYRE_WEIGHT_PARTS_CACHE=0``), against
``device="cpu"``, all in one process, at each fp32 matmul precision given:

    python benchmarks/weight_parts.py                      # "highest" (PyTorch's default)
    python benchmarks/weight_parts.py --precision highest high --repeat 7

Per precision and mode: median wall and process CPU seconds of ``--repeat`` encodes (three times as many of
the short CPU encode; the modes interleaved, so that the machine's load falls on both alike), their ratios to
the CPU encode, the launches and simulated device time of one encode, and whether the embeddings of the two
modes are bit for bit equal. One torch thread, as ``host_speed.py``. Host times depend on the
machine and its load: compare the ratios of one run only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import torch_spyre  # noqa: E402, F401
from torch_spyre.compiler import weight_parts  # noqa: E402
from torch_spyre.jobs import embed as job  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.encode_launches import LaunchCounter  # noqa: E402

MODES = {"cached": None, "split every call": "0"}


def _set_mode(value: str | None) -> None:
    if value is None:
        os.environ.pop(weight_parts.ENV, None)
    else:
        os.environ[weight_parts.ENV] = value


def _timed(fn) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", nargs="+", default=["highest"], choices=["highest", "high", "medium"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as host_speed.py: the card's executor runs single-threaded; compare like with like
    from sentence_transformers import SentenceTransformer

    path = str(job.model_path())
    sentences = [job.DEFAULT_SENTENCES[i % len(job.DEFAULT_SENTENCES)] for i in range(8)]
    on_spyre = SentenceTransformer(path, device="spyre")
    on_cpu = SentenceTransformer(path, device="cpu")

    def spyre_encode():
        emb = on_spyre.encode(sentences, convert_to_tensor=True).cpu()
        torch.spyre.synchronize()
        return emb

    for precision in args.precision:
        torch.set_float32_matmul_precision(precision)
        emb, counts = {}, {}
        for mode, value in MODES.items():  # warm-up: compiles every program of both modes
            _set_mode(value)
            spyre_encode()
            with LaunchCounter() as counter:
                emb[mode] = spyre_encode()
            counts[mode] = (sum(counter.programs.values()), counter.device_seconds)
        times: dict[str, list[tuple[float, float]]] = {m: [] for m in (*MODES, "cpu")}
        on_cpu.encode(sentences)
        for _ in range(args.repeat):
            for mode, value in MODES.items():
                _set_mode(value)
                times[mode].append(_timed(spyre_encode))
            for _ in range(3):  # the CPU encode is short and its threads suffer most from a loaded machine
                times["cpu"].append(_timed(lambda: on_cpu.encode(sentences)))
        _set_mode(None)
        med = {m: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for m, t in times.items()}
        print(f"precision {precision!r}, median of {args.repeat} encodes ({3 * args.repeat} on the CPU; one process, "
              "modes interleaved):")
        print(f"  {'mode':<18}{'wall s':>9}{'CPU s':>9}{'wall/cpu':>10}{'CPU/cpu':>9}{'launches':>10}{'simulated us':>14}")
        for mode in MODES:
            (w, c), (cw, cc) = med[mode], med["cpu"]
            n, dev = counts[mode]
            print(f"  {mode:<18}{w:9.3f}{c:9.3f}{w / cw:9.1f}x{c / cc:8.1f}x{n:10d}{dev * 1e6:14.1f}")
        print(f"  {'device=cpu':<18}{med['cpu'][0]:9.3f}{med['cpu'][1]:9.3f}")
        print(f"  embeddings bit for bit equal across modes: {torch.equal(emb['cached'], emb['split every call'])}")
    print("weight parts cache:", weight_parts.stats())


if __name__ == "__main__":
    main()

"""Cached eager ``SentenceTransformer(path, device="spyre").encode`` of 8 sentences with device-to-device bit moves
done as one gather of device elements (``device.tensor.copy_within``, the default) and with it disabled (the
host's read and write of the values), in one process, at each fp32 matmul precision given:

    python benchmarks/device_copies.py high highest

Per precision: the median process CPU time of 7 encodes per mode (interleaved, so that the machine's load falls
on both alike) and of 21 CPU encodes, the ratios, and whether the two modes' embeddings are bit for bit equal.
One torch thread, as ``host_speed.py``. Host times depend on the machine and its load: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import torch_spyre  # noqa: E402, F401
from torch_spyre.device import tensor as device_tensor  # noqa: E402
from torch_spyre.jobs import embed as job  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("precision", nargs="*", default=["highest"], choices=["highest", "high", "medium"])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from sentence_transformers import SentenceTransformer

    path = str(job.model_path())
    sentences = [job.DEFAULT_SENTENCES[i % len(job.DEFAULT_SENTENCES)] for i in range(8)]
    on_spyre = SentenceTransformer(path, device="spyre")
    on_cpu = SentenceTransformer(path, device="cpu")
    gather = device_tensor.copy_within
    modes = {"gather": gather, "host round trip": lambda src, dst: None}  # None: copy_from reads and writes

    def encode():
        emb = on_spyre.encode(sentences, convert_to_tensor=True).cpu()
        torch.spyre.synchronize()
        return emb

    def cpu_seconds(fn) -> float:
        c0 = time.process_time()
        fn()
        return time.process_time() - c0

    try:
        for precision in args.precision:
            torch.set_float32_matmul_precision(precision)
            emb = {}
            for name, fn in modes.items():  # warm-up: compiles and proves every program
                device_tensor.copy_within = fn
                encode()
                emb[name] = encode()
            times: dict[str, list[float]] = {k: [] for k in (*modes, "cpu")}
            for _ in range(args.repeat):
                for name, fn in modes.items():
                    device_tensor.copy_within = fn
                    times[name].append(cpu_seconds(encode))
                for _ in range(3):
                    times["cpu"].append(cpu_seconds(lambda: on_cpu.encode(sentences)))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{precision}: " + ", ".join(f"{k} {v * 1e3:.0f} ms CPU ({v / med['cpu']:.1f}x)" for k, v in med.items())
                  + f" | embeddings bit for bit equal: {torch.equal(emb['gather'], emb['host round trip'])}")
    finally:
        device_tensor.copy_within = gather


if __name__ == "__main__":
    main()

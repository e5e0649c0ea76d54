"""Load-independent cost of one eager ``SentenceTransformer(path, device="spyre").encode`` of 8 sentences:
program launches, executor steps (instructions executed over all cores) and simulated device time, counted
by wrapping ``runtime.launch.launch`` during one cached encode (after a warm-up encode that compiles).

    python benchmarks/encode_launches.py                 # the table
    python benchmarks/encode_launches.py --save out.pt   # also saves the embeddings (to compare bit for bit)

Every figure here is a count or simulated time: it does not depend on the host's load.
"""

from __future__ import annotations

import argparse
import collections
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import torch_spyre  # noqa: E402, F401
from torch_spyre.jobs import embed as job  # noqa: E402
from torch_spyre.runtime import launch as runtime_launch  # noqa: E402


class LaunchCounter:
    """Counts launches per program name, executor steps and simulated seconds while installed."""

    def __init__(self):
        self.programs: collections.Counter[str] = collections.Counter()
        self.steps = 0
        self.device_seconds = 0.0
        self._original = None

    def __enter__(self):
        self._original = original = runtime_launch.launch

        def counted(prepared, bindings, stream=None):
            rec = original(prepared, bindings, stream)
            self.programs[prepared.name] += 1
            if rec.stats is not None:
                self.steps += sum(sum(engines.values()) for engines in rec.stats.instructions.values())
            self.device_seconds += rec.duration
            return rec

        runtime_launch.launch = counted
        return self

    def __exit__(self, *exc):
        runtime_launch.launch = self._original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="save the cached encode's embeddings to this file")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    path = str(job.model_path())
    sentences = [job.DEFAULT_SENTENCES[i % len(job.DEFAULT_SENTENCES)] for i in range(8)]
    model = SentenceTransformer(path, device="spyre")
    model.encode(sentences)  # compiles every op's program
    torch.spyre.synchronize()
    with LaunchCounter() as counter:
        emb = model.encode(sentences, convert_to_tensor=True).cpu()
        torch.spyre.synchronize()
    ref = SentenceTransformer(path, device="cpu").encode(sentences, convert_to_tensor=True)
    kinds = collections.Counter()
    for name, n in counter.programs.items():
        kinds[name.rsplit("_", 1)[0]] += n
    print(f"launches per encode: {sum(counter.programs.values())}")
    print(f"executor steps per encode: {counter.steps}")
    print(f"simulated device time of the launches: {counter.device_seconds * 1e6:.3f} us")
    print(f"max |spyre - cpu| of the embeddings: {(emb - ref).abs().max().item():.3g}")
    print("launches by kernel kind:", ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    if args.save:
        torch.save(emb, args.save)


if __name__ == "__main__":
    main()

"""One rank of tests/device/test_collectives.py: ``python -m tests.device.collective_rank RANK WORLD INIT_FILE``.

Runs every collective of ``torch_spyre/device/collectives.py`` on its own card (spyre:RANK) over a gloo
group and prints what it got and what its card's clock recorded, as one JSON line.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import torch_spyre  # noqa: F401 - registers the device
from torch_spyre.device import collectives
from torch_spyre.runtime import stream as rt

ROWS, COLS = 256, 64  # fp16: 256 rows of one 128-byte stick, 32 KiB on the card


def rank_values(rank: int) -> torch.Tensor:
    """Distinct values per rank, exact in fp16 and in their sums."""
    return ((torch.arange(ROWS * COLS).reshape(ROWS, COLS) % 13) * 0.25 + rank).to(torch.float16)


def main(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)), backend="gloo")
    dev = torch.device("spyre", rank)
    records = []
    rt.add_listener(lambda r: records.append(r) if r.kind == "collective" else None)
    x = rank_values(rank).to(dev)  # a host->device copy: each card's clock is past it
    if rank == 1:  # card 1 is busy longer, so the collective waits for it
        torch.zeros(4096, 1024, dtype=torch.float16).to(dev)
    ready = collectives.ready_at(rank)
    out = {"rank": rank, "ready": ready}
    collectives.all_reduce(x, group)
    out["all_reduce"] = x.cpu().float().tolist()
    out["all_gather"] = collectives.all_gather(rank_values(rank)[:2].to(dev), 0, group).cpu().float().tolist()
    g = collectives.gather(rank_values(rank)[:2].to(dev), 0, 1, group)
    out["gather"] = None if g is None else g.cpu().float().tolist()
    out["reduce_scatter"] = collectives.reduce_scatter(rank_values(rank)[:4].to(dev), 0, group).cpu().float().tolist()
    b = rank_values(rank)[:2].to(dev)
    out["broadcast"] = collectives.broadcast(b, 1, group).cpu().float().tolist()
    out["records"] = [{"name": r.name, "card": r.card, "start": r.start, "end": r.end, "bytes": r.details["bytes"],
                       "cards": r.details["cards"]} for r in records]
    print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

"""Collectives between cards: spyre tensors staged through host memory for their values, the link model
(``card/interconnect.py``) for their time.

The simulator keeps each card's memory in the process that owns the card, so the values of a collective
travel between processes through a CPU process group (gloo) on host copies. That staging is the simulator's
plumbing, not the card's: it is not charged. What is charged is the collective on the card-to-card link,
queued on the card's current stream and holding both directions of the card's PCIe port (``h2d`` and
``d2h``: one x16 port carries host and peer traffic), starting when the slowest card taking part is ready:
the ranks first agree on that time (a max over the group), so every card's clock ends the collective at the
same time.

Reductions are formed in float32 from the cards' DLFloat16 values and rounded once when written back, as the
card's vector unit would; every rank adds the same values in the same order, so all ranks hold equal results.
Every function is collective: each rank of ``group`` calls it with its own card's tensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..card import interconnect
from ..runtime import stream as rt
from . import cards, tensor

LINK = ("d2h", "h2d")  # the card's PCIe port, both directions


def _card(t: torch.Tensor) -> int:
    if t.device.type != "spyre":
        raise ValueError(f"a card collective takes spyre tensors, got one on {t.device}")
    return t.device.index or 0


def ready_at(card: int) -> float:
    """Device time at which card ``card``'s current stream could start a collective."""
    return rt.current_stream(card).earliest_start(LINK)


def device_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t`` on the card (whole sticks): what the link moves."""
    return tensor.transfer_size(t).device_bytes


def seconds(op: str, nbytes: int, world: int) -> float:
    return interconnect.collective_seconds(cards.config(), op, nbytes, world)


def charge(card: int, op: str, nbytes: int, world: int, start: float = 0.0) -> rt.WorkRecord:
    """Queue collective ``op`` of ``nbytes`` per card among ``world`` cards on card ``card``'s current stream,
    no earlier than ``start`` (the latest :func:`ready_at` of the cards taking part)."""
    return rt.current_stream(card).enqueue(
        op, seconds(op, nbytes, world), kind="collective", resource=LINK[0], also=LINK[1:], not_before=start,
        details={"bytes": nbytes, "cards": world, "link": "pcie_p2p"})


def host_values(t: torch.Tensor) -> torch.Tensor:
    """The values of spyre tensor ``t`` on the host, not charged; 16-bit floats widened to float32 (DLFloat16
    reads exactly as float32, and sums of them are formed in float32 as the card's vector unit does)."""
    _card(t)
    wide = t.dtype in (torch.float16, torch.bfloat16)
    values, _ = tensor.read(t, as_dtype=torch.float32 if wide else None)
    return values


def store(t: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Write host ``values`` into spyre tensor ``t`` (one rounding to the card's encoding), not charged."""
    _card(t)
    tensor.write(t, values, computed_in_fp32=values.dtype == torch.float32 and t.dtype != torch.float32)
    return t


def new_on_card(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A new spyre tensor on ``like``'s card with ``like``'s dtype holding host ``values``, not charged."""
    out = torch.empty(values.shape, dtype=like.dtype, device=like.device)
    return store(out, values)


# --- the collectives ------------------------------------------------------------------------------
def agree_start(card: int, group: dist.ProcessGroup) -> float:
    """The latest time any card of ``group`` is ready for a collective."""
    ready = torch.tensor([ready_at(card)], dtype=torch.float64)
    dist.all_reduce(ready, op=dist.ReduceOp.MAX, group=group)
    return float(ready[0])


def _gathered(t: torch.Tensor, group: dist.ProcessGroup) -> list[torch.Tensor]:
    values = host_values(t)
    parts = [torch.empty_like(values) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, values, group=group)
    return parts


def all_reduce(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum ``t`` over the group's cards, in place."""
    card = _card(t)
    start = agree_start(card, group)
    values = host_values(t)
    dist.all_reduce(values, group=group)
    store(t, values)
    charge(card, "all_reduce", device_bytes(t), dist.get_world_size(group), start)
    return t


def all_gather(t: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Every card's ``t`` concatenated along ``dim`` (rank order), a new tensor on each card."""
    card = _card(t)
    start = agree_start(card, group)
    out = new_on_card(torch.cat(_gathered(t, group), dim=dim), t)
    charge(card, "all_gather", device_bytes(t), dist.get_world_size(group), start)
    return out


def gather(t: torch.Tensor, dst: int, dim: int, group: dist.ProcessGroup) -> torch.Tensor | None:
    """Every card's ``t`` concatenated along ``dim`` on the card of group rank ``dst``; None elsewhere. The values
    travel by an all-gather on the host; the card time is a gather's (the root receives them all)."""
    card = _card(t)
    start = agree_start(card, group)
    parts = _gathered(t, group)
    charge(card, "gather", device_bytes(t), dist.get_world_size(group), start)
    return new_on_card(torch.cat(parts, dim=dim), t) if dist.get_rank(group) == dst else None


def reduce_scatter(t: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum of every card's ``t``, split along ``dim``: each card gets its rank's slice (a new tensor)."""
    card, world = _card(t), dist.get_world_size(group)
    if t.shape[dim] % world:
        raise ValueError(f"reduce_scatter of a dim of {t.shape[dim]} over {world} cards: it must divide evenly")
    start = agree_start(card, group)
    values = host_values(t)
    dist.all_reduce(values, group=group)  # the sum; each card keeps its slice of it
    mine = values.chunk(world, dim=dim)[dist.get_rank(group)].contiguous()
    charge(card, "reduce_scatter", device_bytes(t), world, start)
    return new_on_card(mine, t)


def broadcast(t: torch.Tensor, src: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Group rank ``src``'s ``t`` written into every card's ``t``."""
    card = _card(t)
    start = agree_start(card, group)
    values = host_values(t)
    dist.broadcast(values, src=dist.get_global_rank(group, src), group=group)
    if dist.get_rank(group) != src:
        store(t, values)
    charge(card, "broadcast", device_bytes(t), dist.get_world_size(group), start)
    return t


__all__ = ["LINK", "agree_start", "all_gather", "all_reduce", "broadcast", "charge", "device_bytes", "gather",
           "host_values", "new_on_card", "ready_at", "reduce_scatter", "seconds", "store"]

"""The card-to-card link: how long a tensor-parallel collective takes between ``n`` cards.

Cards talk over PCIe peer to peer (``p2p_bandwidth`` per direction, ``p2p_latency_s`` per transfer:
docs/calibration.md). Each card has one x16 port, so a card sends and receives at once but a collective
occupies its port in both directions. Collectives are modeled as the ring algorithms NCCL-style libraries use
on such links (every card sends to the next and receives from the previous one in each step):

- all-reduce of ``B`` bytes: a reduce-scatter then an all-gather, ``2 (n-1)`` steps of ``B/n`` bytes;
- all-gather of ``B`` bytes per card: ``n-1`` steps of ``B`` bytes;
- reduce-scatter of ``B`` input bytes per card: ``n-1`` steps of ``B/n`` bytes;
- gather of ``B`` bytes per card to one card: the root's receiving direction carries ``(n-1) B`` bytes;
- broadcast, send/recv of ``B`` bytes: one transfer.

A step costs ``p2p_latency_s + bytes / p2p_bandwidth``. The additions of an all-reduce are not charged (a
vector pass over ``B/n`` bytes per step, small next to the transfer); neither is contention with host
transfers, which the caller serializes on the same port.
"""

from __future__ import annotations

from .config import CardConfig

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "gather", "broadcast", "send")


def transfer_seconds(cfg: CardConfig, nbytes: float) -> float:
    """One card-to-card transfer of ``nbytes``."""
    return cfg.p2p_latency_s + nbytes / cfg.p2p_bandwidth


def collective_seconds(cfg: CardConfig, op: str, nbytes: int, cards: int) -> float:
    """Simulated seconds of collective ``op`` among ``cards`` cards; ``nbytes`` is each card's input (device
    bytes). One card needs no link: 0."""
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(COLLECTIVES)}")
    if cards < 1:
        raise ValueError(f"a collective needs at least one card, got {cards}")
    if nbytes < 0:
        raise ValueError(f"negative size {nbytes} for {op}")
    if cards == 1:
        return 0.0
    steps = cards - 1
    if op == "all_reduce":
        return 2 * steps * transfer_seconds(cfg, nbytes / cards)
    if op == "all_gather":
        return steps * transfer_seconds(cfg, nbytes)
    if op == "reduce_scatter":
        return steps * transfer_seconds(cfg, nbytes / cards)
    if op == "gather":
        return transfer_seconds(cfg, steps * nbytes)
    return transfer_seconds(cfg, nbytes)  # broadcast, send

"""Which physical cores a kernel's work goes to: one policy, written once for every generator.

Device memory sits at one ring stop (``memory_ring_stop``); every DMA rides the ring between it and a
core. A kernel on fewer cores than the card has therefore takes the cores nearest the memory stop,
alternating between its two sides, so that its DRAM traffic splits over both ring directions instead of
queueing on the links on one side; every generator places its work lists this way. Cores that work
together (K-split partners of a matmul that exchange partial sums) sit on adjacent stops. How many cores
a kernel takes is ``core_count.py``'s rule.
"""

from __future__ import annotations

from ..card.config import CardConfig


def cores_near_memory(n: int, config: CardConfig) -> list[int]:
    """Physical cores for ``n`` independent work lists: the memory stop first, then outwards, one on
    each side in turn (clockwise first)."""
    m, total = config.memory_ring_stop, config.num_cores
    out: list[int] = []
    for k in range(total):
        for c in ((m + k) % total, (m - k) % total):
            if c not in out and len(out) < n:
                out.append(c)
    return out


def partner_groups(groups: int, k: int, config: CardConfig) -> list[tuple[int, ...]]:
    """``groups`` runs of ``k`` adjacent cores each (partner order along the ring): groups alternate
    between the two sides of the memory stop, the first starting at it and growing clockwise."""
    n, mem = config.num_cores, config.memory_ring_stop
    starts, up, down = [], mem, mem
    for g in range(groups):
        if g % 2 == 0:
            starts.append(up % n)
            up += k
        else:
            down -= k
            starts.append(down % n)
    return [tuple((s + q) % n for q in range(k)) for s in starts]

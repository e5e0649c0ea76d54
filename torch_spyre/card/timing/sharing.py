"""Fluid sharing of DRAM and ring links between the transfers in flight: max-min fair rates."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..config import CardConfig


class Sharing:
    """Max-min fair rates for the active flows, by progressive filling. Flows with the same signature get
    the same rate, so the solver works on signature classes and caches each distinct mix."""

    def __init__(self, config: CardConfig):
        self.link_bw = config.ring_link_bandwidth
        self.reduce_link_bw = config.reduction_ring_link_bandwidth
        self.t_read = 1.0 / config.dram_read_bandwidth
        self.t_write = 1.0 / config.dram_write_bandwidth
        mixed = config.dram_peak_bandwidth * config.dram_mixed_efficiency
        # Turnaround seconds per byte for a fully interleaved stream; an even mix then costs 1/mixed.
        self.t_turn = max(0.0, 2.0 / mixed - self.t_read - self.t_write)
        self.cache: dict[tuple, dict[tuple, float]] = {}

    def rates(self, classes: dict[tuple, int]) -> tuple[dict[tuple, float], dict[Any, float]]:
        """Rate per flow class, and the fraction of each resource's capacity those rates use."""
        key = tuple(sorted(classes.items()))
        if key not in self.cache:
            uses = self._uses(classes)
            rate = self._fill(classes, uses)
            self.cache[key] = (rate, self._occupancy(classes, uses, rate))
        return self.cache[key]

    def _occupancy(self, classes: dict[tuple, int], uses: dict, rate: dict[tuple, float]) -> dict[Any, float]:
        busy: dict[Any, float] = defaultdict(float)
        for sig, count in classes.items():
            for r, w in uses[sig]:
                busy[r] += count * rate[sig] * w / self._capacity(r)
        return dict(busy)

    def _dram_weights(self, classes: dict[tuple, int]) -> dict[str, float]:
        """DRAM seconds per byte for a read and a write, given the mix of active DRAM flows."""
        reads = sum(n for sig, n in classes.items() if sig[1] == "r")
        writes = sum(n for sig, n in classes.items() if sig[1] == "w")
        total = reads + writes
        if not total:
            return {}
        return {"r": self.t_read + self.t_turn * writes / total, "w": self.t_write + self.t_turn * reads / total}

    def _uses(self, classes: dict[tuple, int]) -> dict[tuple, list[tuple[Any, float]]]:
        dram = self._dram_weights(classes)
        uses = {}
        for sig in classes:
            links, direction, factor, _cap = sig
            use = [(link, 1.0) for link in links]
            if direction:
                use.append(("dram", dram[direction] * factor))
            uses[sig] = use
        return uses

    def _capacity(self, resource: Any) -> float:
        if resource == "dram":
            return 1.0  # DRAM time: one second per second
        return self.reduce_link_bw if resource[0] == "reduce" else self.link_bw

    def _fill(self, classes: dict[tuple, int], uses: dict[tuple, list[tuple[Any, float]]]) -> dict[tuple, float]:
        left = {r: self._capacity(r) for use in uses.values() for r, _ in use}
        rate = {sig: 0.0 for sig in classes}
        active = dict(classes)
        while active:
            load: dict[Any, float] = defaultdict(float)
            for sig, count in active.items():
                for r, w in uses[sig]:
                    load[r] += w * count
            step = min([left[r] / load[r] for r in load if load[r] > 0] + [sig[3] - rate[sig] for sig in active])
            for sig in active:
                rate[sig] += step
            for r, l in load.items():
                left[r] -= step * l
            full = {r for r in load if left[r] <= 1e-9 * self._capacity(r)}
            for sig in list(active):
                if rate[sig] >= sig[3] * (1 - 1e-12) or any(r in full for r, _ in uses[sig]):
                    del active[sig]
        return rate


"""Fluid sharing of DRAM and ring links between the transfers in flight: max-min fair rates."""

from __future__ import annotations

from typing import Any

from ..config import CardConfig

_CAP_TOLERANCE = 1 - 1e-12  # a flow at this fraction of its engine's cap is capped


class Sharing:
    """Max-min fair rates for the active flows, by progressive filling. Flows with the same signature get
    the same rate, so the solver works on signature classes and caches each distinct mix.

    Signatures are interned: the simulation passes ``{signature id: flow count}`` (ids from :meth:`intern`),
    in the order the flows became active, which is the order the filling adds up loads in."""

    def __init__(self, config: CardConfig):
        self.link_bw = config.ring_link_bandwidth
        self.reduce_link_bw = config.reduction_ring_link_bandwidth
        self.t_read = 1.0 / config.dram_read_bandwidth
        self.t_write = 1.0 / config.dram_write_bandwidth
        mixed = config.dram_peak_bandwidth * config.dram_mixed_efficiency
        # Turnaround seconds per byte for a fully interleaved stream; an even mix then costs 1/mixed.
        self.t_turn = max(0.0, 2.0 / mixed - self.t_read - self.t_write)
        self.cache: dict[frozenset, tuple[dict[int, float], dict[Any, float]]] = {}
        self.signatures: list[tuple] = []  # id -> (links, dram direction, dram factor, cap)
        self._ids: dict[tuple, int] = {}
        self._capacities: dict[Any, float] = {}
        self._link_uses: dict[int, list[tuple[Any, float, float]]] = {}

    def intern(self, signature: tuple) -> int:
        """The id of a flow signature ``(links, dram direction, dram factor, cap)``."""
        sid = self._ids.get(signature)
        if sid is None:
            sid = self._ids[signature] = len(self.signatures)
            self.signatures.append(signature)
        return sid

    def rates(self, classes: dict[int, int]) -> tuple[dict[int, float], dict[Any, float]]:
        """Rate per signature id, and the fraction of each resource's capacity those rates use."""
        key = frozenset(classes.items())
        found = self.cache.get(key)
        if found is None:
            uses = self._uses(classes)
            rate = self._fill(classes, uses)
            found = self.cache[key] = (rate, self._occupancy(classes, uses, rate))
        return found

    def _occupancy(self, classes: dict[int, int], uses: dict, rate: dict[int, float]) -> dict[Any, float]:
        busy: dict[Any, float] = {}
        for sid, count in classes.items():
            r_sig = rate[sid]
            for r, w, cap in uses[sid]:
                busy[r] = busy.get(r, 0.0) + count * r_sig * w / cap
        return busy

    def _dram_weights(self, classes: dict[int, int]) -> dict[str, float]:
        """DRAM seconds per byte for a read and a write, given the mix of active DRAM flows."""
        sigs = self.signatures
        reads = sum(n for sid, n in classes.items() if sigs[sid][1] == "r")
        writes = sum(n for sid, n in classes.items() if sigs[sid][1] == "w")
        total = reads + writes
        if not total:
            return {}
        return {"r": self.t_read + self.t_turn * writes / total, "w": self.t_write + self.t_turn * reads / total}

    def _uses(self, classes: dict[int, int]) -> dict[int, list[tuple[Any, float, float]]]:
        """Per class: (resource, its seconds or bytes per byte moved, the resource's capacity)."""
        dram = self._dram_weights(classes)
        uses = {}
        for sid in classes:
            links = self._link_uses.get(sid)
            if links is None:
                links = self._link_uses[sid] = [(link, 1.0, self._capacity(link)) for link in self.signatures[sid][0]]
            direction, factor = self.signatures[sid][1:3]
            uses[sid] = links + [("dram", dram[direction] * factor, self._capacity("dram"))] if direction else links
        return uses

    def _capacity(self, resource: Any) -> float:
        cap = self._capacities.get(resource)
        if cap is None:
            if resource == "dram":
                cap = 1.0  # DRAM time: one second per second (also in _uses)
            else:
                cap = self.reduce_link_bw if resource[0] == "reduce" else self.link_bw
            self._capacities[resource] = cap
        return cap

    def _fill(self, classes: dict[int, int], uses: dict[int, list[tuple[Any, float]]]) -> dict[int, float]:
        """Progressive filling: raise every unfrozen class's rate by the largest step no resource and no
        engine cap forbids, freeze the classes on a full resource or at their cap, repeat.

        Resources are numbered and each class's load ``weight x count`` is computed once; every resource's
        load is still summed over the classes in their order, so the figures are those of the plain
        dict-based form (tests/card/test_timing.py checks them against it)."""
        index: dict[Any, int] = {}
        left: list[float] = []
        sids = list(classes)
        paths: list[list[tuple[int, float]]] = []
        for sid in sids:
            count = classes[sid]
            path = []
            for r, w, cap in uses[sid]:
                ri = index.get(r)
                if ri is None:
                    ri = index[r] = len(left)
                    left.append(cap)
                path.append((ri, w * count))
            paths.append(path)
        on_path = [{r for r, _ in path} for path in paths]
        full_at = [1e-9 * c for c in left]
        caps = [self.signatures[sid][3] for sid in sids]
        rate = [0.0] * len(sids)
        active = list(range(len(sids)))
        n_res = len(left)
        while active:
            load = [0.0] * n_res
            for i in active:
                for r, wc in paths[i]:
                    load[r] += wc
            loaded = [r for r in range(n_res) if load[r] > 0]
            step = min([left[r] / load[r] for r in loaded] + [caps[i] - rate[i] for i in active])
            for i in active:
                rate[i] += step
            for r in loaded:
                left[r] -= step * load[r]
            full = {r for r in loaded if left[r] <= full_at[r]}
            active = [i for i in active if not (rate[i] >= caps[i] * _CAP_TOLERANCE or not full.isdisjoint(on_path[i]))]
        return dict(zip(sids, rate))

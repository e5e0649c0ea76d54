"""Schedules: which values each step of a tile computes (tile-independent), with recomputation when a
reduction does not fit one chunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .analysis import Chunk
from .dag import Dag
from .values import Value


@dataclass
class Step:
    kind: str  # "full" or "outer"
    phase: int
    chunk: Chunk
    values: list[int]
    loads: list[int] = field(default_factory=list)  # access gids whose sticks this step's group loads
    parity: int = 0


class Scheduler:
    """Tile-independent decisions: which values each phase computes, with recomputation when a
    reduction is chunked (``persistent`` False)."""

    def __init__(self, dag: Dag, aliases: dict[int, int], persistent: bool):
        self.dag, self.aliases, self.persistent = dag, aliases, persistent

    def deps(self, gid: int) -> list[int]:
        if gid in self.aliases:
            return [self.aliases[gid]]
        v = self.dag.values[gid]
        return self.dag.inputs(v) + list(v.attrs.get("guards", []))

    def closure(self, roots: Iterable[int], extent: str, done: set[int]) -> list[int]:
        """Roots and their not-yet-computed ancestors of ``extent``, in topological (gid) order."""
        seen: set[int] = set()
        root_set = set(roots)
        stack = list(roots)
        while stack:
            g = stack.pop()
            if g in seen or g in done:
                continue
            v = self.dag.values[g]
            if g not in root_set and (v.op == "reduction" or v.extent not in (extent, "scalar", "static")):
                continue
            seen.add(g)
            stack.extend(self.deps(g))
        return sorted(seen)

    def full_roots(self, phase: int) -> list[int]:
        """What pass ``phase`` must produce: its reductions, stores of full values, and full values a
        later pass reads."""
        return [v.gid for v in self.dag.values if v.phase == phase and (
            v.op == "reduction" or v.extent == "full" and (v.op == "store" or self._consumed_outside(v, phase)))]

    def _consumed_outside(self, v: Value, phase: int) -> bool:
        for u in self.dag.values:
            if v.gid in self.deps(u.gid) and (u.extent != "full" or u.phase != phase):
                return True
        return False

    def outer_roots(self, stage: int) -> list[int]:
        return [v.gid for v in self.dag.values
                if v.extent == "outer" and v.phase == stage and v.op not in ("load", "reduction")]

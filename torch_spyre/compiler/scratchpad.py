"""Scratchpad planning: place a kernel's on-chip buffers by liveness, never past the plannable capacity.

Every generator (pointwise/reduction, matmul, attention, gather) describes the scratchpad buffers one
core needs as :class:`SpBuffer` (size and the program steps between which it is live) and asks
:func:`plan` for byte offsets. Buffers whose lifetimes do not overlap may share bytes. The plan is
greedy (largest first, lowest fitting offset), 128-byte aligned, and raises
:class:`ScratchpadOverflowError` — naming the live buffers at the worst step and the bytes needed —
when it cannot fit; the caller then tiles smaller. The card's validator checks the result again.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpyreError
from ..program import STICK_BYTES



class ScratchpadOverflowError(SpyreError, ValueError):
    """A scratchpad plan that cannot fit in the plannable capacity."""

    def __init__(self, needed: int, capacity: int, live: list["SpBuffer"], step: int):
        self.needed, self.capacity, self.live, self.step = needed, capacity, live, step
        names = ", ".join(f"{b.name} ({b.nbytes} B)" for b in sorted(live, key=lambda b: -b.nbytes))
        super().__init__(
            f"scratchpad plan needs {needed} bytes at step {step} but only {capacity} bytes are plannable "
            f"per core; live buffers: {names}. Use smaller tiles or split the work over more cores."
        )


@dataclass
class SpBuffer:
    """A scratchpad buffer of one core, live from step ``start`` to step ``end`` (inclusive)."""

    name: str
    nbytes: int
    start: int = 0
    end: int = 1 << 30
    offset: int | None = None  # set by plan()

    @property
    def aligned_bytes(self) -> int:
        return -(-self.nbytes // STICK_BYTES) * STICK_BYTES

    def overlaps_in_time(self, other: "SpBuffer") -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass
class ScratchpadPlan:
    buffers: list[SpBuffer]
    capacity: int

    @property
    def peak_bytes(self) -> int:
        return max((b.offset + b.aligned_bytes for b in self.buffers), default=0)

    def offset(self, name: str) -> int:
        for b in self.buffers:
            if b.name == name:
                return b.offset  # type: ignore[return-value]
        raise KeyError(name)

    def describe(self) -> str:
        lines = [f"scratchpad: {self.peak_bytes} of {self.capacity} plannable bytes ({100 * self.peak_bytes / self.capacity:.1f}%)"]
        for b in sorted(self.buffers, key=lambda b: b.offset or 0):
            lines.append(f"  [{b.offset:#08x}, {b.offset + b.aligned_bytes:#08x}) {b.name}: {b.nbytes} B, live steps {b.start}..{b.end}")
        return "\n".join(lines)


def _max_live_bytes(buffers: list[SpBuffer]) -> tuple[int, int, list[SpBuffer]]:
    """The step with the most live bytes: (bytes, step, live buffers). A lower bound for any plan."""
    steps = sorted({b.start for b in buffers})
    best = (0, 0, [])
    for s in steps:
        live = [b for b in buffers if b.start <= s <= b.end]
        total = sum(b.aligned_bytes for b in live)
        if total > best[0]:
            best = (total, s, live)
    return best


def plan(buffers: list[SpBuffer], capacity: int) -> ScratchpadPlan:
    """Assign offsets so that buffers live at the same time never share bytes."""
    need, step, live = _max_live_bytes(buffers)
    if need > capacity:
        raise ScratchpadOverflowError(need, capacity, live, step)
    placed: list[SpBuffer] = []
    for b in sorted(buffers, key=lambda b: (-b.aligned_bytes, b.start, b.name)):
        taken = sorted(
            ((p.offset, p.offset + p.aligned_bytes) for p in placed if p.overlaps_in_time(b)),
        )
        offset = 0
        for lo, hi in taken:
            if offset + b.aligned_bytes <= lo:
                break
            offset = max(offset, hi)
        if offset + b.aligned_bytes > capacity:
            # Fragmentation beat the greedy order even though the live total fits.
            raise ScratchpadOverflowError(offset + b.aligned_bytes, capacity, [p for p in placed if p.overlaps_in_time(b)] + [b], b.start)
        b.offset = offset
        placed.append(b)
    return ScratchpadPlan(placed, capacity)

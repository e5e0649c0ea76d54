"""What one execution did, per core and engine: counts and bytes, never time (that is card/timing)."""

from __future__ import annotations

from dataclasses import dataclass, field

ENGINES = ("dma", "pe", "vector", "ring", "sync")


@dataclass
class ExecutionStats:
    """What one execution did (counts and bytes; no time)."""

    instructions: dict[int, dict[str, int]] = field(default_factory=dict)  # core -> engine -> count
    dma_read_bytes: dict[int, int] = field(default_factory=dict)  # core -> bytes device -> scratchpad
    dma_write_bytes: dict[int, int] = field(default_factory=dict)  # core -> bytes scratchpad -> device
    ring_bytes: dict[int, int] = field(default_factory=dict)  # core -> bytes it sent over the ring

    def _add(self, table: dict[int, int], core: int, n: int) -> None:
        table[core] = table.get(core, 0) + n

    def count(self, core: int, engine: str) -> None:
        per = self.instructions.setdefault(core, dict.fromkeys(ENGINES, 0))
        per[engine] += 1

    @property
    def total_instructions(self) -> dict[str, int]:
        out = dict.fromkeys(ENGINES, 0)
        for per in self.instructions.values():
            for engine, n in per.items():
                out[engine] += n
        return out

    @property
    def total_dma_read_bytes(self) -> int:
        return sum(self.dma_read_bytes.values())

    @property
    def total_dma_write_bytes(self) -> int:
        return sum(self.dma_write_bytes.values())

    @property
    def total_ring_bytes(self) -> int:
        return sum(self.ring_bytes.values())

"""Reuse of finished timings: a program timed before, up to the names of its operands, times the same.

Timing depends only on the instructions (never on data, addresses or names; operand names only say which
DMA accesses share an address space), so a key that renames operands by order of first use identifies
the result. A compiled model repeats its kernels (one per layer, same shapes, other weights), so most of
a first call's programs are found here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...program import DmaGather, DmaLoad, DmaStore, Program
from ..config import CardConfig
from ...util.bounded_cache import BoundedCache
from .report import ProgramTiming


def program_key(program: Program, config: CardConfig) -> tuple:
    """The program's instructions per core with each DMA's operand name replaced by its order of first
    use (any other instruction stands for itself: frozen dataclasses compare by value)."""
    names: dict[str, int] = {}
    cores = []
    for core in sorted(program.cores):
        key: list[Any] = []
        for ins in program.cores[core]:
            cls = type(ins)
            if cls is DmaLoad:
                key.append((cls, names.setdefault(ins.src.operand, len(names)), ins.src.offset, ins.sp_offset, ins.pattern))
            elif cls is DmaStore:
                key.append((cls, names.setdefault(ins.dst.operand, len(names)), ins.dst.offset, ins.sp_offset, ins.pattern))
            elif cls is DmaGather:
                key.append((cls, names.setdefault(ins.src.operand, len(names)), ins.src.offset, ins.index,
                            ins.row_stride, ins.row_sticks, ins.sp_offset, ins.num_rows))
            else:
                key.append(ins)
        cores.append((core, tuple(key)))
    return config, tuple(cores)


class TimingMemo:
    """The last ``size`` timings by :func:`program_key`; a hit is returned under the asking program's name,
    with containers of its own (a caller may modify what it gets)."""

    def __init__(self, size: int = 256):
        self._results: BoundedCache[tuple, ProgramTiming] = BoundedCache(size)

    @property
    def size(self) -> int:
        return self._results.bound

    def get(self, key: tuple, program: Program, config: CardConfig) -> ProgramTiming | None:
        hit = self._results.get(key)
        return None if hit is None else _copy(hit, program.name, config)

    def put(self, key: tuple, timing: ProgramTiming) -> ProgramTiming:
        self._results.put(key, _copy(timing, timing.program_name, timing.config))
        return timing

    def clear(self) -> None:
        self._results.clear()


def _copy(t: ProgramTiming, name: str, config: CardConfig) -> ProgramTiming:
    return replace(t, program_name=name, intervals=list(t.intervals), busy_s={c: dict(e) for c, e in t.busy_s.items()},
                   bytes=dict(t.bytes), config=config)

"""Chunks and cores of a gather: index positions cut into chunks (whole index rows, pieces of a row, or
column blocks across rows, whichever gives the output the fewest DRAM bursts), how many positions a
chunk holds (the scratchpad and the core count decide) and consecutive chunks dealt to the cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torch_spyre.card.config import CardConfig
from torch_spyre.compiler.codegen.gather.rows import _RowSticks, _out_sticks
from torch_spyre.compiler.codegen.gather.spec import GatherSpec, _Plan
from torch_spyre.compiler.codegen.sticks import dram_runs
from torch_spyre.compiler.core_count import CoreCount, cores_for, dma_cycles
from torch_spyre.program import STICK_BYTES


@dataclass(frozen=True)
class _Chunk:
    r0: int  # rows [r0, r1) of the index's leading dims (flattened), columns [c0, c1) of its last dim
    r1: int
    c0: int
    c1: int

    @property
    def size(self) -> int:
        return (self.r1 - self.r0) * (self.c1 - self.c0)


def _chunks(n_rows: int, n_cols: int, per_chunk: int, lanes: int, rows_alike: bool = True) -> list[_Chunk]:
    """Chunks of at most ``per_chunk`` positions: whole index rows, or pieces of one row (stick-aligned
    unless a chunk is smaller than a stick). Only rows that start at the same lane of their sticks
    (``rows_alike``) share a chunk: a chunk's index sticks are read as one tile."""
    if n_cols <= per_chunk:
        step = max(1, per_chunk // n_cols) if rows_alike else 1
        return [_Chunk(r, min(n_rows, r + step), 0, n_cols) for r in range(0, n_rows, step)]
    # Whole index sticks when chunks are big; smaller chunks share an index stick (cores only read it).
    seg = per_chunk // lanes * lanes if per_chunk >= lanes else per_chunk
    return [_Chunk(r, r + 1, c, min(n_cols, c + seg)) for r in range(n_rows) for c in range(0, n_cols, seg)]


def _chunk_plans(n_rows: int, n_cols: int, per_chunk: int, lanes: int,
                 rows_alike: bool = True) -> dict[str, list[_Chunk]]:
    """Ways to cut the index positions into chunks: along its rows (above), or, when every row fits in
    a chunk, all rows by a few columns — the output then gets one DRAM burst across rows when its layout
    interleaves them (IBM's layout puts the first dim innermost, e.g. the batch of [B, L, D]). Chunks
    of several rows need ``rows_alike``: every index row starting at the same lane of its stick."""
    plans = {"row pieces": _chunks(n_rows, n_cols, per_chunk, lanes, rows_alike)}
    if rows_alike and 1 < n_rows <= per_chunk and n_cols > 1:
        cols = max(1, per_chunk // n_rows)
        plans["column blocks"] = [_Chunk(0, n_rows, c, min(n_cols, c + cols)) for c in range(0, n_cols, cols)]
    return plans


def _choose_chunks(p: _Plan, rows: "_RowSticks", plans: dict[str, list[_Chunk]]) -> tuple[str, list[_Chunk], dict]:
    """The plan whose first chunk's output sticks make the fewest DRAM bursts per position."""
    C = p.index.shape[-1]
    scores = {}
    for name, chunks in plans.items():
        c = chunks[0]
        positions = (np.arange(c.r0, c.r1)[:, None] * C + np.arange(c.c0, c.c1)[None, :]).reshape(-1)
        scores[name] = round(dram_runs(_out_sticks(p, rows, positions)) / c.size, 3)
    best = min(plans, key=lambda n: scores[n])
    return best, plans[best], scores


def _split(chunks: list[_Chunk], cores: int) -> list[list[_Chunk]]:
    """Consecutive chunks per core, about the same number of positions each."""
    total = sum(c.size for c in chunks)
    out: list[list[_Chunk]] = [[]]
    done = 0
    for c in chunks:
        if out[-1] and done >= total * len(out) / cores and len(out) < cores:
            out.append([])
        out[-1].append(c)
        done += c.size
    return out


def _chunk_size(p: _Plan, rows: _RowSticks, spec: GatherSpec, config: CardConfig, cores: int) -> int:
    """Positions per chunk: enough to spread the work over ``cores`` cores, no more than two buffer sets
    of gathered rows (plus the index sticks) fit in the scratchpad."""
    n = int(np.prod(p.index.shape))
    if spec.chunk:
        return spec.chunk
    row_bytes = rows.sticks_per_key * len(rows.keys) * STICK_BYTES
    fit = (config.scratchpad_plannable_bytes // 2 - 4 * STICK_BYTES) // (row_bytes + p.index.layout.itemsize)
    spread = -(-n // cores)
    return max(1, min(fit, spread))


def _core_count(p: _Plan, rows: _RowSticks, config: CardConfig) -> CoreCount:
    """Cores for a row gather (``core_count``): its work is DMA, each position's row sticks gathered
    into scratchpad and stored again, plus the index sticks."""
    n = int(np.prod(p.index.shape))
    row_bytes = rows.sticks_per_key * len(rows.keys) * STICK_BYTES
    return cores_for(dma_cycles(config, n * (2 * row_bytes + p.index.layout.itemsize)), config, parts=n)


def _lead_coords(shape: tuple[int, ...], r0: int, r1: int) -> np.ndarray:
    """Coordinates of rows [r0, r1) over all dims but the last ([n, ndim-1])."""
    if len(shape) <= 1:
        return np.zeros((r1 - r0, 0), dtype=np.int64)
    return np.stack(np.unravel_index(np.arange(r0, r1), shape[:-1]), axis=1).astype(np.int64)

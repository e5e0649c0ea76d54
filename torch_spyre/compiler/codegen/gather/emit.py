"""Emission of a row gather's chunk: load the chunk's index sticks, one DmaGather per contiguous run of
a source row's sticks, store the gathered sticks to the output rows (compressed DMA patterns)."""

from __future__ import annotations

import numpy as np

from torch_spyre.compiler.codegen.gather.plan import _Chunk, _lead_coords
from torch_spyre.compiler.codegen.gather.rows import _RowSticks, _out_sticks
from torch_spyre.compiler.codegen.gather.spec import _Plan
from torch_spyre.compiler.codegen.sticks import dma_tile
from torch_spyre.program import STICK_BYTES, Addr, DmaGather, Instruction, SpTensor


def _emit_chunk(p: _Plan, rows: _RowSticks, c: _Chunk, buf: dict[str, int], parity: int) -> list[Instruction]:
    """Load the chunk's indices, gather each run of row sticks, store the gathered sticks to the output."""
    idx = p.index
    ins: list[Instruction] = []
    dev, lane0 = idx.row_sticks(_lead_coords(idx.shape, c.r0, c.r1), c.c0, c.c1 - c.c0)
    ins += dma_tile(idx, dev, buf[f"idx{parity}"], store=False)
    width = dev.shape[1] * idx.lanes
    isz = idx.layout.itemsize
    index = SpTensor(buf[f"idx{parity}"] + lane0 * isz, idx.dtype, (c.r1 - c.r0, c.c1 - c.c0), (width, 1))
    n = c.size
    base = buf[f"rows{parity}"]
    offsets = []
    for first, length in rows.runs:
        offsets.append(base)
        ins.append(DmaGather(Addr(p.source.name, first * STICK_BYTES), index, rows.stride * STICK_BYTES, length,
                             base, p.num_rows))
        base += n * length * STICK_BYTES
    C = idx.shape[-1]
    positions = (np.arange(c.r0, c.r1)[:, None] * C + np.arange(c.c0, c.c1)[None, :]).reshape(-1)
    # [index rows, index columns, sticks]: keeping the chunk's two axes apart lets a store pattern
    # follow each one's own device stride.
    out_dev = _out_sticks(p, rows, positions).reshape(c.r1 - c.r0, c.c1 - c.c0, -1)
    lengths = {length for _, length in rows.runs}
    if len(lengths) == 1:  # every run alike: one (multi-loop) store pattern for all of them
        L = lengths.pop()
        tiles = out_dev.reshape(c.r1 - c.r0, c.c1 - c.c0, -1, L).transpose(2, 0, 1, 3)
        ins += dma_tile(p.out, tiles, offsets[0], store=True)
    else:
        col = 0
        for off, (_, length) in zip(offsets, rows.runs):
            ins += dma_tile(p.out, out_dev[:, :, col:col + length], off, store=True)
            col += length
    return ins

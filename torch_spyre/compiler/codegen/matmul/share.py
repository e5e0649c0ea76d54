"""Operands shared over the ring: an A tile is loaded from device memory once and forwarded core to core.

The cores of one row of the split (same batches, rows and K range, other N columns) stream the very same
A tiles in the same order. With ``Tiles.share == "a"`` only one core of each such row (the middle of the
arc of ring stops the row spans) loads them; it sends each tile to its neighbours in the row both ways
round the ring, and each of them forwards it to the next, and so on (two chains over ring-adjacent
cores). DRAM and its ring links then carry A once per row instead of once per core.

A receiving core's A buffers are reused (double buffering, or a resident A reloaded per batch pass), so a
sender may only overwrite a buffer of its successor once the successor is done with the tile it held:
the successor signals a credit after its last reader of that tile (one tag per buffer), and the sender
waits for it before the send that reuses the buffer. The forwarding send goes right after the tile has
arrived, ahead of the core's own matmuls on it.

:func:`share_a` rewrites the per-core instruction streams the emitter wrote (``emit.py`` records where
its A loads are); :func:`rows_sharing_a` says which cores form a row, for the cost model too.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from ....card.config import CardConfig
from ....program import DmaLoad, DmaStore, Elementwise, Instruction, MatMul, RingRecv, RingSend, Signal, SpTensor, Wait
from .plan import _CoreWork

A_TAG = 2  # the K-split chain uses tags 0 and 1
CREDIT_TAG = 16  # + the index of the A buffer the credit frees


def rows_sharing_a(work: Sequence[_CoreWork], cfg: CardConfig, at_memory: bool = False) -> list[list[_CoreWork]]:
    """The cores that stream the same A tiles (same batches, rows and K range), each row in ring order
    along the arc its cores span (clockwise from the end of the largest gap between them). A row of every
    core has no gap: it is turned so that the core at the memory stop is in the middle (the loader, see
    :func:`forwarding`): its A loads then cross no ring link, and the chains run away from the memory
    stop, against the output stores (the middle of an arbitrary turn loaded A 16 links away and sent it
    back towards the memory stop beside every store: 1024x4096x4096 606.7 -> 593.0 us). Only with
    ``at_memory`` (the matmul generator): the fused MLP's rows measured slower that way (Granite's MLP
    2,458.8 -> 2,504.4 us), so it keeps the turn from the largest gap."""
    rows: dict[tuple, list[_CoreWork]] = defaultdict(list)
    for w in work:
        rows[(w.batches, w.rows, w.kcols)].append(w)
    n, mem = cfg.num_cores, cfg.memory_ring_stop
    out = []
    for ws in rows.values():
        ws = sorted(ws, key=lambda w: (w.core - mem) % n)
        gaps = [((ws[(i + 1) % len(ws)].core - w.core) % n, i) for i, w in enumerate(ws)]
        _, after = max(gaps, key=lambda g: (g[0], -g[1]))  # the widest gap (nearest the memory stop on a tie)
        start = (after + 1) % len(ws)
        if at_memory and len(ws) == n:  # the whole ring: the memory stop's core in the middle loads (its loads cross no link)
            start = (ws.index(next(w for w in ws if w.core == mem)) - n // 2) % n
        out.append(ws[start:] + ws[:start])
    return out


def forwarding(row: Sequence[_CoreWork]) -> tuple[int, list[tuple[int, int]]]:
    """The row's loading core (the middle of its arc) and the hops (sender, receiver) of the two chains
    running from it both ways round the ring: half the hops each, so the last core waits half as long."""
    cores = [w.core for w in row]
    mid = len(cores) // 2
    hops = [(cores[i - 1], cores[i]) for i in range(mid + 1, len(cores))]
    hops += [(cores[i + 1], cores[i]) for i in range(mid - 1, -1, -1)]
    return cores[mid], hops


def _reads(ins: Instruction) -> list[tuple[int, int]]:
    """Scratchpad byte ranges an instruction of a matmul program reads."""
    if isinstance(ins, MatMul):
        return [ins.a.byte_span(), ins.b.byte_span()] + ([ins.out.byte_span()] if ins.accumulate else [])
    if isinstance(ins, Elementwise):
        return [t.byte_span() for t in ins.inputs if isinstance(t, SpTensor)]
    if isinstance(ins, DmaStore):
        return [ins.pattern.sp_range(ins.sp_offset)]
    if isinstance(ins, RingSend):
        return [(ins.src_offset, ins.src_offset + ins.nbytes)]
    return []


def _tile_range(ins: DmaLoad) -> tuple[int, int] | None:
    """The scratchpad bytes an A load writes, if they are contiguous (a ring send moves one range)."""
    lo, hi = ins.pattern.sp_range(ins.sp_offset)
    return (lo, hi) if hi - lo == ins.pattern.nbytes else None


def share_a(cores: dict[int, list[Instruction]], a_loads: dict[int, list[int]], work: Sequence[_CoreWork],
            cfg: CardConfig, tag: int = A_TAG, credit_tag: int = CREDIT_TAG,
            at_memory: bool = False) -> tuple[dict[int, list[Instruction]], list[str]]:
    """The streams with each row's A loads replaced by one load and forwarding chains; and notes on rows
    left as they were (their cores' A loads differ, or a tile is not one contiguous range). A program that
    shares two operands this way gives the second its own ``tag`` and ``credit_tag`` (codegen/mlp)."""
    out, notes = dict(cores), []
    for row in rows_sharing_a(work, cfg, at_memory):
        if len(row) < 2:
            continue
        members = [w.core for w in row]
        loads = [[cores[c][i] for i in a_loads[c]] for c in members]
        ranges = [_tile_range(ins) for ins in loads[0]]
        if any(ls != loads[0] for ls in loads[1:]) or None in ranges:
            notes.append(f"cores {members}: A loads differ or are not contiguous; each loads its own")
            continue
        head, hops = forwarding(row)
        prev = {v: u for u, v in hops}
        succs: dict[int, list[int]] = defaultdict(list)
        for u, v in hops:
            succs[u].append(v)
        slots = sorted({lo for lo, _ in ranges})
        for core in members:
            out[core] = _rewrite(cores[core], a_loads[core], ranges, slots, prev.get(core), succs[core], tag, credit_tag)
    return out, notes


def _rewrite(ins: list[Instruction], a_loads: list[int], ranges: list[tuple[int, int]], slots: list[int],
             prev: int | None, succs: list[int], tag: int = A_TAG, credit_tag: int = CREDIT_TAG) -> list[Instruction]:
    at = {idx: j for j, idx in enumerate(a_loads)}
    # Where each tile's buffer is next reused (by tile index), and after which instruction its last reader
    # runs: that is where the receiver frees the buffer with a credit.
    next_use: dict[int, int] = {}
    last: dict[int, int] = {}
    for j, (lo, _) in enumerate(ranges):
        if lo in last:
            next_use[last[lo]] = j
        last[lo] = j
    credit_after: dict[int, list[int]] = defaultdict(list)  # instruction index -> tiles freed after it
    if prev is not None:
        for j, j2 in next_use.items():
            lo, hi = ranges[j]
            last_reader = a_loads[j]
            for i in range(a_loads[j] + 1, a_loads[j2]):
                if any(r_lo < hi and lo < r_hi for r_lo, r_hi in _reads(ins[i])):
                    last_reader = i
            credit_after[last_reader].append(j)
    reused = set(next_use.values())
    new: list[Instruction] = []
    for i, x in enumerate(ins):
        j = at.get(i)
        if j is None:
            new.append(x)
        else:
            lo, hi = ranges[j]
            new.append(x if prev is None else RingRecv(prev, tag=tag))
            for nxt in succs:
                if j in reused:
                    new.append(Wait(nxt, tag=credit_tag + slots.index(lo)))
                new.append(RingSend(nxt, lo, lo, hi - lo, tag=tag))
        for freed in credit_after.get(i, ()):
            new.append(Signal(prev, tag=credit_tag + slots.index(ranges[freed][0])))
    return new

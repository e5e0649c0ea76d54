"""Tiling and work division of attention: the tilings to consider (block sizes, GQA heads, batches and
lane heads stacked in one tile), the work items a tiling makes, and which core runs which items."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from torch_spyre.compiler.access import CodegenError, TensorView
from torch_spyre.compiler.codegen.attention.spec import AttentionSpec, _Dims

BLOCK_Q_CHOICES = (32, 64, 128, 256)
BLOCK_K_CHOICES = (64, 128, 256, 512)
MAX_TILE_ROWS = 512  # rows of a stacked Q tile (heads_per_tile * block_q)


@dataclass(frozen=True)
class Tiling:
    block_q: int
    block_k: int
    heads_per_tile: int  # query heads of one GQA group stacked in a tile
    batches_per_tile: int = 1  # batches stacked too: IBM's layout interleaves batch stick by stick
    lane_heads: int = 1  # heads side by side in the same sticks (e.g. heads of 32 in a fused qkv buffer)
    pack_out: bool = False  # the lane heads' outputs share sticks too: stored together, one row per stick row
    out_slots: int = 2  # output tiles per core: 2 alternate; more hold every item's output to store at the end
    # Roles ("query", "key", "value") whose lane heads do not share sticks (e.g. K and V in buffers of
    # their own while the output packs heads): loaded member by member, each its own rows of the tile.
    apart: tuple[str, ...] = ()

    def rows(self) -> int:
        return self.block_q * self.heads_per_tile * self.batches_per_tile * self.lane_heads


@dataclass
class WorkItem:
    """A tile's work. Its query heads are ``members`` groups (one unless heads sit side by side in the
    same sticks) of stacked heads sharing a K/V head; S rows are ordered (batch, member, head, row)."""

    batches: tuple[int, ...]
    kv_heads: tuple[int, ...]  # K/V head of each member
    heads: tuple[int, ...]  # query heads, member-major
    q0: int
    nq: int
    k_blocks: list[tuple[int, int]]  # (k0, nk) streamed for this item
    skipped: int  # key blocks above the causal diagonal
    apart: tuple[str, ...] = ()  # Tiling.apart

    @property
    def members(self) -> int:
        return len(self.kv_heads)

    @property
    def stacked(self) -> tuple[int, ...]:
        """The heads of the first member (the rows loaded; other members share their sticks)."""
        return self.heads[: len(self.heads) // self.members]

    @property
    def rows(self) -> int:
        return self.nq * len(self.heads) * len(self.batches)

    @property
    def sub_rows(self) -> int:
        """Rows of one (batch, member) sub-tile: its stacked heads."""
        return self.nq * len(self.stacked)


def _work_items(dims: _Dims, t: Tiling, causal: bool) -> list[WorkItem]:
    items = []
    all_blocks = [(k0, min(t.block_k, dims.Lk - k0)) for k0 in range(0, dims.Lk, t.block_k)]
    for b0 in range(0, dims.B, t.batches_per_tile):
        batches = tuple(range(b0, min(dims.B, b0 + t.batches_per_tile)))
        for heads, kv_heads in _head_sets(dims, t):
            for q0 in range(0, dims.Lq, t.block_q):
                nq = min(t.block_q, dims.Lq - q0)
                # Causal: query i sees keys j <= i, so nothing at or past q0 + nq.
                blocks = [kb for kb in all_blocks if not causal or kb[0] < q0 + nq]
                items.append(WorkItem(batches, kv_heads, heads, q0, nq, blocks, len(all_blocks) - len(blocks),
                                      t.apart))
    return items


def _head_sets(dims: _Dims, t: Tiling) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(query heads, K/V head per member) of each tile: ``heads_per_tile`` heads of one GQA group, or
    ``lane_heads`` consecutive heads that share sticks (then one head per member)."""
    if t.lane_heads > 1:
        return [(tuple(range(h0, h0 + t.lane_heads)), tuple(h // dims.group for h in range(h0, h0 + t.lane_heads)))
                for h0 in range(0, dims.Hq, t.lane_heads)]
    return [(tuple(hk * dims.group + g0 + i for i in range(t.heads_per_tile)), (hk,))
            for hk in range(dims.Hkv) for g0 in range(0, dims.group, t.heads_per_tile)]


def _assign(costs: list[float], cores: int) -> list[list[int]]:
    """Longest processing time first: each item to the least loaded core."""
    heap = [(0.0, c) for c in range(cores)]  # (load, core): the least loaded core on top
    out: list[list[int]] = [[] for _ in range(cores)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        load, c = heapq.heappop(heap)
        out[c].append(i)
        heapq.heappush(heap, (load + costs[i], c))
    return [sorted(x) for x in out]


@lru_cache(maxsize=64)
def _row0(arg: TensorView, batches: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """[B, H] device stick and lane where each (batch, head)'s row 0 starts."""
    lead = np.array([[b, h, 0, 0] for b in range(batches) for h in range(heads)])
    dev = arg.layout.device_offsets(arg.host_index(lead))
    return (dev // arg.lanes).reshape(batches, heads), (dev % arg.lanes).reshape(batches, heads)


def _lane_table(arg: TensorView, batches: int, heads: int) -> np.ndarray:
    """[B, H] lane offset of each (batch, head)'s rows; rows stacked in one tile must share it."""
    return _row0(arg, batches, heads)[1]


def _kv_lane_deltas(arg: TensorView, dims: _Dims, it: WorkItem, role: str) -> list[int]:
    """Lane of each member's K (or V) rows relative to the first member's, in the shared sticks (0 for
    members loaded apart: each is its own rows)."""
    if role in it.apart:
        return [0] * it.members
    lanes = _row0(arg, dims.B, dims.Hkv)[1][it.batches[0]]
    return [int(lanes[h] - lanes[it.kv_heads[0]]) for h in it.kv_heads]


def _member_cols(spec: AttentionSpec, dims: _Dims, it: WorkItem) -> dict[str, int]:
    """Columns loaded per row of Q, K and V: one head's, or the span of all members side by side."""
    return {"q": dims.D * (1 if "query" in it.apart else it.members),
            "k": dims.D + max(_kv_lane_deltas(spec.key, dims, it, "key")),
            "v": dims.Dv + max(_kv_lane_deltas(spec.value, dims, it, "value"))}


def _lane_packable(spec: AttentionSpec, dims: _Dims, P: int) -> bool:
    """Can ``P`` consecutive query heads share one tile side by side? Their Q rows must start in the same
    stick at lanes D apart, and their K and V rows in the same sticks (at any fixed lane offsets)."""
    return P >= 2 and dims.Hq % P == 0 and not _apart_roles(spec, dims, P)


def _apart_roles(spec: AttentionSpec, dims: _Dims, P: int) -> tuple[str, ...]:
    """The roles whose rows of ``P`` consecutive query heads (one tile's lane heads) do not share sticks
    as a lane-heads tile loads them: Q rows in one stick at lanes D apart; K and V rows in the same
    sticks at fixed lane offsets."""
    apart = []
    qs, ql = _row0(spec.query, dims.B, dims.Hq)
    for h0 in range(0, dims.Hq, P):
        hs = list(range(h0, h0 + P))
        if (qs[:, hs] != qs[:, [h0]]).any() or (ql[:, hs] != ql[:, [h0]] + dims.D * np.arange(P)).any():
            apart.append("query")
            break
    for role, arg in (("key", spec.key), ("value", spec.value)):
        st, ln = _row0(arg, dims.B, dims.Hkv)
        for h0 in range(0, dims.Hq, P):
            kvs = [h // dims.group for h in range(h0, h0 + P)]
            delta = ln[:, kvs] - ln[:, [kvs[0]]]
            if (st[:, kvs] != st[:, [kvs[0]]]).any() or (delta < 0).any() or (delta != delta[:1]).any():
                apart.append(role)
                break
    return tuple(apart)


def _batches_stackable(spec: AttentionSpec, dims: _Dims, nb: int) -> bool:
    """Every load stacks ``nb`` batches of one head's rows: they must share a lane offset in q, k and v."""
    for role in ("query", "key", "value"):
        arg = getattr(spec, role)
        lanes = _lane_table(arg, dims.B, dims.Hq if role == "query" else dims.Hkv)
        if any(np.unique(lanes[b:b + nb, h]).size > 1 for b in range(0, dims.B, nb) for h in range(lanes.shape[1])):
            return False
    return True


def _out_rows_shared(spec: AttentionSpec, dims: _Dims) -> bool:
    """Do heads' output rows share sticks (e.g. out a [B, H, L, 32] view of a [B, L, H * 32] buffer, the
    layout torch's own CPU attention returns)? Then only a tile holding all of a stick's heads may store it."""
    lay = spec.out.layout
    lanes = _row0(spec.out, dims.B, dims.Hq)[1]
    extent = lay.host_shape[lay.stick_dim]
    ends_at_padding = (spec.out.storage_offset // lay.host_strides[lay.stick_dim]) % extent + dims.Dv == extent
    return bool((lanes != 0).any() or (dims.Dv % spec.out.lanes and not ends_at_padding))


def _out_packable(spec: AttentionSpec, dims: _Dims, P: int) -> bool:
    """Output rows of ``P`` consecutive heads start in one stick at lanes 0, Dv, 2 Dv, ... ."""
    if dims.Hq % P:
        return False
    st, ln = _row0(spec.out, dims.B, dims.Hq)
    return all((st[:, h0:h0 + P] == st[:, [h0]]).all() and (ln[:, h0:h0 + P] == dims.Dv * np.arange(P)).all()
               for h0 in range(0, dims.Hq, P))


def _candidates(dims: _Dims, spec: AttentionSpec) -> list[Tiling]:
    """Tilings to consider: block sizes no bigger than the lengths need, heads of one GQA group and
    batches stacked only when their Q rows share a lane offset (e.g. heads of 32 elements in a fused qkv
    buffer start at lanes 0 and 32: those cannot share a tile)."""
    lanes = _lane_table(spec.query, dims.B, dims.Hq)

    def uniform(nb: int, g: int) -> bool:
        return all(np.unique(lanes[b:b + nb, h:h + g]).size == 1
                   for b in range(0, dims.B, nb) for h in range(0, dims.Hq, g))

    bq = [spec.block_q] if spec.block_q else [b for b in BLOCK_Q_CHOICES if b < 2 * dims.Lq] or [BLOCK_Q_CHOICES[0]]
    bk = [spec.block_k] if spec.block_k else [b for b in BLOCK_K_CHOICES if b < 2 * dims.Lk] or [BLOCK_K_CHOICES[0]]
    gs = [spec.heads_per_tile] if spec.heads_per_tile else [g for g in range(1, dims.group + 1) if dims.group % g == 0]
    nbs = [spec.batches_per_tile] if spec.batches_per_tile else [n for n in range(1, dims.B + 1) if dims.B % n == 0]
    lane_p = spec.query.lanes // dims.D if dims.D < spec.query.lanes else 1
    ps = [spec.lane_heads_per_tile] if spec.lane_heads_per_tile else [1, lane_p] if lane_p > 1 else [1]
    shared_out = _out_rows_shared(spec, dims)
    out = [Tiling(q, k, g, n, p, p > 1 and _out_packable(spec, dims, p))
           for q in bq for k in bk for g in gs for n in nbs for p in ps
           if dims.group % g == 0 and uniform(n, g) and (p == 1 or (g == 1 and _lane_packable(spec, dims, p)))]
    if shared_out:  # heads' outputs share sticks: only tiles holding all of a stick's heads can store them
        out = [t for t in out if t.pack_out]
        if not out:  # q/k/v do not hold those heads side by side: load the roles that do not member by member
            out = _apart_candidates(spec, dims, bq, bk, nbs)
        if not out:
            raise CodegenError(
                f"sdpa out %{spec.out.name}: each head's output rows share their sticks with other heads, and "
                "q/k/v do not let those heads share a tile (they would need q, k, v with the same heads side "
                "by side in sticks); stores move whole sticks, so write into a fresh buffer in the default "
                "layout and copy (relayout) into this view")
    if not out:
        raise CodegenError(f"sdpa {spec.name}: heads_per_tile={spec.heads_per_tile}, batches_per_tile="
                           f"{spec.batches_per_tile}, lane_heads_per_tile={spec.lane_heads_per_tile} do not divide the "
                           "GQA group / batch, or stack rows at different lanes, or heads do not share sticks")
    return [t for t in out if t.rows() <= MAX_TILE_ROWS] or out[:1]


def _apart_candidates(spec: AttentionSpec, dims: _Dims, bq: list[int], bk: list[int], nbs: list[int]) -> list[Tiling]:
    """Lane-heads tilings that pack the output's heads of one stick into one tile when q, k or v do not
    hold those heads side by side (e.g. K and V in buffers of their own, sticked on the head dim): those
    roles are loaded one member at a time (one DMA per member instead of one per tile)."""
    P = spec.out.lanes // dims.Dv if dims.Dv < spec.out.lanes else 1
    if P < 2 or dims.Hq % P or not _out_packable(spec, dims, P):
        return []
    apart = _apart_roles(spec, dims, P)
    return [Tiling(q, k, 1, n, P, True, apart=apart) for q in bq for k in bk for n in nbs
            if dims.B % n == 0 and _batches_stackable(spec, dims, n)]

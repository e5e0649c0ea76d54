"""Scratchpad and stick tiles of attention: the buffers of one core (two of each that alternates) and
the device sticks of a Q/K/V/out/mask tile in scratchpad order."""

from __future__ import annotations

import numpy as np

from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.attention.plan import Tiling, WorkItem, _lane_table
from torch_spyre.compiler.codegen.attention.spec import AttentionSpec, _Dims
from torch_spyre.compiler.codegen.sticks import sp_bytes
from torch_spyre.compiler.scratchpad import SpBuffer

def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _row_lanes(arg: TensorView, ncols: int, lane0s: np.ndarray | None = None) -> int:
    """Lanes per scratchpad row for rows of ``ncols`` elements of ``arg``: the sticks covering them at
    the worst lane offset (``lane0s`` when known, else any)."""
    worst = int(np.max(lane0s)) if lane0s is not None else arg.lanes - 1
    return _ceil_to(worst + ncols, arg.lanes)


def _row_widths(spec: AttentionSpec, dims: _Dims, t: Tiling) -> dict[str, int]:
    """Lanes per scratchpad row of each tile (members side by side widen Q, K and V rows)."""
    p = {role: 1 if role in t.apart else t.lane_heads for role in ("query", "key", "value")}
    return {"q": _row_lanes(spec.query, dims.D * p["query"], _lane_table(spec.query, dims.B, dims.Hq)),
            "k": _row_lanes(spec.key, dims.D * p["key"], _lane_table(spec.key, dims.B, dims.Hkv)),
            "v": _row_lanes(spec.value, dims.Dv * p["value"], _lane_table(spec.value, dims.B, dims.Hkv)),
            "o": _ceil_to(dims.Dv * (t.lane_heads if t.pack_out else 1), spec.out.lanes)}


def _mask_tile_dims(mask: TensorView, t: Tiling) -> tuple[int, int, int]:
    """(batches, heads, rows) of a mask tile: 1 where the mask broadcasts."""
    return (t.batches_per_tile if mask.strides[0] else 1, t.heads_per_tile * t.lane_heads if mask.strides[1] else 1,
            t.block_q if mask.strides[2] else 1)


def _buffers(dims: _Dims, t: Tiling, mask: TensorView | None, causal: bool, w: dict[str, int]) -> list[SpBuffer]:
    """Every scratchpad buffer of one core, two of each that alternates (per item or per block). All are
    live for the whole kernel, since items and blocks reuse them in turn."""
    M, Bc, isz, nb = t.rows(), t.block_k, dims.itemsize, t.batches_per_tile
    # K and V loaded member by member hold each member's rows (a tile's Q rows are M either way).
    nk_rows = {r: nb * Bc * (t.lane_heads if r in t.apart else 1) for r in ("key", "value")}
    b: list[SpBuffer] = []
    for p in range(2):
        b += [SpBuffer(f"q{p}", sp_bytes(isz, M, w["q"])), SpBuffer(f"acc{p}", sp_bytes(4, M, dims.Dv)),
              SpBuffer(f"l{p}", sp_bytes(4, M)),
              SpBuffer(f"k{p}", sp_bytes(isz, nk_rows["key"], w["k"])),
              SpBuffer(f"v{p}", sp_bytes(isz, nk_rows["value"], w["v"])),
              SpBuffer(f"s{p}", sp_bytes(4, M, Bc)), SpBuffer(f"p{p}", sp_bytes(isz, M, Bc)),
              SpBuffer(f"nm{p}", sp_bytes(4, M)), SpBuffer(f"alpha{p}", sp_bytes(4, M)),
              SpBuffer(f"mcur{p}", sp_bytes(4, M)), SpBuffer(f"lcur{p}", sp_bytes(4, M))]
        if mask is not None:
            mb, mh, mq = _mask_tile_dims(mask, t)
            # A block's key columns may start at any lane of the mask's sticks.
            b.append(SpBuffer(f"mask{p}", sp_bytes(mask.layout.itemsize, mb, mh, mq, _row_lanes(mask, Bc))))
    b += [SpBuffer(f"o{p}", sp_bytes(isz, M, w["o"])) for p in range(t.out_slots)]
    if causal:
        b.append(SpBuffer("causal", sp_bytes(4, 2 * (t.block_q + Bc))))
    return b


# ---------------------------------------------------------------------------------------------
# Tiles of device sticks
# ---------------------------------------------------------------------------------------------
def _tile_sticks(arg: TensorView, batches: tuple[int, ...], heads: tuple[int, ...], r0: int, n: int, c0: int,
                 ncols: int) -> tuple[np.ndarray, int]:
    """Device sticks [len(batches), len(heads), n, k] of rows [r0, r0+n) x columns [c0, c0+ncols) of a 4-d
    view, in scratchpad order (batch, head, row, stick), and the rows' common lane offset."""
    bb, hh, rr = np.meshgrid(np.asarray(batches), np.asarray(heads), np.arange(r0, r0 + n), indexing="ij")
    lead = np.stack([bb.reshape(-1), hh.reshape(-1), rr.reshape(-1)], axis=1)
    dev, lane0 = arg.row_sticks(lead, c0, ncols)
    return dev.reshape(len(batches), len(heads), n, -1), lane0


def _mask_sticks(mask: TensorView, it: WorkItem, k0: int, nk: int) -> tuple[np.ndarray, int]:
    batches = it.batches if mask.strides[0] else it.batches[:1]
    heads = it.heads if mask.strides[1] else it.heads[:1]
    rows = it.nq if mask.strides[2] else 1
    return _tile_sticks(mask, batches, heads, it.q0, rows, k0, nk)

"""Row structure of a gather: which device sticks make up one gathered row of the source (row i is a
fixed set P of sticks shifted by i * R) and where the output rows of a set of index positions lie.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torch_spyre.compiler.access import CodegenError
from torch_spyre.compiler.codegen.gather.spec import _Plan
from torch_spyre.compiler.codegen.sticks import check_owns_sticks


@dataclass(frozen=True)
class _RowSticks:
    """Row i of the source along ``dim`` is the sticks ``i * stride + P``; ``runs`` cuts P (in key order:
    the other dims row-major, then the row's sticks) into contiguous (first stick, length) runs."""

    stride: int
    runs: tuple[tuple[int, int], ...]
    keys: np.ndarray  # [n_keys, rank - 2] coordinates of the source's other (non-gathered, non-last) dims
    sticks_per_key: int


def _other_dims(rank: int, skip: set[int]) -> list[int]:
    return [d for d in range(rank - 1) if d not in skip]


def _key_coords(shape: tuple[int, ...], dims: list[int]) -> np.ndarray:
    """Row-major coordinates over ``dims`` of ``shape``: [prod, len(dims)]."""
    sizes = [shape[d] for d in dims]
    if not sizes:
        return np.zeros((1, 0), dtype=np.int64)
    return np.stack([g.reshape(-1) for g in np.indices(sizes)], axis=1).astype(np.int64)


ROW_CHECK_LIMIT = 1 << 16  # source rows whose sticks are checked one by one (beyond: a spread sample)


def _rows_to_check(num_rows: int, keys: int) -> np.ndarray:
    """The rows whose sticks are computed to verify that row i is ``i * stride + P``: all of them for
    tables up to ROW_CHECK_LIMIT (rows x keys), else the first and last thousand and an even spread
    (a view that merges dims breaks the pattern at dim boundaries, which the first rows already show)."""
    if num_rows * keys <= ROW_CHECK_LIMIT:
        return np.arange(num_rows, dtype=np.int64)
    n = max(2, ROW_CHECK_LIMIT // (3 * keys))
    spread = np.linspace(0, num_rows - 1, n).astype(np.int64)
    return np.unique(np.r_[np.arange(min(n, num_rows)), spread, np.arange(max(0, num_rows - n), num_rows)])


def _source_rows(p: _Plan) -> _RowSticks:
    src, dim = p.source, p.dim
    rank = len(src.shape)
    keys = _key_coords(src.shape, _other_dims(rank, {dim}))
    rows = _rows_to_check(p.num_rows, len(keys))
    lead = np.insert(np.repeat(keys[None], len(rows), 0), dim, rows[:, None], axis=2).reshape(-1, rank - 1)
    dev, lane0 = src.row_sticks(lead, 0, src.shape[-1])
    if lane0 != 0:
        raise CodegenError(f"gather source %{src.name}: its rows start at lane {lane0} of a stick, so the gathered "
                           "sticks would land at other lanes than the output's; relayout the source first")
    dev = dev.reshape(len(rows), -1)
    stride = int(dev[1, 0] - dev[0, 0]) if len(rows) > 1 else 0  # rows[:2] are 0 and 1
    if not np.array_equal(dev, dev[0][None, :] + rows[:, None] * stride):
        raise CodegenError(f"gather source %{src.name}: rows along dim {dim} are not a fixed set of sticks at a "
                           "fixed stride in its layout; relayout the source (e.g. to a contiguous default layout)")
    P = dev[0]
    cuts = np.flatnonzero(np.diff(P) != 1) + 1
    starts = np.r_[0, cuts]
    lengths = np.diff(np.r_[starts, P.size])
    return _RowSticks(stride, tuple((int(P[s]), int(n)) for s, n in zip(starts, lengths)), keys, dev.shape[1] // len(keys))


def _out_sticks(p: _Plan, rows: _RowSticks, positions: np.ndarray) -> np.ndarray:
    """Device sticks of the output rows at flat index ``positions``: [n, n_keys * sticks per key]."""
    out, rank = p.out, len(p.out.shape)
    pos = np.stack(np.unravel_index(positions, p.index.shape), axis=1) if len(positions) else np.zeros((0, len(p.index.shape)), np.int64)
    mapped = {od for od, _ in p.coord_map}
    others = _other_dims(rank, mapped)
    n, nk = len(positions), len(rows.keys)
    lead = np.zeros((n, nk, rank - 1), dtype=np.int64)
    for od, idim in p.coord_map:
        lead[:, :, od] = pos[:, idim][:, None]
    for j, od in enumerate(others):
        lead[:, :, od] = rows.keys[None, :, j]
    dev, lane0 = out.row_sticks(lead.reshape(n * nk, rank - 1), 0, out.shape[-1])
    check_owns_sticks(out, lane0, out.shape[-1], "gather out")
    if dev.shape[1] != rows.sticks_per_key:
        raise CodegenError(f"gather out %{out.name}: rows span {dev.shape[1]} sticks but source rows {rows.sticks_per_key}")
    return dev.reshape(n, -1)

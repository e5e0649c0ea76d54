"""The iteration space in boxes: each node's loop variables over a box (``node_vars``), the division of
the outer space over the cores (``split_counts`` / ``core_boxes``), the tiles of a core's box
(``boxes``) and how a tile shrinks when its scratchpad plan does not fit (``shrink``)."""

from __future__ import annotations

import math

import numpy as np

from ...kernel_ir import KernelSpec


# ---------------------------------------------------------------------------------------------
# Iteration coordinates -> node variables
# ---------------------------------------------------------------------------------------------
def _grid(origin: tuple[int, ...], shape: tuple[int, ...]) -> list[np.ndarray]:
    """Broadcastable coordinate arrays of a box (one per dim)."""
    out = []
    for d, (o, n) in enumerate(zip(origin, shape)):
        s = [1] * len(shape)
        s[d] = n
        out.append((o + np.arange(n, dtype=np.int64)).reshape(s))
    return out


def _linear(coords: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    lin = np.zeros((1,) * max(len(coords), 1), dtype=np.int64)
    for c, n in zip(coords, sizes):
        lin = lin * n + c
    return lin


def _unravel(lin: np.ndarray, sizes: list[int], prefix: str) -> dict[str, np.ndarray]:
    out = {}
    for k in reversed(range(len(sizes))):
        out[f"{prefix}{k}"] = lin % sizes[k]
        lin = lin // sizes[k]
    return out


def node_vars(spec: KernelSpec, node_index: int, xo, xs, ro, rs, outer: bool) -> dict[str, np.ndarray]:
    """Values of a node's loop variables over a tile (full: x dims then r dims; outer: x dims only)."""
    node = spec.nodes[node_index]
    nx = len(spec.x_sizes)
    same_x = list(node.sizes) == list(spec.x_sizes)  # the node's x vars are the box's coordinates
    if outer:
        coords = _grid(xo, xs)
        if same_x:
            return {f"x{k}": np.broadcast_to(c, tuple(xs)) for k, c in enumerate(coords)}
        xl = _linear(coords, spec.x_sizes)
        return _unravel(xl, node.sizes, "x")
    coords = _grid(tuple(xo) + tuple(ro), tuple(xs) + tuple(rs))
    full_shape = tuple(xs) + tuple(rs)
    if same_x and (not spec.r_sizes or node.placement == "reduction"
                   and list(node.reduction_sizes) == list(spec.r_sizes)):
        names = [f"x{k}" for k in range(nx)] + ([f"r{k}" for k in range(len(spec.r_sizes))] if spec.r_sizes else [])
        return {k: np.broadcast_to(c, full_shape) for k, c in zip(names, coords)}
    xl = _linear(coords[:nx], spec.x_sizes)
    rl = _linear(coords[nx:], spec.r_sizes)
    if node.placement == "reduction":
        vals = {**_unravel(xl, node.sizes, "x"), **_unravel(rl, node.reduction_sizes, "r")}
    else:  # a pointwise node over x * r, iterated x-major
        rn = math.prod(spec.r_sizes) if spec.r_sizes else 1
        vals = _unravel(xl * rn + rl, node.sizes, "x")
    return {k: np.broadcast_to(v, full_shape) for k, v in vals.items()}



# ---------------------------------------------------------------------------------------------
# Work division and tiling
# ---------------------------------------------------------------------------------------------
def boxes(origin: tuple[int, ...], shape: tuple[int, ...], tile: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The tiles of a box, row-major; edge tiles are smaller."""
    ranges = []
    for o, n, t in zip(origin, shape, tile):
        ranges.append([(o + s, min(t, n - s)) for s in range(0, n, max(t, 1))] or [(o, 0)])
    out = [((), ())]
    for r in ranges:
        out = [(org + (s,), shp + (n,)) for org, shp in out for s, n in r]
    return out


def split_counts(sizes: list[int], cores: int, unit_inner: int) -> list[int]:
    """How many parts each dim is cut into (outermost first), at most ``cores`` parts in total."""
    parts, left = [], cores
    for d, n in enumerate(sizes):
        unit = unit_inner if d == len(sizes) - 1 else 1
        p = max(1, min(left, n // max(unit, 1)))
        parts.append(p)
        left //= p
    return parts


def core_boxes(sizes: list[int], parts: list[int], unit_inner: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    tile = []
    for d, (n, p) in enumerate(zip(sizes, parts)):
        unit = unit_inner if d == len(sizes) - 1 else 1
        chunk = -(-n // p)
        chunk = -(-chunk // unit) * unit if unit > 1 and p > 1 else chunk
        tile.append(max(chunk, 1))
    return [b for b in boxes(tuple(0 for _ in sizes), tuple(sizes), tuple(tile)) if all(b[1])]



def shrink(shape: list[int], lanes: int) -> bool:
    """Halve the outermost dim larger than one; the innermost last, in whole sticks (``lanes``) while it
    can. False when the shape cannot shrink."""
    for d in range(len(shape) - 1):
        if shape[d] > 1:
            shape[d] = -(-shape[d] // 2)
            return True
    if not shape or shape[-1] <= 1:
        return False
    n = shape[-1]
    if n > lanes:
        shape[-1] = max(lanes, (n // 2) // lanes * lanes)
    else:
        shape[-1] = -(-n // 2)
    return True


def shrink_outer(shape: list[int]) -> bool:
    """Halve the outermost dim larger than one (any dim, the innermost last); False when all are one."""
    for d in range(len(shape)):
        if shape[d] > 1:
            shape[d] = -(-shape[d] // 2)
            return True
    return False

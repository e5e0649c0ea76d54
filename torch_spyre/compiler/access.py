"""Numeric access analysis: which sticks a tile touches, and the strided view of the tile inside them.

With static shapes every index expression can simply be *evaluated* over the iteration coordinates of a
tile (numpy arrays), so the analysis is exact for any expression Inductor produces (views, broadcasts,
transposes, slices, ``FloorDiv``/``ModularIndexing`` reshapes):

1. host element indices of the tile -> device element offsets (``StickLayout.device_offsets``, after the
   tensor's storage offset);
2. the distinct sticks, in increasing device order, are loaded one after the other into scratchpad:
   :func:`stick_patterns` describes them as DMA patterns (runs of consecutive sticks, runs repeated at
   a constant stride);
3. each element's scratchpad position is ``rank(stick) * lanes + lane``; the tile is usable by a vector
   instruction when those positions are an affine function of the tile coordinates, possibly after
   splitting a dimension at a stick boundary (:func:`affine_view`). When they are not, the caller splits
   the tile into smaller boxes (:func:`split_point` says where).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import sympy

from ..errors import SpyreError
from ..card.layout import StickLayout
from ..program import STICK_BYTES, DmaPattern


class AccessError(SpyreError, ValueError):
    """An access that cannot be analysed (an index outside the tensor, an unknown index function)."""


# ---------------------------------------------------------------------------------------------
# Evaluating Inductor index expressions with numpy
# ---------------------------------------------------------------------------------------------
def _sympy_locals() -> dict[str, Any]:
    from .._torch.inductor import index_functions as F

    names = ["FloorDiv", "ModularIndexing", "CleanDiv", "CeilDiv", "PythonMod", "Mod", "Identity", "Where",
             "IntTrueDiv", "FloatTrueDiv", "TruncToInt", "RoundToInt", "Min", "Max", "FloorToInt", "CeilToInt"]
    out = {n: getattr(F, n) for n in names if hasattr(F, n)}
    out.setdefault("Min", sympy.Min)
    out.setdefault("Max", sympy.Max)
    return out


@lru_cache(maxsize=4096)
def parse_index(text: str) -> sympy.Expr:
    return sympy.sympify(text, locals=_sympy_locals())


def _floordiv(a, b):
    return np.floor_divide(a, b)


_FUNCS: dict[str, Callable[..., Any]] = {
    "FloorDiv": _floordiv,
    "CleanDiv": _floordiv,
    "CeilDiv": lambda a, b: -np.floor_divide(-a, b),
    "ModularIndexing": lambda x, d, m: np.mod(np.floor_divide(x, d), m),
    "PythonMod": np.mod,
    "Mod": np.mod,
    "Identity": lambda x: x,
    "Where": lambda c, a, b: np.where(c, a, b),
    "TruncToInt": lambda x: np.trunc(x).astype(np.int64),
    "FloorToInt": lambda x: np.floor(x).astype(np.int64),
    "CeilToInt": lambda x: np.ceil(x).astype(np.int64),
    "RoundToInt": lambda x: np.round(x).astype(np.int64),
    "IntTrueDiv": lambda a, b: np.true_divide(a, b),
    "FloatTrueDiv": lambda a, b: np.true_divide(a, b),
    "floor": lambda x: np.floor(x).astype(np.int64),  # sympy's own, e.g. floor(x1/2)
    "ceiling": lambda x: np.ceil(x).astype(np.int64),
    "Abs": np.abs,
    "Min": lambda *a: _fold(np.minimum, a),
    "Max": lambda *a: _fold(np.maximum, a),
}


def _fold(fn, args):
    out = args[0]
    for a in args[1:]:
        out = fn(out, a)
    return out


def evaluate(expr: sympy.Expr | str, values: dict[str, np.ndarray]) -> np.ndarray:
    """Evaluate an index expression with numpy; ``values`` maps symbol names to (broadcastable) arrays."""
    if isinstance(expr, str):
        expr = parse_index(expr)
    return np.asarray(_eval(expr, values), dtype=np.int64)


def _eval(e: sympy.Expr, values: dict[str, np.ndarray]) -> Any:
    if e.is_Symbol:
        try:
            return values[e.name]
        except KeyError:
            raise AccessError(f"index symbol {e.name} has no value (known: {sorted(values)})") from None
    if e.is_Integer:
        return np.int64(int(e))
    if e.is_Rational:
        return float(e)
    if isinstance(e, sympy.Add):
        return _fold(np.add, [_eval(a, values) for a in e.args])
    if isinstance(e, sympy.Mul):
        return _fold(np.multiply, [_eval(a, values) for a in e.args])
    if isinstance(e, sympy.Pow):
        return np.power(_eval(e.args[0], values), int(e.args[1]))
    if isinstance(e, (sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan, sympy.GreaterThan,
                      sympy.Eq, sympy.Ne)):
        a, b = (_eval(x, values) for x in e.args)
        return {sympy.StrictLessThan: np.less, sympy.LessThan: np.less_equal, sympy.StrictGreaterThan: np.greater,
                sympy.GreaterThan: np.greater_equal, sympy.Eq: np.equal, sympy.Ne: np.not_equal}[type(e)](a, b)
    name = type(e).__name__
    fn = _FUNCS.get(name)
    if fn is None:
        raise AccessError(f"index function {name} in {e} is not known to the Spyre access analysis")
    return fn(*[_eval(a, values) for a in e.args])


def free_symbols(text: str) -> set[str]:
    return {s.name for s in parse_index(text).free_symbols}


# ---------------------------------------------------------------------------------------------
# Host indices -> device elements -> sticks
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorPlace:
    """Where a kernel operand's elements are: its allocation's layout and the view's storage offset."""

    layout: StickLayout
    storage_offset: int

    @property
    def lanes(self) -> int:
        return self.layout.lanes

    @property
    def itemsize(self) -> int:
        return self.layout.itemsize


def walks_layout_dims(layout: StickLayout, shape, strides) -> bool:
    """Every view dim (of size > 1, not broadcast) moves along one dim of the allocation's host shape,
    each a different one: what the whole-op generators (matmul, gather, attention) read as one stride per
    dim. False for a view that merges or splits dims, e.g. [24, 128] over a [2, 12, 128] allocation."""
    used: set[int] = set()
    for n, st in zip(shape, strides):
        if n <= 1 or st == 0:
            continue
        match = [h for h, (hn, hst) in enumerate(zip(layout.host_shape, layout.host_strides))
                 if hst == st and hn >= n and h not in used]
        if not match:
            return False
        used.add(match[0])
    return True


def device_elements(place: TensorPlace, host_index: np.ndarray, what: str = "access") -> np.ndarray:
    """Device element offsets (same shape as ``host_index``) of host indices relative to the view."""
    idx = np.asarray(host_index, dtype=np.int64) + place.storage_offset
    if idx.size and (idx.min() < 0 or idx.max() >= place.layout.numel):
        raise AccessError(
            f"{what} reaches host element {int(idx.max()) if idx.max() >= place.layout.numel else int(idx.min())} "
            f"outside its allocation of {place.layout.numel} elements (a masked access whose mask the compiler "
            "could not evaluate statically?)"
        )
    return place.layout.device_offsets(idx.reshape(-1)).reshape(idx.shape)


@dataclass
class StickSet:
    """The distinct sticks an access touches (sorted) and each element's scratchpad element position."""

    sticks: np.ndarray  # sorted unique device stick numbers
    position: np.ndarray  # per element: rank(stick) * lanes + lane (elements, relative to the load base)

    @property
    def nbytes(self) -> int:
        return int(self.sticks.size) * STICK_BYTES


def stick_set(place: TensorPlace, device_elems: np.ndarray, valid: np.ndarray | None = None) -> StickSet:
    """Sticks under ``device_elems`` (only where ``valid``) and the positions of the elements in them."""
    lanes = place.lanes
    sticks = device_elems // lanes
    used = sticks if valid is None else sticks[valid]
    uniq = np.unique(used)
    rank = np.searchsorted(uniq, sticks)
    rank = np.minimum(rank, max(uniq.size - 1, 0))
    return StickSet(uniq, rank * lanes + device_elems % lanes)


def stick_patterns(sticks: np.ndarray) -> list[tuple[int, int, DmaPattern]]:
    """DMA patterns loading sorted ``sticks`` one after the other: (first stick, first rank, pattern).

    Runs of consecutive sticks become contiguous bursts; equal runs at a constant stride become one
    two-level pattern. Scratchpad positions follow the rank of each stick in ``sticks``.
    """
    if sticks.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(sticks) != 1) + 1
    starts = np.r_[0, breaks]
    lengths = np.diff(np.r_[starts, sticks.size])
    out: list[tuple[int, int, DmaPattern]] = []
    i = 0
    while i < starts.size:
        j = i + 1
        if j < starts.size and lengths[j] == lengths[i]:
            stride = sticks[starts[j]] - sticks[starts[i]]
            while (j < starts.size and lengths[j] == lengths[i]
                   and sticks[starts[j]] - sticks[starts[j - 1]] == stride):
                j += 1
        n, run = j - i, int(lengths[i])
        first = int(sticks[starts[i]])
        if n == 1:
            pat = DmaPattern((run,), (STICK_BYTES,), (STICK_BYTES,))
        else:
            stride = int(sticks[starts[i + 1]] - sticks[starts[i]])
            pat = DmaPattern((n, run), (stride * STICK_BYTES, STICK_BYTES), (run * STICK_BYTES, STICK_BYTES))
        out.append((first, int(starts[i]), pat))
        i = j
    return out


# ---------------------------------------------------------------------------------------------
# Affine views over boxes
# ---------------------------------------------------------------------------------------------
def affine_strides(p: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(base, strides) if ``p[i] == base + sum(i_k * strides_k)`` for every index, else None."""
    if p.size == 0:
        return 0, tuple(0 for _ in p.shape)
    base = int(p.flat[0])
    strides = []
    pred = np.full(p.shape, base, dtype=np.int64)
    for k, n in enumerate(p.shape):
        if n == 1:
            strides.append(0)
            continue
        idx = [0] * p.ndim
        idx[k] = 1
        s = int(p[tuple(idx)]) - base
        strides.append(s)
        shape = [1] * p.ndim
        shape[k] = n
        pred = pred + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    if not np.array_equal(pred, p):
        return None
    return base, tuple(strides)


def line_affine(p: np.ndarray, axis: int) -> bool:
    """True if ``p`` moves by one constant step along ``axis`` everywhere."""
    if p.shape[axis] <= 1:
        return True
    d = np.diff(p, axis=axis)
    return bool(np.all(d == d.flat[0]))


def refine_shape(shape: tuple[int, ...], splits: dict[int, Any]) -> tuple[tuple[int, ...], list[list[int]]]:
    """Split dims in mixed radix: ``splits[d] = [f1, f2, ...]`` (or one int) turns size n into
    (n // (f1*f2*...), ..., f2, f1) - f1 innermost. Returns the new shape and, per old dim, its new axes
    (outermost first)."""
    new, axes = [], []
    for d, n in enumerate(shape):
        fs = _factors(splits.get(d))
        parts = []
        rest = n
        for f in fs:
            parts.append(f)
            rest //= f
        parts.append(rest)
        parts.reverse()
        axes.append(list(range(len(new), len(new) + len(parts))))
        new.extend(parts)
    return tuple(new), axes


def _factors(f: Any) -> list[int]:
    if not f:
        return []
    return [int(f)] if isinstance(f, (int, np.integer)) else [int(x) for x in f]


def _divisors_desc(n: int, at_most: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    divs = set(small) | {n // d for d in small}
    return sorted((d for d in divs if 1 < d < n and d <= at_most), reverse=True)


def _affine_run(a: np.ndarray, axis: int) -> int:
    """How many elements from the start of ``axis`` move by the first step (on every line)."""
    n = a.shape[axis]
    if n <= 2:
        return n
    d = np.diff(a, axis=axis)
    first = np.take(d, [0], axis=axis)
    bad = np.any(d != first, axis=tuple(k for k in range(d.ndim) if k != axis))
    pos = np.flatnonzero(bad)
    return int(pos[0]) + 1 if pos.size else n


def choose_splits(arrays: list[np.ndarray], factors: list[int] | None = None) -> dict[int, list[int]]:
    """Per dim, mixed-radix factors (innermost first) after which every array moves by a constant step
    along each new axis: a dim that crosses stick boundaries becomes (..., sticks, lanes)."""
    if not arrays:
        return {}
    shape = arrays[0].shape
    splits: dict[int, list[int]] = {}
    for d in reversed(range(len(shape))):
        fs: list[int] = []
        while True:
            cur_shape, axes = refine_shape(shape, {**splits, d: fs})
            outer_axis = axes[d][0]
            refined = [a.reshape(cur_shape) for a in arrays]
            if all(line_affine(r, outer_axis) for r in refined):
                break
            n = cur_shape[outer_axis]
            found = None
            run = min(_affine_run(r, outer_axis) for r in refined)
            for f in _divisors_desc(n, run):
                trial_shape, t_axes = refine_shape(shape, {**splits, d: fs + [f]})
                inner = t_axes[d][1]
                if all(line_affine(a.reshape(trial_shape), inner) for a in arrays):
                    found = f
                    break
            if found is None:
                break
            fs.append(found)
        if fs:
            splits[d] = fs
    return splits


def split_point(p: np.ndarray) -> tuple[int, int] | None:
    """Where affinity breaks first: (axis, index) to cut a box so that the lower part is more regular."""
    for axis in range(p.ndim):
        n = p.shape[axis]
        if n <= 1:
            continue
        d = np.diff(p, axis=axis)
        if np.all(d == d.flat[0]):
            continue
        # First position along axis where the step differs from the first step (on any line).
        first = np.take(d, [0], axis=axis)
        bad = np.any(d != first, axis=tuple(k for k in range(d.ndim) if k != axis))
        pos = np.flatnonzero(bad)
        if pos.size:
            return axis, int(pos[0]) + 1
        # Steps agree along each line but differ between lines: cut the other axes instead.
    for axis in range(p.ndim):
        if p.shape[axis] > 1:
            return axis, p.shape[axis] // 2
    return None


def uniform_split(m: np.ndarray) -> tuple[int, int] | None:
    """Where a (mask) array first changes value: (axis, index), or None if it is uniform."""
    if m.size == 0 or np.all(m == m.flat[0]):
        return None
    for axis in range(m.ndim):
        if m.shape[axis] <= 1:
            continue
        a, b = np.take(m, range(1, m.shape[axis]), axis=axis), np.take(m, range(m.shape[axis] - 1), axis=axis)
        changed = a != b
        if m.dtype.kind == "f":
            changed &= ~(np.isnan(a) & np.isnan(b))
        bad = np.any(changed, axis=tuple(k for k in range(changed.ndim) if k != axis))
        pos = np.flatnonzero(bad)
        if pos.size:
            return axis, int(pos[0]) + 1
    return None


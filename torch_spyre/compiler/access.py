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
   splitting a dimension at a stick boundary (:func:`choose_splits` picks the mixed-radix splits,
   :func:`affine_strides` finds the strided view). When they are not, the caller splits the tile into
   smaller boxes (:func:`split_point` / :func:`uniform_split` say where).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
import sympy

from ..errors import SpyreError
from ..card.layout import DEVICE_DTYPES, StickLayout, run_starts, sorted_unique
from ..program import STICK_BYTES, DmaPattern, Operand, row_major_strides


class CodegenError(SpyreError, ValueError):
    """A kernel the generators cannot write as asked (the message says which operand and what to do)."""


class AccessError(CodegenError):
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
# Host dtypes -> the card's device dtype for them (fp16 and bf16 live as DLFloat16).
_DEVICE_DTYPE = {
    "float16": "dlfloat16", "bfloat16": "dlfloat16", "float32": "float32", "dlfloat16": "dlfloat16",
    "int64": "int64", "int32": "int32", "bool": "bool",
}


def device_dtype_of(dtype: Any) -> str:
    """The card's dtype for a host dtype (torch dtype or name); CodegenError if the card has none."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DEVICE_DTYPE:
        raise CodegenError(f"unsupported dtype {dtype}; supported: float16, bfloat16, float32 (data), int64, "
                           "int32 (indices), bool (masks)")
    return _DEVICE_DTYPE[name]


@dataclass(frozen=True)
class TensorView:
    """The one view type of the generators: kernel operand ``name`` is the strided view ``shape`` /
    ``strides`` / ``storage_offset`` (host elements) over an allocation laid out by ``layout`` (the
    allocation's host shape, stick dim and device dtype). View element (i0, i1, ...) is host element
    ``storage_offset + sum(i_d * strides[d])`` of the allocation. None strides: contiguous."""

    name: str
    layout: StickLayout
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    storage_offset: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.strides is None:
            object.__setattr__(self, "strides", row_major_strides(self.shape))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        object.__setattr__(self, "storage_offset", int(self.storage_offset))
        if len(self.strides) != len(self.shape):
            raise CodegenError(f"%{self.name}: {len(self.shape)} sizes {list(self.shape)} but strides {list(self.strides)}")

    # --- constructors ---------------------------------------------------------------------------
    @staticmethod
    def whole(name: str, layout: StickLayout, storage_offset: int = 0) -> "TensorView":
        """The whole allocation, as allocated (shifted by ``storage_offset``). Row-major strides of the
        host shape itself: a 0-d allocation is a 0-d view (``layout.host_strides`` counts it as [1])."""
        return TensorView(name, layout, layout.host_shape, None, storage_offset)

    @staticmethod
    def contiguous(name: str, shape: Sequence[int], dtype: Any, stick_dim: int = -1) -> "TensorView":
        """A whole fresh buffer in IBM's default layout (last dim sticked unless told otherwise); ``dtype``
        is a device dtype name or a host dtype (torch dtype or name, see :func:`device_dtype_of`)."""
        dev = dtype if isinstance(dtype, str) and dtype in DEVICE_DTYPES else device_dtype_of(dtype)
        return TensorView(name, StickLayout(tuple(shape), stick_dim, dev), tuple(shape))

    @staticmethod
    def of_kernel_buffer(kspec: Any, name: str, places: dict[str, Any]) -> "TensorView":
        """Kernel buffer ``name`` as the kernel sees it: sizes and strides from the KernelSpec, layout and
        storage offset from where the tensor was placed at launch (``places[name]``)."""
        b, place = kspec.buffer(name), places[name]
        return TensorView(name, place.layout, tuple(b.size), tuple(b.stride), int(place.storage_offset))

    def transposed(self, d0: int = -2, d1: int = -1) -> "TensorView":
        shape, strides = list(self.shape), list(self.strides)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return replace(self, shape=tuple(shape), strides=tuple(strides))

    def expanded(self, batch: int) -> "TensorView":
        """A batch dimension of stride 0 in front (a weight shared by every batch)."""
        return replace(self, shape=(batch, *self.shape), strides=(0, *self.strides))

    # --- properties -----------------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return self.layout.device_dtype

    @property
    def lanes(self) -> int:
        return self.layout.lanes

    @property
    def itemsize(self) -> int:
        return self.layout.itemsize

    def operand(self, access: str) -> Operand:
        lay = self.layout
        return Operand(self.name, lay.nbytes, access, lay.device_dtype, lay.host_shape, lay.stick_dim)

    def device_bytes(self) -> int:
        """Device bytes of the sticks this view touches (each stick counted once): the compulsory traffic of
        reading or writing it. A dim of stride 0 repeats sticks; the dim walking the stick dim packs
        ``lanes`` elements a stick; every other dim reaches sticks of its own."""
        if 0 in self.shape:
            return 0
        along = self.layout.host_strides[self.layout.stick_dim] if self.layout.host_shape else None
        sticks, packed = 1, False
        for size, stride in zip(self.shape, self.strides):
            if size == 1 or stride == 0:
                continue
            if stride == along and not packed:
                sticks *= -(-size // self.lanes)
                packed = True
            else:
                sticks *= size
        return min(sticks * STICK_BYTES, self.layout.nbytes)

    def describe(self) -> str:
        return (f"{self.layout.describe()} view shape={list(self.shape)} strides={list(self.strides)} "
                f"offset={self.storage_offset}")

    def host_index(self, coords: np.ndarray) -> np.ndarray:
        """Host linear indices of view coordinates (``coords`` [..., ndim])."""
        return self.storage_offset + np.asarray(coords, dtype=np.int64) @ np.asarray(self.strides, dtype=np.int64)

    def walks_layout_dims(self) -> bool:
        """See :func:`walks_dims`: whether each view dim moves along its own dim of the allocation."""
        return walks_dims(list(zip(self.layout.host_shape, self.layout.host_strides)), self.shape, self.strides)

    def check_last_dim_sticked(self, role: str) -> None:
        """Rows of the view's last dim must run along the layout's stick dim, lane by lane."""
        lay = self.layout
        if not self.shape:
            raise CodegenError(f"{role} %{self.name} is 0-d; expected at least one dimension")
        if self.shape[-1] > 1 and self.strides[-1] != lay.host_strides[lay.stick_dim]:
            raise CodegenError(
                f"{role} %{self.name}: its last dim (stride {self.strides[-1]}) does not run along the stick dim "
                f"{lay.stick_dim} of its layout ({lay.describe()}); insert a relayout so that the last dim is "
                "sticked (compiler/relayout.py)")
        hi = self.storage_offset + sum((s - 1) * st for s, st in zip(self.shape, self.strides) if s > 0)
        lo = self.storage_offset + sum((s - 1) * st for s, st in zip(self.shape, self.strides) if s > 0 and st < 0)
        if min(self.shape, default=1) > 0 and (lo < 0 or hi >= lay.numel):
            raise CodegenError(f"{role} %{self.name}: the view reaches host elements [{lo}, {hi}] outside its "
                               f"buffer of {lay.numel} elements")

    def _row_starts(self, lead: np.ndarray, col0: int) -> np.ndarray:
        """Host indices of column ``col0`` of each row ``lead`` ([n, ndim-1] coordinates)."""
        lead = np.asarray(lead, dtype=np.int64)
        lead = lead.reshape(len(lead), len(self.shape) - 1)
        return self.host_index(np.concatenate([lead, np.full((len(lead), 1), col0)], axis=1))

    def row_start_lanes(self, lead: np.ndarray, col0: int = 0) -> np.ndarray:
        """The lane of column ``col0`` of each row ``lead`` ([n, ndim-1] coordinates) in its stick."""
        return self.layout.device_offsets(self._row_starts(lead, col0)) % self.layout.lanes

    def row_sticks(self, lead: np.ndarray, col0: int, ncols: int) -> tuple[np.ndarray, int]:
        """Device stick numbers covering columns [col0, col0+ncols) of each row ``lead`` ([n, ndim-1]
        coordinates), as [n, k], and the lane of column col0 in its stick (the same for every row)."""
        lay, lanes = self.layout, self.layout.lanes
        first = self._row_starts(lead, col0)
        lane0 = lay.device_offsets(first) % lanes
        if np.any(lane0 != lane0[0]):
            raise CodegenError(f"%{self.name}: rows start at different lanes of their sticks; a relayout is needed")
        lane0 = int(lane0[0]) if len(lane0) else 0
        k = -(-(lane0 + ncols) // lanes)
        # Column of each covered stick's first used lane; its device stick number.
        cols = np.maximum(0, np.arange(k) * lanes - lane0) + col0
        host = first[:, None] + (cols - col0)[None, :] * self.strides[-1]
        return lay.device_offsets(host.reshape(-1)).reshape(len(first), k) // lanes, lane0


def walks_dims(host: Sequence[tuple[Any, Any]], shape: Sequence[Any], strides: Sequence[Any],
               is_one: Callable[[Any], bool] = lambda n: n <= 1,
               equal: Callable[[Any, Any], bool] = lambda a, b: a == b,
               leq: Callable[[Any, Any], bool] = lambda a, b: a <= b, broadcast_ok: bool = True) -> bool:
    """Every view dim (of size > 1, not broadcast) moves along one dim of the allocation's dense host
    shape ``host`` ([(size, stride), ...]), each a different one: what the whole-op generators (matmul,
    gather, attention) can read as one stride per dim. True of permutes and slices; false of views that
    merge or split dims (e.g. [24, 128] over a [2, 12, 128] allocation: heads split out of a fused
    projection, batch folded into rows). The comparisons are parameters so that the compiler can ask the
    same question of symbolic sizes (as Inductor's size variables prove them). ``broadcast_ok``: a
    stride-0 (broadcast) dim needs no dim of its own; the compiler's lowerings say False, since an
    Inductor view of a buffer never broadcasts."""
    used: set[int] = set()
    for n, st in zip(shape, strides):
        if is_one(n) or (broadcast_ok and equal(st, 0)):
            continue
        match = [h for h, (hn, hst) in enumerate(host) if h not in used and equal(hst, st) and leq(n, hn)]
        if not match:
            return False
        used.add(match[0])
    return True


def walks_layout_dims(layout: StickLayout, shape, strides) -> bool:
    """:func:`walks_dims` of a view over an allocation laid out by ``layout``."""
    return walks_dims(list(zip(layout.host_shape, layout.host_strides)), shape, strides)


def device_elements(place: TensorView, host_index: np.ndarray, what: str = "access") -> np.ndarray:
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
    # Stick sets that are translations of one another (``translated``) share ``position`` and this dict,
    # where their users keep what depends only on the positions or on the sticks' pattern (with ``shift``,
    # the sticks' distance from the first set's): worked out once for all the tiles of a regular tensor.
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    shift: int = 0

    @property
    def nbytes(self) -> int:
        return int(self.sticks.size) * STICK_BYTES

    def patterns(self) -> list[tuple[int, int, DmaPattern]]:
        """``stick_patterns(self.sticks)``, computed once per family of translations."""
        found = self.memo.get("patterns")
        if found is None:
            found = self.memo["patterns"] = (self.shift, stick_patterns(self.sticks))
        shift, pats = found
        if shift == self.shift:
            return pats
        return [(first + self.shift - shift, sp, pat) for first, sp, pat in pats]


def translated(ref: StickSet, ref_elems: np.ndarray, device_elems: np.ndarray, lanes: int) -> StickSet | None:
    """``stick_set`` of ``device_elems`` when they are ``ref_elems`` (whose stick set is ``ref``, under the
    same ``valid``) moved by a whole number of sticks, else None: the sticks move with them, and the
    positions (ranks and lanes) stay the same."""
    if device_elems.shape != ref_elems.shape or device_elems.size == 0:
        return None
    d = int(device_elems.flat[0]) - int(ref_elems.flat[0])
    if d % lanes or not (np.subtract(device_elems, ref_elems) == d).all():
        return None
    return StickSet(ref.sticks + d // lanes, ref.position, ref.memo, ref.shift + d // lanes)


def stick_set(place: TensorView, device_elems: np.ndarray, valid: np.ndarray | None = None) -> StickSet:
    """Sticks under ``device_elems`` (only where ``valid``) and the positions of the elements in them."""
    lanes = place.lanes
    sticks = device_elems // lanes
    used = sticks if valid is None else sticks[valid]
    uniq = sorted_unique(used)
    return StickSet(uniq, _stick_rank(uniq, sticks, valid is None) * lanes + device_elems % lanes)


def _stick_rank(uniq: np.ndarray, sticks: np.ndarray, all_used: bool) -> np.ndarray:
    """Each element's rank of its stick in ``uniq`` (clipped to the last: masked-off elements may name a
    stick outside it), what ``np.searchsorted(uniq, sticks)`` gives."""
    if sticks.size >= 4096:
        # Ranks once per run of equal sticks (a stick's lanes are neighbours in a tile's row-major order).
        flat = sticks.reshape(-1)
        first = np.flatnonzero(run_starts(flat))
        if first.size * 2 <= flat.size:
            runs = np.diff(np.append(first, flat.size))
            return np.repeat(_stick_rank(uniq, flat[first], all_used), runs).reshape(sticks.shape)
    lo = int(uniq[0]) if uniq.size else 0
    span = int(uniq[-1]) - lo + 1 if uniq.size else 0
    if uniq.size and sticks.size >= 4096 and span <= 4 * sticks.size and (
            all_used or (sticks.min() >= lo and sticks.max() < lo + span)):
        # The rank of every stick by a table over the sticks' range (what searchsorted gives, in O(n)).
        below = np.zeros(span + 1, dtype=np.int64)
        below[uniq - lo + 1] = 1
        np.cumsum(below, out=below)
        rank = below[sticks - lo]
    else:
        rank = np.searchsorted(uniq, sticks)
    return np.minimum(rank, max(uniq.size - 1, 0))


def stick_patterns(dev: np.ndarray, sp_stick0: int = 0) -> list[tuple[int, int, DmaPattern]]:
    """DMA patterns moving the device sticks ``dev`` to (or from) consecutive scratchpad sticks from
    ``sp_stick0`` on, in ``dev``'s row-major order: [(first device stick, first scratchpad stick, pattern)].
    The one stick-run compression of the generators:

    - a 1-d ``dev`` (the sorted sticks of an access, or one run of a packed tensor) is cut into runs of
      consecutive sticks (contiguous bursts); equal runs at a constant stride become one two-level
      pattern [runs, run length];
    - a tile (any rank > 1) that is affine in its indices is one pattern whose loops are ordered by
      decreasing device stride (the DMA engine reorders, so the innermost loop is the longest contiguous
      burst); otherwise each outer slice is covered in turn (slices that are not affine: as above).
    """
    dev = np.asarray(dev, dtype=np.int64)
    if dev.size == 0:
        return []
    return _runs(dev, sp_stick0) if dev.ndim == 1 else _tile_patterns(dev, sp_stick0)


def _run_groups(sticks: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of consecutive sticks, equal runs at a constant stride grouped: [(position, runs, run length)]."""
    breaks = np.flatnonzero(np.diff(sticks) != 1) + 1
    starts = np.r_[0, breaks]
    lengths = np.diff(np.r_[starts, sticks.size])
    out = []
    i = 0
    while i < starts.size:
        j = i + 1
        if j < starts.size and lengths[j] == lengths[i]:
            stride = sticks[starts[j]] - sticks[starts[i]]
            while (j < starts.size and lengths[j] == lengths[i]
                   and sticks[starts[j]] - sticks[starts[j - 1]] == stride):
                j += 1
        out.append((int(starts[i]), j - i, int(lengths[i])))
        i = j
    return out


def _runs(sticks: np.ndarray, sp_stick0: int) -> list[tuple[int, int, DmaPattern]]:
    """A 1-d list: one pattern per group of runs ([runs, run length], or [run length] alone)."""
    out = []
    for pos, n, run in _run_groups(sticks):
        if n == 1:
            pat = DmaPattern((run,), (STICK_BYTES,), (STICK_BYTES,))
        else:
            stride = int(sticks[pos + run] - sticks[pos])
            pat = DmaPattern((n, run), (stride * STICK_BYTES, STICK_BYTES), (run * STICK_BYTES, STICK_BYTES))
        out.append((int(sticks[pos]), sp_stick0 + pos, pat))
    return out


def _tile_patterns(dev: np.ndarray, sp_stick0: int) -> list[tuple[int, int, DmaPattern]]:
    sp_strides = [math.prod(dev.shape[d + 1:]) for d in range(dev.ndim)]
    strides = _stick_strides(dev)
    if strides is not None:
        loops = [d for d in range(dev.ndim) if dev.shape[d] > 1] or [dev.ndim - 1]
        loops.sort(key=lambda d: (-abs(strides[d]), -sp_strides[d]))
        pat = DmaPattern(tuple(dev.shape[d] for d in loops), tuple(strides[d] * STICK_BYTES for d in loops),
                         tuple(sp_strides[d] * STICK_BYTES for d in loops))
        return [(int(dev.flat[0]), sp_stick0, pat)]
    if dev.ndim == 1:  # each group of runs is an affine [runs, run length] tile
        return [pat for pos, n, run in _run_groups(dev)
                for pat in _tile_patterns(dev[pos:pos + n * run].reshape(n, run), sp_stick0 + pos)]
    out = []
    for i in range(dev.shape[0]):
        out += _tile_patterns(dev[i], sp_stick0 + i * sp_strides[0])
    return out


def _stick_strides(dev: np.ndarray) -> tuple[int, ...] | None:
    """Strides (in sticks) if ``dev[i0, i1, ...] = dev[0...] + sum(i_k * s_k)``, else None (0 for size-1 dims)."""
    found = affine_strides(dev)
    return None if found is None else found[1]


# ---------------------------------------------------------------------------------------------
# Affine views over boxes
# ---------------------------------------------------------------------------------------------
def affine_strides(p: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(base, strides) if ``p[i] == base + sum(i_k * strides_k)`` for every index, else None."""
    if p.size == 0:
        return 0, tuple(0 for _ in p.shape)
    base = int(p.flat[0])
    if p.size == 1:  # one element (an irregular tile's boxes can be single elements): nothing to fit
        return base, tuple(0 for _ in p.shape)
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


def _steps(a: np.ndarray, axis: int) -> tuple[np.ndarray, int]:
    """Along ``axis``: the positions j + 1 where step j differs from the array's first step (on any line;
    an empty array when the axis moves by one constant step everywhere, :func:`line_affine`), and how
    many elements from the start move by each line's own first step (the run before a stick boundary)."""
    n = a.shape[axis]
    if n <= 1:
        return np.zeros(0, np.int64), n
    d = np.diff(a, axis=axis)
    others = tuple(k for k in range(d.ndim) if k != axis)
    breaks = np.flatnonzero(np.any(d != d.flat[0], axis=others)) + 1
    if n <= 2:
        return breaks, n
    bad = np.flatnonzero(np.any(d != np.take(d, [0], axis=axis), axis=others))
    return breaks, int(bad[0]) + 1 if bad.size else n


def choose_splits(arrays: list[np.ndarray], factors: list[int] | None = None) -> dict[int, list[int]]:
    """Per dim, mixed-radix factors (innermost first) after which every array moves by a constant step
    along each new axis: a dim that crosses stick boundaries becomes (..., sticks, lanes).

    Each factor is the largest divisor f of the dim's outer size n (1 < f < n) no longer than the shortest
    regular run, such that splitting off f makes the new inner axis of every array move by its first step.
    That inner axis holds steps j with (j + 1) % f != 0, so f qualifies exactly when it divides every
    position where a step differs: the factor is read off the gcd of those positions, one pass over the
    arrays per factor found, however many divisors n has."""
    if not arrays:
        return {}
    shape = arrays[0].shape
    splits: dict[int, list[int]] = {}
    for d in reversed(range(len(shape))):
        if shape[d] <= 1:
            continue  # nothing to split (every array moves by no step along it)
        fs: list[int] = []
        while True:
            cur_shape, axes = refine_shape(shape, {**splits, d: fs})
            outer_axis = axes[d][0]
            steps = [_steps(a.reshape(cur_shape), outer_axis) for a in arrays]
            breaks = [b for b, _ in steps if b.size]
            if not breaks:
                break
            n = cur_shape[outer_axis]
            run = min(r for _, r in steps)
            common = math.gcd(n, *(int(np.gcd.reduce(b)) for b in breaks))
            found = max((f for f in _divisors(common) if 1 < f < n and f <= run), default=None)
            if found is None:
                break
            fs.append(found)
        if fs:
            splits[d] = fs
    return splits


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


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
    if m.size <= 1 or np.all(m == m.flat[0]):
        return None  # (one element is uniform, even a NaN)
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


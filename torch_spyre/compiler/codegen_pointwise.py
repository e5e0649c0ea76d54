"""Pointwise and reduction kernels -> Spyre programs.

Input: a :class:`~torch_spyre.compiler.kernel_ir.KernelSpec` and, for every buffer it names, where the
bound tensor lives (:class:`~torch_spyre.compiler.access.TensorPlace`: stick layout + storage offset).
Output: a :class:`~torch_spyre.program.Program` whose ``metadata["decisions"]`` is the kernel's
:class:`~torch_spyre.compiler.decisions.KernelDecisions`.

How a kernel runs on the card
-----------------------------
- The outer iteration space (``x``) is divided over the cores in boxes (:func:`divide_work`); every
  output stick belongs to one core (checked numerically), a core never reaches past
  ``core_address_span_bytes``.
- Each core walks its box in *tiles* (x box x reduction chunk) sized so that the scratchpad plan fits
  ``scratchpad_plannable_bytes`` (:func:`scratchpad.plan` by liveness). Input sticks of the next chunk
  are loaded while the current one is computed (two buffers per input).
- Inside a tile every access is analysed numerically (``access.py``); the tile is cut into *boxes*
  where every access is one strided view and every static mask is constant, and each op of the DAG
  becomes one vector instruction per box (op-major, so intermediate buffers live only while needed).
- Reductions accumulate in fp32 into an outer buffer (initialised to the op's identity), one ``Reduce``
  per reduced view axis; ops that need a reduction's result run in a later *phase* (a second pass over
  the chunk, from scratchpad when the whole reduction fits in one chunk).
- Stores go to staging sticks in scratchpad and are DMA'd out; sticks a tile only partly writes are
  loaded first (read-modify-write), padding included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..errors import SpyreError
from ..program import (
    dram_spans,
    STICK_BYTES,
    Addr,
    DmaLoad,
    DmaStore,
    Elementwise,
    Instruction,
    Operand,
    Program,
    Reduce,
    Scalar,
    SpTensor,
)
from . import access
from .access import TensorPlace
from .decisions import BufferDecision, KernelDecisions
from .kernel_ir import KernelSpec, LoweringError, UnsupportedDtypeError, check_computable
from .scratchpad import ScratchpadOverflowError, SpBuffer, plan


class AddressSpanError(SpyreError, ValueError):
    """A core would address more device memory than ``core_address_span_bytes`` allows."""


# Inductor dtype name -> scratchpad dtype of computed values.
COMPUTE_DTYPES = {
    "float16": "dlfloat16", "bfloat16": "dlfloat16", "float32": "float32", "int64": "int64", "int32": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}
# Inductor op -> program op (direct).
DIRECT_OPS = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "div": "div", "int_truediv": "div",
    "neg": "neg", "abs": "abs", "relu": "relu", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "reciprocal": "reciprocal", "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf", "sin": "sin", "cos": "cos",
    "floor": "floor", "ceil": "ceil", "round": "round", "sign": "sign", "logical_not": "logical_not",
    "square": "square", "maximum": "maximum", "minimum": "minimum", "pow": "pow", "lt": "lt", "le": "le",
    "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne", "logical_and": "logical_and", "logical_or": "logical_or",
    "remainder": "remainder", "mod": "remainder", "floordiv": "floordiv", "where": "where", "fma": "fma",
    "libdevice_exp": "exp", "libdevice_sqrt": "sqrt", "libdevice_abs": "abs", "libdevice_log": "log",
    "floor_to_int": "floor", "ceil_to_int": "ceil", "round_to_int": "round",
}
# Bit operations the card has only as logical operations: right for bool operands only.
BOOL_ONLY_OPS = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_not": "logical_not",
                 "and_": "logical_and", "or_": "logical_or", "xor": "ne", "bitwise_xor": "ne"}
REDUCE_IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}
MAX_BOXES_PER_TILE = 4096


# ---------------------------------------------------------------------------------------------
# The kernel's DAG, normalised: one list of values over all nodes
# ---------------------------------------------------------------------------------------------
@dataclass
class Value:
    gid: int
    op: str  # "load", "store", "const", "static", "reduction", "alias", or a program op
    args: list[Any]  # gids of inputs (ints) or literals
    dtype: str | None  # Inductor dtype name
    node: int
    attrs: dict[str, Any] = field(default_factory=dict)
    extent: str = "full"  # "full", "outer", "scalar", "static"
    guards: set = field(default_factory=set)  # static masks that must hold where the value is used
    phase: int = 0  # full values: the pass that computes them; outer values: the stage after which they exist

    @property
    def sp_dtype(self) -> str:
        """Scratchpad dtype of the value. 16-bit float values are kept in fp32 between ops (the vector
        unit computes in fp32; Inductor's GPU backends upcast the same way); only an explicit
        ``to_dtype`` rounds to DLFloat16 (which has no infinities: -inf becomes its NaN code)."""
        dt = compute_dtype(self.dtype)
        if dt == "dlfloat16" and self.op != "to_dtype":
            return "float32"
        return dt


def compute_dtype(name: str | None) -> str:
    if name is None:
        return "float32"
    check_computable(name, "the kernel")
    try:
        return COMPUTE_DTYPES[name]
    except KeyError:
        raise UnsupportedDtypeError(f"the Spyre card cannot compute in {name}; use float16 or float32") from None


def _literal(v: Any) -> float | int | bool:
    if isinstance(v, str):
        return float(v)
    return v


class Dag:
    """All nodes' ops as one DAG of :class:`Value` with extents and phases."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.values: list[Value] = []
        self._cse: dict[tuple, int] = {}
        self.stored: dict[str, list[int]] = {}  # buffer -> store value gids, in order
        for ni, node in enumerate(spec.nodes):
            self._add_node(ni, node)
        self._extents()
        self._phases()
        self._guards()

    def _new(self, op: str, args: list[Any], dtype: str | None, node: int, **attrs: Any) -> int:
        """Append a value, or return the identical one already there (common subexpressions across the
        kernel's nodes: Inductor repeats a softmax's exp(x - max) in the node that normalises it)."""
        key = self._cse_key(op, args, dtype, node, attrs)
        if key is not None and key in self._cse:
            return self._cse[key]
        v = Value(len(self.values), op, args, dtype, node, attrs)
        self.values.append(v)
        if key is not None:
            self._cse[key] = v.gid
        return v.gid

    def _cse_key(self, op: str, args: list[Any], dtype: str | None, node: int, attrs: dict[str, Any]):
        if op in ("store", "reduction", "indirect"):
            return None
        if op in ("load", "static"):
            if "ind" in attrs["index"]:  # indirect symbols are per node
                return None
            n = self.spec.nodes[node]
            space = (n.placement, tuple(n.sizes), tuple(n.reduction_sizes))
            return (op, attrs["index"], attrs.get("buffer"), tuple(attrs.get("guards", [])), dtype, space)
        if op == "const":
            return (op, repr(args[0]), type(args[0]).__name__, dtype)
        return (op, tuple(args), dtype, tuple(sorted((k, repr(v)) for k, v in attrs.items())))

    def _add_node(self, ni: int, node: Any) -> None:
        local: dict[int, int] = {}

        def ref(a: int) -> int:
            return local[a]

        for o in node.ops:
            args = [ref(a) for a in o.args]
            if o.op == "load":
                gid = self._new("load", [], o.dtype, ni, buffer=o.attrs["buffer"], index=o.attrs["index"],
                                guards=[local[g] for g in o.attrs.get("guards", [])])
            elif o.op == "store":
                gid = self._new("store", args, o.dtype, ni, buffer=o.attrs["buffer"], index=o.attrs["index"])
                self.stored.setdefault(o.attrs["buffer"], []).append(gid)
            elif o.op == "constant":
                gid = self._new("const", [_literal(o.attrs["value"])], o.dtype, ni)
            elif o.op == "index_expr":
                gid = self._new("static", [], o.dtype, ni, index=o.attrs["index"], kind="index")
            elif o.op == "reduction" and o.attrs["reduction"] in ("argmax", "argmin"):
                gid = self._arg_reduction(o.attrs["reduction"], args[0], o.dtype, ni)
            elif o.op == "reduction":
                gid = self._new("reduction", args, o.dtype, ni, reduction=o.attrs["reduction"])
            elif o.op == "to_dtype":
                gid = self._new("to_dtype", args, o.dtype, ni)
            elif o.op == "indirect":
                gid = self._new("indirect", args, o.dtype, ni, **o.attrs)
            elif o.op == "identity":
                gid = args[0]
            else:
                gid = self._lower_pointwise(o.op, args, o.dtype, ni)
            local[o.id] = gid

    def _arg_reduction(self, kind: str, x: int, dtype: str | None, ni: int) -> int:
        """argmax/argmin(x) as two reductions: m = max/min(x), then the least position whose value is m,
        or is NaN (torch returns the first NaN; max/min propagate a NaN into m, so then no value equals
        m and only NaNs are candidates). Positions come from ``rindex`` (an on-chip iota); fp32 holds them
        exactly up to 2**24, past that they are int64."""
        n = math.prod(self.spec.r_sizes) if self.spec.r_sizes else 1
        pdt = "float32" if n <= 1 << 24 else "int64"
        x_dt = self.values[x].dtype
        m = self._new("reduction", [x], x_dt, ni, reduction="max" if kind == "argmax" else "min")
        hit = self._new("eq", [x, m], "bool", ni)
        if x_dt in ("float16", "bfloat16", "float32", "float64"):
            hit = self._new("logical_or", [hit, self._new("ne", [x, x], "bool", ni)], "bool", ni)
        pos = self._new("rindex", [], pdt, ni)
        none = self._new("const", [float(n) if pdt == "float32" else n], pdt, ni)  # past every position
        first = self._new("reduction", [self._new("where", [hit, pos, none], pdt, ni)], pdt, ni, reduction="min")
        return self._new("to_dtype", [first], dtype or "int64", ni)

    def _lower_pointwise(self, op: str, args: list[Any], dtype: str | None, ni: int) -> int:
        """Inductor pointwise ops in terms of the card's elementwise ops."""
        if op in DIRECT_OPS:
            return self._new(DIRECT_OPS[op], args, dtype, ni)
        if op in BOOL_ONLY_OPS:
            kinds = {self.values[a].dtype for a in args}
            if kinds - {"bool"}:
                raise LoweringError(f"{op} on {sorted(k for k in kinds if k)} has no Spyre lowering: the vector unit "
                                    "has logical, not bitwise, operations (bool operands only)")
            return self._new(BOOL_ONLY_OPS[op], args, "bool", ni)
        c = lambda v: self._new("const", [v], "float32", ni)  # noqa: E731
        if op == "expm1":
            return self._new("sub", [self._new("exp", args, dtype, ni), c(1.0)], dtype, ni)
        if op == "log1p":
            return self._new("log", [self._new("add", [args[0], c(1.0)], dtype, ni)], dtype, ni)
        if op == "exp2":
            return self._new("exp", [self._new("mul", [args[0], c(math.log(2.0))], dtype, ni)], dtype, ni)
        if op == "log2":
            return self._new("mul", [self._new("log", args, dtype, ni), c(1.0 / math.log(2.0))], dtype, ni)
        if op == "log10":
            return self._new("mul", [self._new("log", args, dtype, ni), c(1.0 / math.log(10.0))], dtype, ni)
        if op == "isnan":
            return self._new("ne", [args[0], args[0]], "bool", ni)
        if op == "isinf":
            return self._new("eq", [self._new("abs", args, dtype, ni), c(float("inf"))], "bool", ni)
        if op in ("trunc", "trunc_to_int"):
            # trunc(x) = sign(x) * floor(|x|)
            fl = self._new("floor", [self._new("abs", args, dtype, ni)], dtype, ni)
            return self._new("mul", [self._new("sign", args, dtype, ni), fl], dtype, ni)
        raise LoweringError(f"pointwise op {op!r} has no Spyre lowering yet")

    # --- extents and phases ---------------------------------------------------------------------
    def _extents(self) -> None:
        placements = [n.placement for n in self.spec.nodes]
        aliases = getattr(self, "aliases", {})
        for v in self.values:
            if v.gid in aliases:
                v.extent = self.values[aliases[v.gid]].extent
                continue
            node_full = placements[v.node] in ("full", "reduction")
            if v.op == "const":
                v.extent = "scalar"
            elif v.op in ("static", "indirect"):
                v.extent = "static"
            elif v.op == "rindex":
                v.extent = "full"
            elif v.op == "load":
                v.extent = "full" if node_full else "outer"
            elif v.op == "reduction":
                v.extent = "outer"
            elif v.op == "store" and self.values[v.args[0]].extent in ("static", "scalar"):
                # a store of an index-only value (arange, full) still writes every element
                v.extent = "full" if node_full else "outer"
            else:
                ins = [self.values[a].extent for a in self.inputs(v)]
                if "full" in ins:
                    v.extent = "full"
                elif "outer" in ins:
                    v.extent = "outer"
                elif "static" in ins:
                    v.extent = "static"
                else:
                    v.extent = "scalar"

    def inputs(self, v: Value) -> list[int]:
        return [] if v.op == "const" else [a for a in v.args if isinstance(a, int) and not isinstance(a, bool)]

    def merge(self, canon: dict[int, int]) -> None:
        """Replace values by equal ones (``canon``: gid -> the gid it equals), then merge the pure ops
        that become identical, in one forward pass. Replaced values stay in the list, unused."""
        canon = dict(canon)

        def c(a: int) -> int:
            while a in canon:
                a = canon[a]
            return a

        seen: dict[tuple, int] = {}
        for v in self.values:
            if v.op == "const":
                continue
            v.args = [c(a) for a in v.args]
            if "guards" in v.attrs:
                v.attrs["guards"] = [c(g) for g in v.attrs["guards"]]
            if v.op in ("store", "reduction", "indirect", "load", "static") or v.gid in canon:
                continue
            key = (v.op, tuple(v.args), v.dtype)
            if key in seen:
                canon[v.gid] = seen[key]
            else:
                seen[key] = v.gid

    def set_aliases(self, aliases: dict[int, int]) -> None:
        """Loads served from values of this kernel take the extent and phase of those values."""
        self.aliases = dict(aliases)
        self._extents()
        self._phases()
        self._guards()

    def _phases(self) -> None:
        aliases = getattr(self, "aliases", {})
        for v in self.values:
            if v.gid in aliases:
                src = self.values[aliases[v.gid]]
                v.extent, v.phase = src.extent, src.phase
                continue
            ins = [self.values[a] for a in self.inputs(v)]
            if v.op == "reduction":
                v.phase = ins[0].phase if ins[0].extent == "full" else 0
            elif v.extent == "full":
                p = 0
                for i in ins:
                    if i.extent == "full":
                        p = max(p, i.phase)
                    elif i.extent == "outer":
                        p = max(p, i.phase + 1)
                v.phase = p
            elif v.extent == "outer":
                # stage after which the value exists; -1: before any pass
                v.phase = max([i.phase for i in ins if i.extent == "outer"] or [-1])
                if v.op == "load":
                    v.phase = -1
            else:
                v.phase = -1
        self.n_phases = 1 + max([v.phase for v in self.values if v.extent == "full"] or [0])

    def _guards(self) -> None:
        """The static masks under which each value exists (Inductor's ``masked``): loads carry them, ops
        inherit them, ``where(mask, a, b)`` removes ``mask`` from its branches'."""
        aliases = getattr(self, "aliases", {})
        for v in self.values:
            # A load served from scratchpad reads nothing out of range: its masks do not restrict it.
            g = set(v.attrs.get("guards", [])) if v.op == "load" and v.gid not in aliases else set()
            ins = self.inputs(v)
            if v.op == "where":
                c = ins[0]
                g |= self.values[c].guards
                for a in ins[1:]:
                    g |= self.values[a].guards - {c}
            else:
                for a in ins:
                    g |= self.values[a].guards
            v.guards = g

    def reductions(self) -> list[Value]:
        return [v for v in self.values if v.op == "reduction"]


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
    if outer:
        coords = _grid(xo, xs)
        xl = _linear(coords, spec.x_sizes)
        return _unravel(xl, node.sizes, "x")
    coords = _grid(tuple(xo) + tuple(ro), tuple(xs) + tuple(rs))
    xl = _linear(coords[:nx], spec.x_sizes)
    rl = _linear(coords[nx:], spec.r_sizes)
    full_shape = tuple(xs) + tuple(rs)
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


# ---------------------------------------------------------------------------------------------
# Per-tile analysis
# ---------------------------------------------------------------------------------------------
@dataclass
class AccessInTile:
    gid: int  # the load or store value
    buffer: str
    extent: str  # "full" or "outer"
    device: np.ndarray  # device element offsets over the domain (full or outer shape)
    valid: np.ndarray | None  # where the access is used (guards); None = everywhere
    sticks: access.StickSet | None = None
    alias: int | None = None  # a load served from a value of this kernel
    same_as: int | None = None  # a load of exactly the same elements as an earlier load: shares its sticks
    host: np.ndarray | None = None  # host element indices (relative to the view)


@dataclass
class Box:
    origin: tuple[int, ...]  # relative to the tile
    shape: tuple[int, ...]
    splits: dict[int, list[int]]  # mixed-radix factors per dim (innermost first)
    views: dict[int, tuple[int, tuple[int, ...]]]  # access gid -> (base position, strides) in refined dims
    statics: dict[int, Any]  # static value gid -> its (uniform) value in this box

    @property
    def refined(self) -> tuple[tuple[int, ...], list[list[int]]]:
        return access.refine_shape(self.shape, self.splits)


@dataclass
class Chunk:
    """One pass over one reduction chunk of one x tile."""

    tile: int
    phase: int
    xo: tuple[int, ...]
    xs: tuple[int, ...]
    ro: tuple[int, ...]
    rs: tuple[int, ...]
    accesses: dict[int, AccessInTile] = field(default_factory=dict)
    full_boxes: list[Box] = field(default_factory=list)
    outer_boxes: list[Box] = field(default_factory=list)
    first_of_tile: bool = False
    last_of_tile: bool = False
    run_full: list[int] = field(default_factory=list)  # full value gids computed in this chunk
    run_outer: list[int] = field(default_factory=list)  # outer value gids computed after this chunk
    accessed: list[int] = field(default_factory=list)  # load/store gids to analyse (default: those run)


class KernelGen:
    def __init__(self, spec: KernelSpec, places: dict[str, TensorPlace], config: Any):
        self.spec = spec
        self.places = places
        self.config = config
        self.dag = Dag(spec)
        self.nx = len(spec.x_sizes)
        self.factors = sorted({p.lanes for p in places.values()})
        for b in spec.buffers:
            compute_dtype(b.dtype)
        self.decisions = KernelDecisions(spec.name, spec.kind, list(spec.source_ops), list(spec.source_lines))

    # --- statics --------------------------------------------------------------------------------
    def static_value(self, gid: int, env: dict[str, np.ndarray], cache: dict[int, Any]) -> Any:
        """Numeric value of an index-only value over a domain (numpy)."""
        if gid in cache:
            return cache[gid]
        v = self.dag.values[gid]
        if v.op == "const":
            out = v.args[0]
        elif v.op == "static":
            out = access.evaluate(v.attrs["index"], env)
        elif v.op == "indirect":
            out = np.asarray(self.static_value(v.args[0], env, cache)).astype(np.int64)
            if v.attrs.get("wrap_neg", True):
                out = np.where(out < 0, out + v.attrs["size"], out)
        elif v.op == "to_dtype":
            x = self.static_value(v.args[0], env, cache)
            out = np.asarray(x).astype(np.float64 if v.sp_dtype in ("float32", "dlfloat16") else
                                       np.bool_ if v.sp_dtype == "bool" else np.int64)
        else:
            from ..card.execute import _BINARY, _TERNARY, _UNARY

            args = [self.static_value(a, env, cache) if isinstance(a, int) and not isinstance(a, bool) else a
                    for a in v.args]
            fn = _UNARY.get(v.op) or _BINARY.get(v.op) or _TERNARY.get(v.op)
            if fn is None:
                raise LoweringError(f"cannot evaluate {v.op} on index values")
            with np.errstate(all="ignore"):
                out = fn(*[np.asarray(a) for a in args])
        cache[gid] = out
        return out

    def _static_consumers(self) -> list[int]:
        """Static values consumed by computed values (they must be uniform within each box)."""
        out = []
        for v in self.dag.values:
            if v.extent in ("full", "outer") and v.op not in ("load",):
                for a in self.dag.inputs(v):
                    if self.dag.values[a].extent == "static" and a not in out:
                        out.append(a)
            if v.op == "load":
                for g in v.attrs.get("guards", []):
                    if g not in out:
                        out.append(g)
        return out

    def node_env(self, node: int, xo, xs, ro, rs, outer: bool) -> dict[str, np.ndarray]:
        """A node's loop variables over a tile, plus its indirect index symbols, which must be
        computable from the loop indices (an index read from memory is a gather: refused here)."""
        env = node_vars(self.spec, node, xo, xs, ro, rs, outer)
        cache: dict[int, Any] = {}
        for v in self.dag.values:
            if v.node != node or v.op != "indirect":
                continue
            src = self.dag.values[v.args[0]]
            if src.extent != "static" and not self._index_only(src.gid):
                raise LoweringError(
                    f"kernel {self.spec.name}: an index read from memory ({src.op}); data-dependent indexing runs "
                    "on the gather generator, whose lowerings take embedding, index_select, x[idx] with one index "
                    "tensor and torch.gather/take_along_dim on tensors of at least one dim with an index of the "
                    "same rank; this form did not reach it: rewrite it as one of those")
            env[v.attrs["symbol"]] = np.asarray(self.static_value(v.gid, env, cache))
        return env

    def _index_only(self, gid: int) -> bool:
        v = self.dag.values[gid]
        if v.op in ("const", "static"):
            return True
        if v.op == "load":
            return False
        return all(self._index_only(a) for a in self.dag.inputs(v))

    # --- analysing one chunk ---------------------------------------------------------------------
    def analyse(self, ch: Chunk, outer_only: bool = False) -> None:
        spec, dag = self.spec, self.dag
        full_shape = tuple(ch.xs) + tuple(ch.rs)
        env_full: dict[int, dict[str, np.ndarray]] = {}
        env_outer: dict[int, dict[str, np.ndarray]] = {}

        def env(node: int, outer: bool) -> dict[str, np.ndarray]:
            table = env_outer if outer else env_full
            if node not in table:
                table[node] = self.node_env(node, ch.xo, ch.xs, ch.ro, ch.rs, outer)
            return table[node]

        static_cache: dict[tuple[int, bool], dict[int, Any]] = {}

        def static(gid: int, outer: bool) -> np.ndarray:
            node = dag.values[gid].node
            cache = static_cache.setdefault((node, outer), {})
            val = self.static_value(gid, env(node, outer), cache)
            shape = ch.xs if outer else full_shape
            return np.broadcast_to(np.asarray(val), shape)

        needed = set(ch.accessed) if ch.accessed else set(ch.run_full) | set(ch.run_outer)
        for gid in sorted(needed):
            v = dag.values[gid]
            if v.op not in ("load", "store") or gid in getattr(self, "aliases", {}):
                continue
            outer = v.extent == "outer"
            if v.op == "store" and dag.values[v.args[0]].extent == "outer":
                outer = True
            node = dag.values[gid].node
            e = env(node, outer or spec.nodes[node].placement == "outer")
            idx = access.evaluate(v.attrs["index"], e)
            shape = ch.xs if outer else full_shape
            idx = np.broadcast_to(idx, shape)
            valid = None
            for g in v.attrs.get("guards", []):
                m = static(g, outer) != 0
                valid = m if valid is None else (valid & m)
            internal = v.attrs["buffer"] in self.spec.internal
            if internal:  # a buffer that lives only in this kernel: host indices, for the alias check
                a = AccessInTile(gid, v.attrs["buffer"], "outer" if outer else "full", idx, valid, host=idx)
                if v.op == "load":
                    a.alias = self.aliases.get(gid) if hasattr(self, "aliases") else self._internal_alias(v, ch, idx, outer)
                    if a.alias is None:
                        raise LoweringError(f"kernel {spec.name}: {v.attrs['buffer']} is read before it is written")
                ch.accesses[gid] = a
                continue
            place = self.places[v.attrs["buffer"]]
            if valid is not None and not valid.any():
                ch.accesses[gid] = AccessInTile(gid, v.attrs["buffer"], "outer" if outer else "full",
                                                np.zeros(shape, np.int64), valid, access.StickSet(np.zeros(0, np.int64), np.zeros(shape, np.int64)))
                continue
            safe_idx = idx if valid is None else np.where(valid, idx, idx[valid].flat[0])
            dev = access.device_elements(place, safe_idx, f"{'load from' if v.op == 'load' else 'store to'} {v.attrs['buffer']}")
            a = AccessInTile(gid, v.attrs["buffer"], "outer" if outer else "full", dev, valid, host=idx)
            if hasattr(self, "aliases"):
                a.alias = self.aliases.get(gid)
            elif v.op == "load":
                a.alias = self._internal_alias(v, ch, idx, outer)
            if a.alias is None:
                a.sticks = access.stick_set(place, dev, valid)
            ch.accesses[gid] = a
        self._dedupe_loads(ch)
        statics = self._static_consumers()
        full_static = {g: static(g, False) for g in statics if self._used_in(g, "full")}
        outer_static = {g: static(g, True) for g in statics if self._used_in(g, "outer")}
        if not outer_only:
            full_acc = [a for a in ch.accesses.values() if a.alias is None and a.same_as is None
                        and a.sticks is not None and dag.values[a.gid].extent == "full"]
            ch.full_boxes = self.partition(full_shape, full_acc, full_static)
        outer_acc = [a for a in ch.accesses.values()
                     if a.alias is None and a.same_as is None and a.sticks is not None and a.extent == "outer"]
        ch.outer_boxes = self.partition(tuple(ch.xs), outer_acc, outer_static)

    def _dedupe_loads(self, ch: Chunk) -> None:
        """Loads of the same elements of the same buffer (Inductor repeats a load in every node that
        reads it) share one DMA and one scratchpad buffer."""
        seen: dict[tuple, int] = {}
        for gid in sorted(ch.accesses):
            a = ch.accesses[gid]
            if self.dag.values[gid].op != "load" or a.alias is not None or a.sticks is None:
                continue
            key = (a.buffer, a.extent, a.device.shape, a.device.tobytes(),
                   None if a.valid is None else a.valid.tobytes())
            if key in seen:
                a.same_as, a.sticks = seen[key], None
            else:
                seen[key] = gid

    def _used_in(self, gid: int, extent: str) -> bool:
        for v in self.dag.values:
            if gid in self.dag.inputs(v) or gid in v.attrs.get("guards", []):
                if v.extent == extent:
                    return True
        return False

    def _internal_alias(self, v: Value, ch: Chunk, host: np.ndarray, outer: bool) -> int | None:
        """A load of a buffer an earlier node of this kernel stores, at the same elements: the stored value."""
        dev = host
        for sgid in self.dag.stored.get(v.attrs["buffer"], []):
            if sgid > v.gid:
                continue
            s = self.dag.values[sgid]
            src = self.dag.values[s.args[0]]
            sa = ch.accesses.get(sgid)
            if sa is None:
                continue
            target = sa.host
            if src.extent == "outer" and not outer:
                target = np.broadcast_to(target.reshape(tuple(ch.xs) + (1,) * len(ch.rs)), dev.shape)
            if target.shape == dev.shape and np.array_equal(target, dev):
                return s.args[0]
            raise LoweringError(
                f"{v.attrs['buffer']} is stored and then read at other elements inside one fused kernel "
                f"({self.spec.name}); the Spyre compiler cannot serve that read yet"
            )
        return None

    # --- boxes -----------------------------------------------------------------------------------
    def partition(self, shape: tuple[int, ...], accs: list[AccessInTile], statics: dict[int, np.ndarray]) -> list[Box]:
        if not all(shape):
            return []
        out: list[Box] = []
        stack = [(tuple(0 for _ in shape), tuple(shape))]
        while stack:
            org, shp = stack.pop()
            sl = tuple(slice(o, o + n) for o, n in zip(org, shp))
            cut = None
            for g, m in statics.items():
                cut = access.uniform_split(np.asarray(m)[sl])
                if cut:
                    break
            if cut is None:
                box = self._box(org, shp, sl, accs, statics)
                if box is not None:
                    out.append(box)
                    if len(out) > MAX_BOXES_PER_TILE:
                        raise LoweringError(
                            f"kernel {self.spec.name}: an access or mask is too irregular (more than "
                            f"{MAX_BOXES_PER_TILE} strided views per tile); it needs a relayout kernel first")
                    continue
                cut = self._affine_cut(sl, accs, statics)
            axis, pos = cut
            a = (org, shp[:axis] + (pos,) + shp[axis + 1:])
            b = (org[:axis] + (org[axis] + pos,) + org[axis + 1:], shp[:axis] + (shp[axis] - pos,) + shp[axis + 1:])
            stack.extend([b, a])
        out.sort(key=lambda b: b.origin)
        return out

    def _active(self, a: AccessInTile, sl) -> bool:
        return a.valid is None or bool(a.valid[sl].all())

    def _box(self, org, shp, sl, accs, statics) -> Box | None:
        arrays = {a.gid: a.sticks.position[sl] for a in accs if self._active(a, sl)}
        for a in accs:
            if a.valid is not None and a.valid[sl].any() and not a.valid[sl].all():
                return None
        splits = access.choose_splits(list(arrays.values()))
        refined, _ = access.refine_shape(shp, splits)
        views = {}
        for g, arr in arrays.items():
            fit = access.affine_strides(arr.reshape(refined))
            if fit is None:
                return None
            views[g] = fit
        st = {g: np.asarray(m)[sl].flat[0].item() for g, m in statics.items()}
        return Box(org, shp, splits, views, st)

    def _affine_cut(self, sl, accs, statics) -> tuple[int, int]:
        for a in accs:
            if a.valid is not None:
                cut = access.uniform_split(a.valid[sl])
                if cut:
                    return cut
        for a in accs:
            if not self._active(a, sl):
                continue
            arr = a.sticks.position[sl]
            if access.affine_strides(arr) is None:
                cut = access.split_point(arr)
                if cut:
                    # Cut at the last multiple of the regular run, so the first part can be one view
                    # with a split dimension (e.g. 4 whole sticks of a 300-wide row, then 44).
                    axis, pos = cut
                    n = arr.shape[axis]
                    return axis, max(pos, (n // pos) * pos if n % pos else pos)
        shp = tuple(s.stop - s.start for s in sl)
        axis = max(range(len(shp)), key=lambda d: shp[d])
        return axis, shp[axis] // 2


# ---------------------------------------------------------------------------------------------
# Schedules: which values each step computes
# ---------------------------------------------------------------------------------------------
@dataclass
class Step:
    kind: str  # "full" or "outer"
    phase: int
    chunk: Chunk
    values: list[int]
    loads: list[int] = field(default_factory=list)  # access gids whose sticks this step's group loads
    parity: int = 0


class Scheduler:
    """Tile-independent decisions: which values each phase computes, with recomputation when a
    reduction is chunked (``persistent`` False)."""

    def __init__(self, dag: Dag, aliases: dict[int, int], persistent: bool):
        self.dag, self.aliases, self.persistent = dag, aliases, persistent

    def deps(self, gid: int) -> list[int]:
        if gid in self.aliases:
            return [self.aliases[gid]]
        v = self.dag.values[gid]
        return self.dag.inputs(v) + list(v.attrs.get("guards", []))

    def closure(self, roots: Iterable[int], extent: str, done: set[int]) -> list[int]:
        """Roots and their not-yet-computed ancestors of ``extent``, in topological (gid) order."""
        seen: set[int] = set()
        root_set = set(roots)
        stack = list(roots)
        while stack:
            g = stack.pop()
            if g in seen or g in done:
                continue
            v = self.dag.values[g]
            if g not in root_set and (v.op == "reduction" or v.extent not in (extent, "scalar", "static")):
                continue
            seen.add(g)
            stack.extend(self.deps(g))
        return sorted(seen)

    def full_roots(self, phase: int) -> list[int]:
        """What pass ``phase`` must produce: its reductions, stores of full values, and full values a
        later pass reads."""
        return [v.gid for v in self.dag.values if v.phase == phase and (
            v.op == "reduction" or v.extent == "full" and (v.op == "store" or self._consumed_outside(v, phase)))]

    def _consumed_outside(self, v: Value, phase: int) -> bool:
        for u in self.dag.values:
            if v.gid in self.deps(u.gid) and (u.extent != "full" or u.phase != phase):
                return True
        return False

    def outer_roots(self, stage: int) -> list[int]:
        return [v.gid for v in self.dag.values
                if v.extent == "outer" and v.phase == stage and v.op not in ("load", "reduction")]


def _is_ref(a: Any) -> bool:
    return isinstance(a, int) and not isinstance(a, bool)


# ---------------------------------------------------------------------------------------------
# Symbolic scratchpad tensors (placed by the plan after emission)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sym:
    """A scratchpad tensor inside planned buffer ``buf`` (``rel`` bytes in)."""

    buf: str
    rel: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def end(self) -> int:
        t = SpTensor(self.rel, self.dtype, self.shape, self.strides)
        return t.byte_span()[1]

    def place(self, base: dict[str, int]) -> SpTensor:
        return SpTensor(base[self.buf] + self.rel, self.dtype, self.shape, self.strides)


@dataclass
class SymInstr:
    cls: type
    args: dict[str, Any]
    tile_step: int  # position within its tile's schedule (liveness)

    def syms(self) -> list[Sym]:
        out = []
        for v in self.args.values():
            if isinstance(v, Sym):
                out.append(v)
            elif isinstance(v, tuple):
                out.extend(x for x in v if isinstance(x, Sym))
        return out

    def place(self, base: dict[str, int]) -> Instruction:
        args = {}
        for k, v in self.args.items():
            if isinstance(v, Sym):
                v = v.place(base) if k != "sp_offset" else base[v.buf] + v.rel
            elif isinstance(v, tuple) and any(isinstance(x, Sym) for x in v):
                v = tuple(x.place(base) if isinstance(x, Sym) else x for x in v)
            args[k] = v
        return self.cls(**args)


def _dense(buf: str, dt: str, tile_shape: tuple[int, ...], box: Box, bcast: Iterable[int] = ()) -> Sym:
    """View of a box inside a row-major buffer over ``tile_shape`` (dims in ``bcast`` broadcast)."""
    strides = list(_row_major(tile_shape))
    for d in set(bcast):
        strides[d] = 0
    return _strided(buf, dt, strides, sum(o * st for o, st in zip(box.origin, strides)), box)


def _strided(buf: str, dt: str, strides: list[int], rel: int, box: Box) -> Sym:
    """View of a box in buffer ``buf``: element ``rel`` at the box's origin, ``strides`` per tile dim
    (elements), carried over to the box's refined (mixed-radix) axes."""
    rel *= _isz(dt)
    shape, axes = box.refined
    out = [0] * len(shape)
    for d, ax in enumerate(axes):
        step = strides[d]
        for a in reversed(ax):  # innermost part first: mixed radix
            out[a] = step
            step *= shape[a]
    return Sym(buf, rel, dt, shape, tuple(out))


# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------
class PointwiseGenerator(KernelGen):
    """Builds the program of one pointwise/reduction kernel."""

    def generate(self) -> Program:
        spec = self.spec
        if any(n == 0 for n in spec.x_sizes + spec.r_sizes):
            raise LoweringError(f"kernel {spec.name} has an empty iteration space; the wrapper skips it")
        self.aliases = self._find_aliases()
        self.dag.set_aliases(self.aliases)
        self.direct, self.elided = self._direct_stores()
        cboxes = self._divide()
        tried = []
        tx = list(cboxes[0][1])
        tr = list(self.spec.r_sizes)
        lanes = max(self.factors) if self.factors else 64
        while True:
            tried.append({"tile": list(tx), "rchunk": list(tr)})
            try:
                cores, base, sp_plan, persistent = self._build(cboxes, tuple(tx), tuple(tr))
                break
            except ScratchpadOverflowError as err:
                last = err
                tried[-1]["result"] = f"needs {err.needed} B > {err.capacity} B"
            if not _shrink(tx, lanes) and not _shrink(tr, lanes):
                err = ScratchpadOverflowError(last.needed, last.capacity, last.live, last.step)
                err.add_note(f"kernel {spec.name}: even the smallest tile (x {tx}, reduction chunk {tr}) does "
                             f"not fit the {last.capacity} plannable scratchpad bytes "
                             "(config.scratchpad_plannable_bytes)")
                raise err from None
        program = Program(spec.name, self._operands(), {c: [si.place(base) for si in ins] for c, ins in cores.items()})
        self._check_span(program)
        self._record(cboxes, tx, tr, persistent, sp_plan, tried, program)
        program.metadata["decisions"] = self.decisions.to_dict()
        program.metadata["source_ops"] = list(spec.source_ops)
        return program

    # --- aliases (loads served from values of this kernel) ----------------------------------------
    def _find_aliases(self) -> dict[int, int]:
        if not any(self.dag.stored.get(v.attrs.get("buffer")) for v in self.dag.values if v.op == "load"):
            return {}
        spec = self.spec
        xs = tuple(spec.x_sizes)
        ch = Chunk(0, 0, tuple(0 for _ in xs), xs, tuple(0 for _ in spec.r_sizes), tuple(spec.r_sizes))
        ch.accessed = [v.gid for v in self.dag.values if v.op in ("load", "store")]
        self.analyse(ch, outer_only=True)
        aliases = {g: a.alias for g, a in ch.accesses.items() if a.alias is not None}
        self._merge_equal_loads(ch, aliases)
        return aliases

    def _merge_equal_loads(self, ch: Chunk, aliases: dict[int, int]) -> None:
        """With the whole iteration space analysed (``ch``), loads of the same elements in different
        nodes (a softmax reads x in its max, sum and normalising nodes) and loads served from scratchpad
        become one value each, and the ops above them merge too (``Dag.merge``)."""
        canon: dict[int, int] = dict(aliases)
        seen: dict[tuple, int] = {}
        for gid in sorted(ch.accesses):
            a = ch.accesses[gid]
            if self.dag.values[gid].op != "load" or gid in aliases or a.host is None:
                continue
            key = (a.buffer, a.extent, a.host.shape, a.host.tobytes(), None if a.valid is None else a.valid.tobytes())
            if key in seen:
                canon[gid] = seen[key]
            else:
                seen[key] = gid
        self.dag.merge(canon)

    # --- work division ----------------------------------------------------------------------------
    def _divide(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Core boxes over x such that every output stick has one owner (checked numerically)."""
        sizes = list(self.spec.x_sizes)
        cores = self.config.num_cores
        unit = max(self.factors) if self.factors else 64
        for u in (1, unit, sizes[-1] if sizes else 1):
            cboxes = core_boxes(sizes, split_counts(sizes, cores, u), u)
            if len(cboxes) <= 1 or self._owners_disjoint(cboxes):
                self.division = {"unit": u}
                return cboxes
        self.division = {"unit": "single core"}
        return core_boxes(sizes, [1] * len(sizes), 1)

    def _owners_disjoint(self, cboxes) -> bool:
        for v in (v for v in self.dag.values if v.op == "store" and v.attrs["buffer"] not in self.spec.internal):
            outer = self.dag.values[v.args[0]].extent == "outer"
            place = self.places[v.attrs["buffer"]]
            sticks = []
            for xo, xs in cboxes:
                ro = tuple(0 for _ in self.spec.r_sizes)
                e = self.node_env(v.node, xo, xs, ro, tuple(self.spec.r_sizes),
                                  outer or self.spec.nodes[v.node].placement == "outer")
                dev = access.device_elements(place, access.evaluate(v.attrs["index"], e), f"store to {v.attrs['buffer']}")
                sticks.append(np.unique(dev // place.lanes))
            allst = np.concatenate(sticks)
            if np.unique(allst).size != allst.size:
                return False
        return True

    # --- building -----------------------------------------------------------------------------------
    def _build(self, cboxes, tx, tr):
        persistent = tuple(tr) == tuple(self.spec.r_sizes)
        # the iota (argmax/argmin positions) covers one reduction chunk
        self._iota_span = 1 + sum((t - 1) * st for t, st in zip(tr, _row_major(self.spec.r_sizes)))
        sched = Scheduler(self.dag, self.aliases, persistent)
        cores: dict[int, list[SymInstr]] = {}
        for core, (xo, xs) in enumerate(cboxes):
            steps: list[Step] = []
            for t, (txo, txs) in enumerate(boxes(xo, xs, tx)):
                steps.extend(self._tile_steps(sched, t, txo, txs, tr, persistent))
            self._assign_loads(steps, persistent)
            cores[core] = self._emit_core(steps)
        base, sp_plan = self._place(cores)
        return cores, base, sp_plan, persistent

    def _tile_steps(self, sched: Scheduler, t, txo, txs, tr, persistent: bool) -> list[Step]:
        spec, dag = self.spec, self.dag
        steps: list[Step] = []
        done: set[int] = set()
        rzero = tuple(0 for _ in spec.r_sizes)
        rchunks = boxes(rzero, tuple(spec.r_sizes), tuple(tr)) if spec.r_sizes else [((), ())]
        pre = sched.closure(sched.outer_roots(-1), "outer", done)
        if pre:
            ch = Chunk(t, -1, txo, txs, rzero, tuple(spec.r_sizes))
            ch.run_outer = pre
            steps.append(Step("outer", -1, ch, pre))
            done |= set(pre)
        for p in range(dag.n_phases):
            roots = sched.full_roots(p)
            keep = done if persistent else {g for g in done if dag.values[g].extent != "full"}
            run = sched.closure(roots, "full", keep)
            if run:
                for ro, rs in rchunks:
                    ch = Chunk(t, p, txo, txs, ro, rs)
                    ch.run_full = run
                    steps.append(Step("full", p, ch, run))
                done |= set(run)
            post = sched.closure(sched.outer_roots(p), "outer", done)
            if post:
                ch = Chunk(t, p, txo, txs, rzero, tuple(spec.r_sizes))
                ch.run_outer = post
                steps.append(Step("outer", p, ch, post))
                done |= set(post)
        tile_accesses = sorted({g for s in steps for g in s.values if dag.values[g].op in ("load", "store")})
        for s in steps:
            if persistent and s.kind == "full":
                s.chunk.accessed = [g for g in tile_accesses if dag.values[g].extent == "full"
                                    or dag.values[g].op == "store" and dag.values[dag.values[g].args[0]].extent == "full"]
            self.analyse(s.chunk, outer_only=s.kind == "outer")
        return steps

    def _assign_loads(self, steps: list[Step], persistent: bool) -> None:
        """Which step's DMA group loads each access, and its buffer parity (double buffering)."""
        parity = 0
        owners: dict[tuple[int, str], Step] = {}
        for s in steps:
            loads = [g for g, a in s.chunk.accesses.items()
                     if self.dag.values[g].op == "load" and a.alias is None and a.sticks is not None]
            key = (s.chunk.tile, s.kind) if persistent else (id(s), s.kind)
            owner = owners.get(key)
            if owner is None:
                owner = owners[key] = s
                s.parity = parity
                s.loads = []
                if loads:
                    parity ^= 1
            s.load_from = owner  # type: ignore[attr-defined]
            s.parity = owner.parity
            for g in loads:
                if g not in owner.loads:
                    owner.loads.append(g)

    # --- emission -----------------------------------------------------------------------------------
    def _emit_core(self, steps: list[Step]) -> list[SymInstr]:
        """Loads of the next DMA group are issued before the current step computes (two buffers per
        input, alternating): never more than one group ahead, so a buffer is reloaded only after the
        step that read it."""
        out: list[SymInstr] = []
        self._pos = 0
        self._tile = None
        self._iota_base: int | None = None  # first reduction position the core's iota holds
        owners = [s for s in steps if s.load_from is s and s.loads]  # type: ignore[attr-defined]
        index = {id(o): i for i, o in enumerate(owners)}
        loaded: set[int] = set()
        current = -1
        for s in steps:
            if s.chunk.tile != self._tile:
                self._tile, self._pos = s.chunk.tile, 0
            owner = s.load_from  # type: ignore[attr-defined]
            if id(owner) in index:
                current = index[id(owner)]
                if current not in loaded:
                    self._emit_loads(owner, out)
                    loaded.add(current)
            nxt = current + 1
            if nxt < len(owners) and nxt not in loaded:
                self._emit_loads(owners[nxt], out)
                loaded.add(nxt)
            self._emit_step(s, out)
        return out

    def _add(self, sink: list[SymInstr], cls: type, **args: Any) -> None:
        sink.append(SymInstr(cls, args, self._pos))
        self._pos += 1

    def _emit_loads(self, owner: Step, out: list[SymInstr]) -> None:
        for g in owner.loads:
            a = owner.chunk.accesses[g]
            buf = f"ld{g}.{owner.parity}"
            for first, rank, pat in access.stick_patterns(a.sticks.sticks):
                self._add(out, DmaLoad, src=Addr(a.buffer, first * STICK_BYTES),
                          sp_offset=Sym(buf, rank * STICK_BYTES, "uint8", (1,), (1,)), pattern=pat)

    def _emit_step(self, s: Step, out: list[SymInstr]) -> None:
        ch = s.chunk
        bxs = ch.full_boxes if s.kind == "full" else ch.outer_boxes
        self._views: dict[tuple[int, int], Any] = {}
        stores = [g for g in s.values if self.dag.values[g].op == "store"
                  and self.dag.values[g].attrs["buffer"] not in self.spec.internal]
        for g in stores:
            self._prepare_store(g, ch, out)
        if any(self.dag.values[g].op == "rindex" for g in s.values):
            self._ensure_iota(ch, out)
        for g in s.values:
            v = self.dag.values[g]
            if v.op == "reduction":
                self._emit_reduction(v, s, bxs, out)
            elif v.op == "store":
                if g in self.direct.values() or v.attrs["buffer"] in self.spec.internal:
                    continue  # its value was computed into the staging sticks
                for bi, b in enumerate(bxs):
                    self._emit_store_box(v, s, b, bi, out)
            elif g in self.elided:
                continue
            elif self._materialized(v):
                for bi, b in enumerate(bxs):
                    self._emit_value_box(v, s, b, bi, out)
        for g in stores:
            a = ch.accesses[g]
            for first, rank, pat in access.stick_patterns(a.sticks.sticks):
                self._add(out, DmaStore, dst=Addr(a.buffer, first * STICK_BYTES),
                          sp_offset=Sym(f"st{g}", rank * STICK_BYTES, "uint8", (1,), (1,)), pattern=pat)

    def _direct_stores(self) -> tuple[dict[int, int], set[int]]:
        """Values whose only use is a store are computed straight into the store's staging sticks (the
        vector unit rounds on write, which is what the cast before a store does): value gid -> store
        gid, and the casts made unnecessary that way."""
        users: dict[int, int] = {}
        for v in self.dag.values:
            for a in set(self.dag.inputs(v)) | set(v.attrs.get("guards", [])):
                users[a] = users.get(a, 0) + 1
        for g, src in self.aliases.items():
            users[src] = users.get(src, 0) + 1
        direct, elided = {}, set()
        for st in (v for v in self.dag.values if v.op == "store" and v.attrs["buffer"] not in self.spec.internal):
            v = self.dag.values[st.args[0]]
            if users.get(v.gid) != 1 or v.op == "reduction" or not self._materialized(v) or v.guards:
                continue
            if v.op == "to_dtype":
                u = self.dag.values[v.args[0]]
                if (users.get(u.gid) == 1 and self._materialized(u) and u.op != "reduction" and not u.guards
                        and u.sp_dtype == "float32" and v.sp_dtype in ("dlfloat16", "float32")
                        and self.places[st.attrs["buffer"]].layout.device_dtype == v.sp_dtype):
                    direct[u.gid] = st.gid
                    elided.add(v.gid)
                    continue
            direct[v.gid] = st.gid
        return direct, elided

    def _materialized(self, v: Value) -> bool:
        if v.extent in ("static", "scalar"):
            return False
        if v.op in ("load", "const", "static", "store", "rindex") or v.gid in self.aliases:
            return False
        if v.op == "to_dtype" and self._cast_alias(v):
            return False
        if v.op == "where" and self.dag.values[v.args[0]].extent in ("static", "scalar"):
            return False
        return True

    def _cast_alias(self, v: Value) -> bool:
        src = self.dag.values[v.args[0]]
        if src.extent in ("scalar", "static"):
            return True
        s_dt = self._sp_dtype_of(src)
        return s_dt == v.sp_dtype or (s_dt == "dlfloat16" and v.sp_dtype == "float32")

    def _sp_dtype_of(self, v: Value) -> str:
        if v.op == "load":
            if v.gid in self.aliases:
                return self._sp_dtype_of(self.dag.values[self.aliases[v.gid]])
            return self.places[v.attrs["buffer"]].layout.device_dtype
        if v.op == "reduction":
            return _acc_dtype(v)
        if v.op == "to_dtype" and self._cast_alias(v):
            return self._sp_dtype_of(self.dag.values[v.args[0]])
        if v.op == "where" and self.dag.values[v.args[0]].extent in ("static", "scalar"):
            return v.sp_dtype
        return v.sp_dtype

    # --- views of values inside a box ------------------------------------------------------------------
    def view(self, gid: int, s: Step, box: Box) -> Sym | Scalar:
        v = self.dag.values[gid]
        ch = s.chunk
        full = s.kind == "full"
        if v.extent == "scalar" and v.op == "const":
            return Scalar(v.args[0])
        if v.op == "rindex":
            return self._iota_view(s, box)
        if v.extent == "static":
            val = box.statics.get(gid)
            if val is None:
                raise LoweringError(f"kernel {self.spec.name}: an index value is used as data "
                                    f"({v.op} {v.attrs.get('index', '')}); not supported by the Spyre compiler yet")
            return Scalar(val)
        if v.extent == "scalar":
            ins = [self.view(a, s, box) if _is_ref(a) else Scalar(a) for a in v.args]
            return Scalar(_fold_scalar(v, ins))
        if gid in self.aliases:
            return self.view(self.aliases[gid], s, box)
        if self._guarded_off(v, box):
            return Scalar(0.0)  # never read: every consumer here selects the other branch
        if v.op == "load":
            owner = s.load_from  # type: ignore[attr-defined]
            a = owner.chunk.accesses[gid]
            if a.same_as is not None:
                gid, a = a.same_as, owner.chunk.accesses[a.same_as]
            if gid not in box.views:
                raise LoweringError(f"kernel {self.spec.name}: load {gid} has no view in this box")
            base, strides = box.views[gid]
            place = self.places[a.buffer]
            shape, _ = box.refined
            return Sym(f"ld{gid}.{owner.parity}", base * place.itemsize, place.layout.device_dtype, shape, strides)
        if v.op == "to_dtype" and self._cast_alias(v):
            inner = self.view(v.args[0], s, box)
            return inner
        if v.op == "where" and self.dag.values[v.args[0]].extent in ("static", "scalar"):
            cond = self.view(v.args[0], s, box)
            pick = v.args[1] if cond.value else v.args[2]
            return self.view(pick, s, box) if _is_ref(pick) else Scalar(pick)
        # a materialized value: its dense buffer
        dt = self._sp_dtype_of(v)
        nx = len(ch.xs)
        if v.extent == "outer":
            if full:
                return _dense(f"v{gid}", dt, tuple(ch.xs) + (1,) * len(ch.rs), box, range(nx, nx + len(ch.rs)))
            return _dense(f"v{gid}", dt, tuple(ch.xs), box)
        return _dense(f"v{gid}", dt, tuple(ch.xs) + tuple(ch.rs), box)

    # --- reduction positions (argmax/argmin) -----------------------------------------------------------
    def _iota_dtype(self) -> str:
        return next(v.sp_dtype for v in self.dag.values if v.op == "rindex")

    def _iota_view(self, s: Step, box: Box) -> Sym:
        """The linear reduction position of every element of a box: a view of the core's iota, which
        holds the positions of the current reduction chunk (broadcast over the x dims)."""
        nx = len(s.chunk.xs)
        rstr = _row_major(self.spec.r_sizes)
        rel = sum(o * st for o, st in zip(box.origin[nx:], rstr))
        return _strided("iota", self._iota_dtype(), [0] * nx + list(rstr), rel, box)

    def _ensure_iota(self, ch: Chunk, out: list[SymInstr]) -> None:
        """Make the core's iota hold the positions of chunk ``ch``: built once per core by doubling
        (0, then [0, k) + k for k = 1, 2, 4, ...: log2(n) instructions, n element-ops), then shifted
        by one add when a chunk starts at another position."""
        dt, n = self._iota_dtype(), self._iota_span
        first = sum(o * st for o, st in zip(ch.ro, _row_major(self.spec.r_sizes)))
        isz = _isz(dt)
        run = lambda k, m: Sym("iota", k * isz, dt, (m,), (1,))  # noqa: E731
        if self._iota_base is None:
            self._add(out, Elementwise, op="copy", out=run(0, 1), inputs=(Scalar(0),))
            k = 1
            while k < n:
                m = min(k, n - k)
                self._add(out, Elementwise, op="add", out=run(k, m), inputs=(run(0, m), Scalar(k)))
                k *= 2
            self._iota_base = 0
        if first != self._iota_base:
            self._add(out, Elementwise, op="add", out=run(0, n), inputs=(run(0, n), Scalar(first - self._iota_base)))
            self._iota_base = first

    def _guarded_off(self, v: Value, box: Box) -> bool:
        return any(not box.statics.get(g, True) for g in v.guards)

    def _emit_value_box(self, v: Value, s: Step, box: Box, bi: int, out: list[SymInstr]) -> None:
        if self._guarded_off(v, box):
            return  # the value does not exist here (a masked branch that is not taken)
        dst = self._staging_view(self.direct[v.gid], s, box) if v.gid in self.direct else self.view(v.gid, s, box)
        ins = [self.view(a, s, box) if _is_ref(a) else Scalar(a) for a in v.args]
        op = v.op
        if op == "to_dtype":
            op = "cast"
        if all(isinstance(x, Scalar) for x in ins):
            folded = _fold_scalar(v, ins)
            self._add(out, Elementwise, op="copy", out=dst, inputs=(Scalar(folded),))
            return
        self._add(out, Elementwise, op=op, out=dst, inputs=tuple(_fit_input(x, dst) for x in ins))

    def _emit_reduction(self, v: Value, s: Step, bxs: list[Box], out: list[SymInstr]) -> None:
        ch = s.chunk
        nx, nr = len(ch.xs), len(ch.rs)
        dt = _acc_dtype(v)
        if all(o == 0 for o in ch.ro):  # first chunk of this pass: the identity
            full_acc = Box(tuple(0 for _ in ch.xs), tuple(ch.xs), {}, {}, {})
            ident = REDUCE_IDENTITY[v.attrs["reduction"]]
            if dt != "float32" and math.isinf(ident):
                ident = -(1 << 62) if ident < 0 else (1 << 62)
            self._add(out, Elementwise, op="copy", out=_dense(f"v{v.gid}", dt, tuple(ch.xs), full_acc),
                      inputs=(Scalar(ident),))
        for box in bxs:
            src = self.view(v.args[0], s, box)
            shape, axes = box.refined
            acc = _dense(f"v{v.gid}", dt, tuple(ch.xs) + (1,) * nr, box, range(nx, nx + nr))
            r_axes = [ax for d in range(nx, nx + nr) for ax in axes[d]]
            if isinstance(src, Scalar):  # a constant over this box (e.g. a masked-out region)
                self._reduce_constant(v, src, box, acc, r_axes, out)
                continue
            r_axes = [a for a in r_axes if shape[a] > 1] or r_axes[-1:]
            cur = src
            cur_shape = list(shape)
            for k, ax in enumerate(reversed(r_axes)):
                cur_shape[ax] = 1
                last = k == len(r_axes) - 1
                if last:
                    acc_shape = tuple(cur_shape)
                    dst = Sym(acc.buf, acc.rel, acc.dtype, acc_shape,
                              tuple(0 if acc_shape[i] == 1 else acc.strides[i] for i in range(len(acc_shape))))
                    self._add(out, Reduce, op=v.attrs["reduction"], out=dst, inp=cur, axis=ax, accumulate=True)
                else:
                    tmp = Sym(f"t{v.gid}.{k % 2}", 0, dt, tuple(cur_shape), _row_major(cur_shape))
                    self._add(out, Reduce, op=v.attrs["reduction"], out=tmp, inp=cur, axis=ax, accumulate=False)
                    cur = tmp

    def _reduce_constant(self, v: Value, c: Scalar, box: Box, acc: Sym, r_axes: list[int], out: list[SymInstr]) -> None:
        """Fold a constant over the box's reduced elements into the accumulator, in place."""
        shape, _ = box.refined
        n = math.prod(shape[a] for a in r_axes)
        acc_shape = tuple(1 if a in r_axes else shape[a] for a in range(len(shape)))
        view = Sym(acc.buf, acc.rel, acc.dtype, acc_shape,
                   tuple(0 if acc_shape[i] == 1 else acc.strides[i] for i in range(len(acc_shape))))
        kind = v.attrs["reduction"]
        if kind == "sum":
            op, value = "add", c.value * n
        elif kind == "prod":
            op, value = "mul", float(np.float32(c.value) ** np.float32(n))
        else:
            op, value = ("maximum" if kind == "max" else "minimum"), c.value
        self._add(out, Elementwise, op=op, out=view, inputs=(view, Scalar(value)))

    # --- stores --------------------------------------------------------------------------------------
    def _prepare_store(self, g: int, ch: Chunk, out: list[SymInstr]) -> None:
        """Stage sticks the step writes only partly (padding included): load them first."""
        a = ch.accesses[g]
        lanes = self.places[a.buffer].lanes
        covered = np.unique(a.sticks.position).size
        if covered < a.sticks.sticks.size * lanes:
            for first, rank, pat in access.stick_patterns(a.sticks.sticks):
                self._add(out, DmaLoad, src=Addr(a.buffer, first * STICK_BYTES),
                          sp_offset=Sym(f"st{g}", rank * STICK_BYTES, "uint8", (1,), (1,)), pattern=pat)

    def _staging_view(self, store_gid: int, s: Step, box: Box) -> Sym:
        a = s.chunk.accesses[store_gid]
        place = self.places[a.buffer]
        base, strides = box.views[store_gid]
        shape, _ = box.refined
        return Sym(f"st{store_gid}", base * place.itemsize, place.layout.device_dtype, shape, strides)

    def _emit_store_box(self, v: Value, s: Step, box: Box, bi: int, out: list[SymInstr]) -> None:
        dst = self._staging_view(v.gid, s, box)
        src = self.view(v.args[0], s, box)
        if isinstance(src, Scalar):
            self._add(out, Elementwise, op="copy", out=dst, inputs=(src,))
            return
        op = "copy" if src.dtype == dst.dtype else "cast"
        self._add(out, Elementwise, op=op, out=dst, inputs=(_fit_input(src, dst),))

    # --- placement ------------------------------------------------------------------------------------
    def _place(self, cores: dict[int, list[SymInstr]]):
        """Scratchpad offsets for every symbolic buffer: one liveness plan shared by all cores."""
        size: dict[str, int] = {}
        live: dict[str, list[int]] = {}
        for ins in cores.values():
            for si in ins:
                for sym in si.syms():
                    end = sym.end() if sym.dtype != "uint8" else sym.rel + si.args["pattern"].nbytes
                    size[sym.buf] = max(size.get(sym.buf, 0), end)
                    lo, hi = live.get(sym.buf, [si.tile_step, si.tile_step])
                    live[sym.buf] = [min(lo, si.tile_step), max(hi, si.tile_step)]
        bufs = []
        for name, n in sorted(size.items()):
            lo, hi = live[name]
            if name.startswith(("ld", "st")) or name == "iota" or (
                    name.startswith("v") and self.dag.values[int(name[1:])].op == "reduction"):
                lo, hi = -1, 1 << 30  # loads are double-buffered across tiles; accumulators span the tile
            elif self.dag.values[int(name[1:].split(".")[0])].extent == "outer" if name.startswith("v") else False:
                lo, hi = -1, 1 << 30
            bufs.append(SpBuffer(name, max(n, 1), lo, hi))
        sp_plan = plan(bufs, self.config.scratchpad_plannable_bytes)
        return {b.name: b.offset for b in sp_plan.buffers}, sp_plan

    # --- operands, checks, decisions --------------------------------------------------------------
    def _operands(self) -> list[Operand]:
        ops = []
        for b in self.spec.buffers:
            place = self.places[b.name]
            role = b.role
            if role == "inout" and all(v.gid in self.aliases for v in self.dag.values
                                       if v.op == "load" and v.attrs["buffer"] == b.name):
                role = "output"  # its reads in this kernel come from scratchpad
            access_kind = {"input": "in", "output": "out", "inout": "inout"}[role]
            ops.append(Operand(b.name, place.layout.nbytes, access_kind, place.layout.device_dtype,
                               place.layout.host_shape, place.layout.stick_dim))
        return ops

    def _check_span(self, program: Program) -> None:
        limit = self.config.core_address_span_bytes
        for core, ins in program.cores.items():
            spans = dram_spans(ins)
            total = sum(hi - lo for lo, hi in spans.values())
            if total > limit:
                raise AddressSpanError(
                    f"kernel {self.spec.name}: core {core} would address {total} bytes of device memory "
                    f"({', '.join(f'{k}: {hi - lo} B' for k, (lo, hi) in spans.items())}), more than the "
                    f"{limit} bytes one core can reach in a kernel (config.core_address_span_bytes). "
                    "Split the tensor (smaller batch or sequence chunks) so each core's share fits."
                )

    def _record(self, cboxes, tx, tr, persistent, sp_plan, tried, program: Program) -> None:
        d = self.decisions
        for b in self.spec.buffers:
            d.buffers.append(BufferDecision(b.name, b.role, self.places[b.name].layout.describe()))
        d.work_division = {"cores": len(cboxes), "x": list(self.spec.x_sizes), "core_box": list(cboxes[0][1]) if cboxes else [],
                           **self.division}
        n_instr = sum(len(v) for v in program.cores.values())
        d.tiling = {"tile": list(tx), "r_chunk": list(tr), "persistent_reduction": persistent,
                    "phases": self.dag.n_phases, "instructions": n_instr}
        d.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                        "buffers": {b.name: [b.offset, b.nbytes] for b in sp_plan.buffers}}
        d.overlap = {"double_buffered": sorted({b.name.split(".")[0] for b in sp_plan.buffers if b.name.startswith("ld")})}
        d.alternatives = tried[:-1]
        if self.aliases:
            d.notes.append(f"{len(self.aliases)} load(s) served from values computed in this kernel")


def _row_major(shape) -> tuple[int, ...]:
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def _fit_input(x: Sym | Scalar, dst: Sym) -> Sym | Scalar:
    if isinstance(x, Scalar) or x.shape == dst.shape:
        return x
    raise LoweringError(f"internal: operand view {x.shape} does not match {dst.shape}")


def _fold_scalar(v: Value, ins: list[Scalar]) -> float | int | bool:
    from ..card.execute import _BINARY, _TERNARY, _UNARY, _promote

    vals = [np.asarray(x.value) for x in ins]
    op = "copy" if v.op in ("to_dtype", "cast") else v.op
    if op not in _UNARY and op not in _BINARY and op not in _TERNARY:
        raise LoweringError(f"cannot fold {v.op} on constants")
    with np.errstate(all="ignore"):
        r = (_UNARY.get(op) or _BINARY.get(op) or _TERNARY.get(op))(*_promote(op, [np.asarray(a, dtype=np.float32) if np.asarray(a).dtype.kind == "f" else a for a in vals]))
    r = np.asarray(r).item()
    if v.sp_dtype in ("float32", "dlfloat16"):
        return float(r)
    if v.sp_dtype == "bool":
        return bool(r)
    return int(r)


def generate(spec: KernelSpec, places: dict[str, TensorPlace], config: Any) -> Program:
    """The program of a pointwise/reduction kernel for tensors placed as ``places``. A kernel it cannot
    generate raises LoweringError naming the ATen ops and the user's source line it came from."""
    try:
        return PointwiseGenerator(spec, places, config).generate()
    except LoweringError as e:
        raise type(e)(f"{e}{_provenance(spec)}") from None


def _provenance(spec: KernelSpec) -> str:
    ops = ", ".join(spec.source_ops) or "unknown ops"
    at = f" at {spec.source_lines[0]}" if spec.source_lines else ""
    return f" (kernel from {ops}{at})"


def _acc_dtype(v: Value) -> str:
    """Accumulators: fp32 for floating values, int64 for integers."""
    dt = v.sp_dtype
    if dt == "dlfloat16":
        return "float32"
    if dt in ("int32", "int16", "int8", "uint8", "bool"):
        return "int64"
    return dt


def _isz(dt: str) -> int:
    from ..program import SP_DTYPES

    return SP_DTYPES[dt]


def _shrink(shape: list[int], lanes: int) -> bool:
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

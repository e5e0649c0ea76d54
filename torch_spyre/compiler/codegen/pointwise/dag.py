"""A kernel's nodes as one DAG of :class:`~.values.Value`: Inductor's ops lowered to the card's ops,
common subexpressions shared across nodes, each value's extent, phase and the static masks (guards)
under which it exists."""

from __future__ import annotations

import math
from typing import Any

from ...kernel_ir import KernelSpec, LoweringError
from .values import BOOL_ONLY_OPS, DIRECT_OPS, Value, bool_only_refusal, is_ref, literal


class Dag:
    """All nodes' ops as one DAG of :class:`Value` with extents and phases."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.values: list[Value] = []
        self._cse: dict[tuple, int] = {}
        self.stored: dict[str, list[int]] = {}  # buffer -> store value gids, in order
        self.aliases: dict[int, int] = {}  # loads served from values of this kernel (``set_aliases``)
        for ni, node in enumerate(spec.nodes):
            self._add_node(ni, node)
        self._extents()
        if self._lift_index_data():
            self._renumber()
        self._annotate()

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
        if op in ("load", "static", "iindex"):
            if "ind" in attrs["index"]:  # indirect symbols are per node
                return None
            n = self.spec.nodes[node]
            space = (n.placement, tuple(n.sizes), tuple(n.reduction_sizes))
            return (op, attrs["index"], attrs.get("buffer"), tuple(attrs.get("guards", [])), attrs.get("over"), dtype,
                    space)
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
                gid = self._new("const", [literal(o.attrs["value"])], o.dtype, ni)
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
            refusal = bool_only_refusal(op, {self.values[a].dtype for a in args})
            if refusal:
                raise LoweringError(refusal)
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
        if op == "truncdiv":
            # integer division towards zero (C's /; ``div(rounding_mode="trunc")``): a - fmod(a, b) is the
            # multiple of b towards zero, so its floor division by b is exact (JetMoE's expert batch index)
            multiple = self._new("sub", [args[0], self._new("fmod", args, dtype, ni)], dtype, ni)
            return self._new("floordiv", [multiple, args[1]], dtype, ni)
        raise LoweringError(f"pointwise op {op!r} has no Spyre lowering yet")

    # --- index values used as data ---------------------------------------------------------------
    def _lift_index_data(self) -> bool:
        """Index-only values a computed value reads as data (sinusoidal positions, ``arange * 0.5``) are
        computed on the card instead of by the compiler: every ``index_expr`` under them becomes an
        ``iindex`` value (a view of the core's iota of consecutive integers, ``emit.py``) and the ops
        above it run over whole boxes. Left static (uniform within each box, evaluated here): a
        ``where``'s condition, masks, indirect indices and bool values (comparisons change value at a
        few hyperplanes, so cutting boxes there is cheaper than computing them). Under a static
        ``where`` each branch's values carry its condition (or its negation) as a guard, so the branch a
        box does not take is not computed there (a padding of positions computes nothing). True when
        something was lifted."""
        memo: dict[tuple[int, tuple[int, ...], str], int] = {}  # (gid, guards, extent) -> its copy
        lifted = False
        for v in list(self.values):
            if v.extent in ("static", "scalar") or v.op in ("load", "indirect"):
                continue
            for i, a in enumerate(v.args):
                if not is_ref(a) or self.values[a].extent != "static" or (v.op == "where" and i == 0):
                    continue
                new = self._lift(a, (), v.extent, memo)
                if new != a:
                    v.args[i] = new
                    lifted = True
        return lifted

    def _lift(self, gid: int, guards: tuple[int, ...], over: str, memo: dict) -> int:
        """The on-card copy of static value ``gid`` under ``guards`` over the ``over`` extent ("full" or
        "outer": its user's), or ``gid`` itself when it stays static."""
        key = (gid, guards, over)
        if key in memo:
            return memo[key]
        v = self.values[gid]
        out = gid
        index = v
        if v.op == "to_dtype" and v.dtype in ("float32", "int32", "int64"):
            # the iota's int64 values round once into the value's dtype, as the cast would
            index = self.values[v.args[0]]
        if index.op == "static" and index.attrs.get("kind") == "index" and v.dtype != "bool":
            out = self._new("iindex", [], v.dtype, v.node, index=index.attrs["index"], guards=list(guards), over=over)
        elif v.op not in ("const", "static", "indirect") and v.dtype != "bool" and v.extent == "static":
            if v.op == "where":
                c = v.args[0]
                neg = self._new("logical_not", [c], "bool", v.node)
                args = [c, self._lift(v.args[1], guards + (c,), over, memo),
                        self._lift(v.args[2], guards + (neg,), over, memo)]
            else:
                args = [self._lift(a, guards, over, memo) for a in v.args]
            if args != v.args:
                out = self._new(v.op, args, v.dtype, v.node, **v.attrs)
        memo[key] = out
        return out

    def _renumber(self) -> None:
        """Gids in topological order again after lifting (lifted values were appended after their users):
        the scheduler computes a step's values in gid order."""
        order: list[int] = []
        state: dict[int, bool] = {}
        for root in range(len(self.values)):
            stack = [(root, False)]
            while stack:
                g, done = stack.pop()
                if done:
                    order.append(g)
                    state[g] = True
                    continue
                if g in state:
                    continue
                state[g] = False
                v = self.values[g]
                stack.append((g, True))
                deps = self.inputs(v) + list(v.attrs.get("guards", []))
                stack.extend((d, False) for d in reversed(deps) if d not in state)
        new = {old: i for i, old in enumerate(order)}
        values = [self.values[g] for g in order]
        for v in values:
            v.gid = new[v.gid]
            if v.op != "const":
                v.args = [new[a] if is_ref(a) else a for a in v.args]
            if "guards" in v.attrs:
                v.attrs["guards"] = [new[g] for g in v.attrs["guards"]]
        self.values = values
        self.stored = {b: [new[g] for g in gs] for b, gs in self.stored.items()}
        self._cse = {k: new[g] for k, g in self._cse.items()}

    # --- extents and phases ---------------------------------------------------------------------
    def _extents(self) -> None:
        placements = [n.placement for n in self.spec.nodes]
        aliases = self.aliases
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
            elif v.op == "iindex":
                v.extent = v.attrs["over"]
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
            if v.op in ("store", "reduction", "indirect", "load", "static", "iindex") or v.gid in canon:
                continue
            key = (v.op, tuple(v.args), v.dtype)
            if key in seen:
                canon[v.gid] = seen[key]
            else:
                seen[key] = v.gid

    def set_aliases(self, aliases: dict[int, int]) -> None:
        """Loads served from values of this kernel take the extent and phase of those values."""
        self.aliases = dict(aliases)
        self._annotate()

    def _annotate(self) -> None:
        """Each value's extent, phase and guards (in that order: each needs the one before)."""
        self._extents()
        self._phases()
        self._guards()

    def _phases(self) -> None:
        aliases = self.aliases
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
        aliases = self.aliases
        for v in self.values:
            # A load served from scratchpad reads nothing out of range: its masks do not restrict it.
            g = set(v.attrs.get("guards", [])) if v.op in ("load", "iindex") and v.gid not in aliases else set()
            ins = self.inputs(v)
            if v.op == "where":
                c = ins[0]
                g |= self.values[c].guards
                for a in ins[1:]:  # a branch's condition (lifted values: or its negation) holds where it is taken
                    g |= {x for x in self.values[a].guards
                          if x != c and not (self.values[x].op == "logical_not" and self.values[x].args == [c])}
            else:
                for a in ins:
                    g |= self.values[a].guards
            v.guards = g

    def reductions(self) -> list[Value]:
        return [v for v in self.values if v.op == "reduction"]

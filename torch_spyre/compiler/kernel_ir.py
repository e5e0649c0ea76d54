"""Inductor scheduler nodes -> :class:`~torch_spyre.compiler.kernel_spec.KernelSpec` (``kernel_spec.py``).

This module is the only reader of Inductor's ``LoopBody``. It walks each scheduler node's body with a
recording ops handler (:class:`RecordingHandler`) and produces, for the whole fused node, the kernel's
iteration space, each node's placement in it, the op DAG, the buffers with their Inductor layouts and
the provenance (origins as ATen op names, the user's stack-trace lines). Whole-op kernels (matmul,
attention, gather) get their spec from :func:`extern_kernel_spec`.

A symbolic spec names Inductor's shape symbols (``s<n>``, ``u<n>``) where sizes are not static; any
other symbol is refused with a :class:`DynamicShapeError` that says what to make static.

The spec's classes and errors are re-exported here (``from torch_spyre.compiler.kernel_ir import KernelSpec``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

import sympy
import torch

from .._torch import inductor as torch_inductor
from .kernel_spec import (  # noqa: F401 - re-exported: the spec and its errors
    COMPUTABLE,
    BufferSpec,
    Dim,
    DynamicShapeError,
    KernelSpec,
    LoweringError,
    NodeSpec,
    Op,
    UnsupportedDtypeError,
    UnsupportedOpError,
    _check_placement,
    check_computable,
    dtype_name,
    torch_dtype,
)

# ---------------------------------------------------------------------------------------------
# Recording ops handler
# ---------------------------------------------------------------------------------------------
class _Ref:
    """What the handler returns for a recorded value: an op id."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id

    def __repr__(self) -> str:
        return f"%{self.id}"


# Pointwise ops the card computes, with the program op each becomes (see codegen/pointwise).
POINTWISE_OPS = {
    "add", "sub", "mul", "truediv", "div", "neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt",
    "reciprocal", "tanh", "sigmoid", "erf", "sin", "cos", "floor", "ceil", "round", "sign", "logical_not",
    "square", "maximum", "minimum", "pow", "lt", "le", "gt", "ge", "eq", "ne", "logical_and",
    "logical_or", "remainder", "floordiv", "where", "fma", "exp2", "expm1", "log1p", "log2", "trunc",
    "floor_to_int", "ceil_to_int", "round_to_int", "trunc_to_int", "int_truediv", "mod", "truncdiv",
    "identity", "libdevice_exp", "libdevice_sqrt", "libdevice_abs", "libdevice_log", "bitwise_and",
    "bitwise_or", "bitwise_not", "and_", "or_", "xor", "bitwise_xor", "isnan", "isinf", "log10",
    "acos", "asin", "atan", "sinh", "cosh", "tan", "asinh", "acosh", "atanh", "erfc", "atan2", "fmod",
    "copysign", "hypot", "signbit", "logical_xor", "div_rn",
}
REDUCTIONS = {"sum", "max", "min", "prod", "welford_reduce", "any", "argmax", "argmin", "xor_sum", "welford_combine"}


class RecordingHandler:
    """Records every op Inductor's LoopBody emits into a list of :class:`Op`."""

    def __init__(self, var_names: set[str], real_name: Any = None):
        self.real_name = real_name or (lambda n: n)
        self.ops: list[Op] = []
        self.guards: list[int] = []  # masks around the loads being recorded (ops.masked)
        self.var_names = var_names
        self.symbols: set[str] = set()  # shape symbols the recorded expressions use
        self._next = 0

    def _emit(self, op: str, args: Iterable[Any], dtype: torch.dtype | str | None, **attrs: Any) -> _Ref:
        norm = []
        for a in args:
            a = _unwrapped(a)
            if isinstance(a, _Ref):
                norm.append(a.id)
            elif isinstance(a, (bool, int, float)):
                # Literals become constant ops: every op argument is an op id.
                norm.append(self.constant(a, _literal_dtype(a)).id)
            else:
                raise LoweringError(f"op {op} got an argument of type {type(a).__name__} ({a!r}) the Spyre "
                                    "compiler cannot represent")
        d = dtype_name(dtype) if isinstance(dtype, torch.dtype) else dtype
        check_computable(d, f"op {op}")
        o = Op(self._next, op, norm, d, attrs)
        self._next += 1
        self.ops.append(o)
        return _Ref(o.id)

    def _dtype_of(self, ref: Any) -> str | None:
        if isinstance(ref, _Ref):
            return self.ops[ref.id].dtype
        return None

    def _index(self, index: sympy.Expr) -> str:
        index = sympy.sympify(index)
        unknown = [s for s in index.free_symbols if str(s) not in self.var_names]
        self.symbols |= _shape_symbols(unknown, f"index expression {index}")
        return str(index)

    # --- memory ---------------------------------------------------------------------------------
    def load(self, name: str, index: sympy.Expr) -> _Ref:
        dtype = _loaded_dtype(name, torch_inductor.current_graph().get_dtype(name))
        guards = {"guards": list(self.guards)} if self.guards else {}
        return self._emit("load", [], dtype, buffer=self.real_name(name), index=self._index(index), **guards)

    def store(self, name: str | None, index: sympy.Expr, value: Any, mode: Any = None) -> None:
        if mode is not None:
            raise UnsupportedOpError(f"store mode {mode!r} (e.g. atomic add from index_put/scatter) into {name} "
                                "is not supported by the Spyre compiler yet")
        dtype = torch_inductor.current_graph().get_dtype(name) if name else self._dtype_of(value)
        self._emit("store", [value], dtype, buffer=self.real_name(name), index=self._index(index))

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        self._emit("store", [value], torch_inductor.current_graph().get_dtype(name), buffer=self.real_name(name),
                   index=self._index(index), reduction=True)

    def reduction(self, dtype, src_dtype, reduction_type, value):
        if reduction_type == "welford_reduce":
            return self._welford(dtype, value)
        if reduction_type not in ("sum", "max", "min", "prod", "any", "argmax", "argmin"):  # arg*: codegen/pointwise
            raise UnsupportedOpError(
                f"reduction {reduction_type!r} has no Spyre lowering yet (supported: sum, max, min, prod, any, "
                "argmax, argmin, welford via mean/var); the op using it cannot be compiled for spyre"
            )
        rtype = "max" if reduction_type == "any" else reduction_type
        return self._emit("reduction", [value], dtype, reduction=rtype)

    def _welford(self, dtype, value):
        """welford_reduce(x) -> (mean, m2, weight): mean = sum(x)/n, m2 = sum((x - mean)^2), n."""
        total = self._emit("reduction", [value], torch.float32, reduction="sum")
        count = self._count(self.reduction_numel)
        mean = self._emit("truediv", [total, count], torch.float32)
        centred = self._emit("sub", [value, mean], torch.float32)
        sq = self._emit("mul", [centred, centred], torch.float32)
        m2 = self._emit("reduction", [sq], torch.float32, reduction="sum")
        return (mean, m2, count)

    def _count(self, numel: Dim) -> _Ref:
        """An element count as an fp32 constant; a symbolic count is filled in by ``specialize``."""
        if isinstance(numel, int):
            return self.constant(float(numel), torch.float32)
        self.symbols |= {s.name for s in _parse(numel).free_symbols}
        return self._emit("constant", [], torch.float32, value=numel, expr=True)

    # --- values ---------------------------------------------------------------------------------
    def constant(self, value, dtype):
        # A float64 constant (a numpy scalar such as ``x * np.sqrt(d)``, a 0-d float64 tensor) is kept off the
        # card's missing float64 unit as fp32: the vector unit computes in fp32, float64 data still fails at
        # its load or store, and a constant mixed into fp32 math is rounded to fp32 by torch's own promotion.
        if dtype == torch.float64:
            dtype = torch.float32
        v = value
        if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
            v = repr(v)  # JSON-safe: "inf", "-inf", "nan"
        return self._emit("constant", [], dtype, value=v)

    def index_expr(self, expr, dtype):
        return self._emit("index_expr", [], dtype, index=self._index(expr))

    def to_dtype(self, x, dtype, src_dtype=None, use_compute_types=True):
        return self._emit("to_dtype", [x], dtype)

    def masked(self, mask, body, other):
        self.guards.append(mask.id)
        try:
            result = _unwrapped(body())
        finally:
            self.guards.pop()
        dt = self._dtype_of(result)
        other_ref = other if isinstance(other, _Ref) else self.constant(other, dt or _literal_dtype(other))
        return self._emit("where", [mask, result, other_ref], dt)

    def indirect_indexing(self, index_var, size, check=True, wrap_neg=True):
        """An index computed by the kernel. Recorded as an ``indirect`` op binding a new symbol; the
        generator resolves it when the value depends on loop indices only (masks built from ``arange``,
        ``x[arange(n)]``): an index read from memory (embedding, gather) needs the gather generator."""
        if not isinstance(index_var, _Ref):
            raise LoweringError(f"indirect index {index_var!r} is not a recorded value")
        name = f"ind{sum(1 for o in self.ops if o.op == 'indirect')}"
        size = dim_of(size, "indirect index range", self.symbols)
        self._emit("indirect", [index_var], torch.int64, symbol=name, size=size, wrap_neg=bool(wrap_neg))
        self.var_names.add(name)
        return sympy.Symbol(name, integer=True)

    def check_bounds(self, expr, size, lower, upper):
        """Inductor's runtime bounds assertion: indices are checked when the generator evaluates them."""
        return None

    def where(self, cond, a, b):
        return self._emit("where", [cond, a, b], self._dtype_of(a) or self._dtype_of(b))

    def _default(self, name: str, args: tuple, kwargs: dict) -> Any:
        if name not in POINTWISE_OPS:
            raise UnsupportedOpError(f"pointwise op {name!r} has no Spyre lowering yet")
        dtypes = [self._dtype_of(a) for a in args if isinstance(a, _Ref)]
        dt = _result_dtype(name, dtypes)
        return self._emit(name, list(args), dt)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def op(*args: Any, **kwargs: Any) -> Any:
            return self._default(name, args, kwargs)

        return op


def _loaded_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """A float64 0-dim CPU tensor (``x * torch.tensor(2.0, dtype=torch.float64)``) is a per-call constant:
    it comes to the card as fp32 (``SpyreKernel._cpu_scalars_on_card``), as a float64 literal does
    (:meth:`RecordingHandler.constant`) and as CUDA's kernels take a CPU scalar in the dtype they compute in.
    A kernel that really computes in float64 (only float64 operands) still fails at the op that does."""
    if dtype != torch.float64:
        return dtype
    graph = torch_inductor.current_graph()
    buf = graph.get_buffer(name)
    if buf is None:
        buf = graph.graph_inputs.get(name)
    if buf is not None and buf.get_device().type == "cpu" and len(buf.get_size()) == 0:
        return torch.float32
    return dtype


def _unwrapped(v: Any) -> Any:
    """A recorded value as the handler returned it: a body called through Inductor's ``ops`` proxy (an
    IR node's ``inner_fn``, ``ir_ops``) gets it wrapped (``OpsValue.value``)."""
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, _Ref) else v


def _literal_dtype(v: Any) -> torch.dtype:
    return torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int) else torch.float32


_BOOL_OPS = {"lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not", "and_", "or_",
             "isnan", "isinf", "signbit", "logical_xor"}


def _result_dtype(name: str, dtypes: list[str | None]) -> str | None:
    if name in _BOOL_OPS:
        return "bool"
    known = [d for d in dtypes if d]
    if not known:
        return None
    for pref in ("float32", "float64", "float16", "bfloat16"):
        if pref in known:
            return pref
    if name in ("truediv", "div", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "acos",
                "asin", "atan", "sinh", "cosh", "tan", "asinh", "acosh", "atanh", "erfc", "atan2", "copysign",
                "hypot", "div_rn"):
        return "float32"
    return known[0]


# ---------------------------------------------------------------------------------------------
# Scheduler nodes -> KernelSpec (Inductor private APIs below)
# ---------------------------------------------------------------------------------------------
def _shape_symbols(symbols: Iterable[sympy.Symbol], what: str) -> set[str]:
    """The names of ``symbols``, all of which must be shape symbols the wrapper can pass at run time
    (Inductor's ``s<n>`` sizes bound from the inputs, ``u<n>`` unbacked sizes bound where computed)."""
    names = set()
    for sym in symbols:
        if not torch_inductor.is_shape_symbol(sym):
            raise DynamicShapeError(
                f"{what} uses the symbol {sym}, which is not a shape symbol (s<n>/u<n>) the Spyre compiler can "
                "bind at run time (a symbolic float, a precomputed size or an unknown variable); make that value "
                "static, e.g. torch.compile(..., dynamic=False) or torch._dynamo.mark_static on its input"
            )
        names.add(sym.name)
    return names


def dim_of(value: Any, what: str, symbols: set[str]) -> Dim:
    """A size, stride or offset as an int, or as an expression string over shape symbols (added to
    ``symbols``)."""
    try:
        return int(value)
    except TypeError:
        pass
    expr = sympy.sympify(value)
    symbols |= _shape_symbols(expr.free_symbols, f"{what} {expr}")
    return str(expr)


def dims_of(values: Iterable[Any], what: str, symbols: set[str]) -> list[Dim]:
    return [dim_of(v, what, symbols) for v in values]


def _parse(text: str) -> sympy.Expr:
    from .access import parse_index

    return parse_index(text)


def _numel(dims: list[Dim]) -> Any:
    """The product of ``dims``: an int, or a sympy expression when some are symbolic."""
    out: Any = 1
    for d in dims:
        out = out * (d if isinstance(d, int) else _parse(d))
    return out


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def _symbol_order(name: str) -> tuple[str, int]:
    return name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):] or 0)


def _node_ops(node: Any, sizes: list[Dim], rsizes: list[Dim], real_name: Any = None) -> tuple[list[Op], set[str]]:
    xvars = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(len(sizes))]
    rvars = [sympy.Symbol(f"r{i}", integer=True, nonnegative=True) for i in range(len(rsizes))]
    handler = RecordingHandler({str(v) for v in xvars + rvars}, real_name)
    numel = _numel(rsizes)
    handler.reduction_numel = numel if isinstance(numel, int) else str(numel)
    with torch_inductor.recording_ops(handler):
        node._body(xvars, rvars)
    return handler.ops, handler.symbols


def ir_ops(kind: str, node: Any) -> list[Op]:
    """The ops of an IR node a lowering just built (``torch_inductor.ir_kind``: an unrealized pointwise,
    reduction or scatter, or a computed buffer), recorded as a kernel of it would be. Raises
    :class:`LoweringError` as :func:`kernel_spec` would for what the card cannot lower (an unknown op, a
    store mode)."""
    data = node.data if kind == "computed" else node
    if kind == "computed":
        sizes, rsizes = list(data.get_pointwise_size()), list(data.get_reduction_size())
    else:
        sizes, rsizes = list(data.ranges), list(getattr(data, "reduction_ranges", []))
    xvars = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(len(sizes))]
    rvars = [sympy.Symbol(f"r{i}", integer=True, nonnegative=True) for i in range(len(rsizes))]
    handler = RecordingHandler({str(v) for v in xvars + rvars})
    numel = sympy.sympify(torch_inductor.size_product(rsizes))
    handler.reduction_numel = int(numel) if numel.is_number else str(numel)
    with torch_inductor.recording_ops(handler):
        flat = lambda index: sum(index, sympy.Integer(0))  # noqa: E731 - any index of the store will do
        if kind == "computed" and rsizes:
            data.store_reduction(node.get_name(), flat, xvars, rvars)
        elif kind == "computed":
            data.store_output(node.get_name(), flat, xvars)
        elif kind == "reduction":
            value = data.inner_fn(xvars, rvars)
            handler.reduction(data.get_dtype(), data.get_dtype(), data.reduction_type, value)
        elif kind == "scatter":
            data.store_output(None, flat, xvars)
        else:
            data.inner_fn(xvars)
    return handler.ops


def origins_of(nodes: list[Any]) -> tuple[list[str], list[str]]:
    """ATen op names and stack-trace lines of the FX nodes the scheduler nodes came from."""
    ops: list[str] = []
    lines: list[str] = []
    for n in nodes:
        for origin in sorted(getattr(n.node, "origins", ()) or (), key=lambda o: o.name):
            target = getattr(origin, "target", None)
            if origin.op == "call_function" and target is not None:
                name = str(target)
                name = name if name.startswith("aten.") else f"{getattr(target, '__module__', '')}.{name}".strip(".")
                if name not in ops:
                    ops.append(name)
            trace = origin.meta.get("stack_trace") if hasattr(origin, "meta") else None
            if trace:
                line = _last_user_frame(trace)
                if line and line not in lines:
                    lines.append(line)
    return ops, lines


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _last_user_frame(trace: str) -> str | None:
    frames = _FRAME.findall(trace)
    if not frames:
        return None
    path, line, fn, code = frames[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line} in {fn}: {code.strip()}"


def _placement(sizes: list[Dim], rsizes: list[Dim], xnumel: Any, rnumel: Any) -> str:
    """Where a node runs in the kernel's space; sizes may be symbolic (compared as expressions)."""
    if rsizes:
        if not (_equal(_numel(sizes), xnumel) and _equal(_numel(rsizes), rnumel)):
            raise LoweringError(f"reduction node ranges {sizes} x {rsizes} do not match the kernel's "
                                f"{xnumel} x {rnumel} iteration space")
        return "reduction"
    n = _numel(sizes)
    if _equal(n, xnumel * rnumel):
        return "full"
    if _equal(n, xnumel):
        return "outer"
    raise LoweringError(f"pointwise node of {n} elements does not fit the kernel's {xnumel} x {rnumel} space")


def _buffer_spec(name: str, role: str, symbols: set[str]) -> BufferSpec:
    graph = torch_inductor.current_graph()
    buf = graph.get_buffer(name)
    if buf is None and name in graph.graph_inputs:
        buf = graph.graph_inputs[name]
    layout = buf.get_layout()
    dtype = _loaded_dtype(name, layout.dtype) if role == "input" else None
    return _view_spec(name, layout, role, symbols, dtype)


def _view_spec(name: str, layout: Any, role: str, symbols: set[str], dtype: torch.dtype | None = None) -> BufferSpec:
    return BufferSpec(name, dtype_name(dtype or layout.dtype), dims_of(layout.size, f"buffer {name} size", symbols),
                      dims_of(layout.stride, f"buffer {name} stride", symbols),
                      dim_of(layout.offset, f"buffer {name} offset", symbols), role)


def kernel_spec(name: str, nodes: list[Any], real_name: Any = None, internal: Iterable[str] = ()) -> KernelSpec:
    """The KernelSpec of the scheduler nodes of one fused kernel (in execution order)."""
    symbols: set[str] = set()
    ranges = [(dims_of(n.get_ranges()[0], "iteration range", symbols),
               dims_of(n.get_ranges()[1], "reduction range", symbols)) for n in nodes]
    red = [r for r in ranges if r[1]]
    x_sizes, r_sizes = red[0] if red else (ranges[0][0], [])
    x_sizes = list(x_sizes) or [1]  # a 0-d output (full reduction, scalar op): one outer element
    xnumel, rnumel = _numel(x_sizes), _numel(r_sizes)
    specs = []
    for n, (sizes, rsizes) in zip(nodes, ranges):
        node_ops, node_lines = origins_of([n])
        try:
            ops, used = _node_ops(n, sizes, rsizes, real_name)
            symbols |= used
        except LoweringError as e:
            where = ", ".join(node_ops) or n.get_name()
            at = f" at {node_lines[0]}" if node_lines else ""
            err = type(e)(f"{e} (while lowering {where}{at})")
            err.failed_node = n  # the scheduler node: its origins may become fallback kernels (fallback.py)
            raise err from None
        specs.append(NodeSpec(n.get_name(), sizes, rsizes, _placement(sizes, rsizes, xnumel, rnumel), ops, node_ops))
    source_ops, source_lines = origins_of(nodes)
    internal = sorted(internal)
    buffers = [b for b in _buffers(specs, symbols) if b.name not in internal]
    return KernelSpec(name, x_sizes, r_sizes, specs, buffers, source_ops, source_lines, internal=internal,
                      symbols=sorted(symbols, key=_symbol_order))


def _buffers(specs: list[NodeSpec], symbols: set[str]) -> list[BufferSpec]:
    loaded, stored = [], []
    for s in specs:
        for o in s.ops:
            lst = loaded if o.op == "load" else stored if o.op == "store" else None
            if lst is not None and o.attrs["buffer"] not in lst:
                lst.append(o.attrs["buffer"])
    out = []
    for name in loaded + [n for n in stored if n not in loaded]:
        role = "inout" if name in loaded and name in stored else "input" if name in loaded else "output"
        out.append(_buffer_spec(name, role, symbols))
    return out


def extern_kernel_spec(name: str, generator: str, buffers: dict[str, Any], params: dict[str, Any],
                       origins: Iterable[Any] = ()) -> KernelSpec:
    """The KernelSpec of a whole-op kernel (matmul, attention, gather): ``buffers`` maps role names
    (the program's operand names, e.g. "a", "b", "out") to Inductor IR nodes; their views (size,
    stride, offset) are recorded; ``params`` name the roles for the generator."""
    symbols: set[str] = set()
    specs = [_view_spec(role, node.get_layout(), "output" if role == "out" else "input", symbols)
             for role, node in buffers.items()]
    fake = type("N", (), {"node": type("I", (), {"origins": list(origins)})()})()
    ops, lines = origins_of([fake])
    return KernelSpec(name, [], [], [], specs, ops, lines, generator=generator,
                      params={**params, **{r: r for r in buffers}}, symbols=sorted(symbols, key=_symbol_order))

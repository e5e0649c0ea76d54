"""The :class:`KernelSpec`: what one fused kernel computes, as plain data (JSON-serializable).

Made from Inductor's scheduler nodes by ``kernel_ir.py`` (the only reader of Inductor's ``LoopBody``),
stored by the generated wrapper and read by the program generators. It holds:

- the kernel's canonical iteration space: outer dims ``x_sizes`` and reduction dims ``r_sizes``;
- per scheduler node (:class:`NodeSpec`): its own iteration ranges and its *placement* in the kernel's
  space ("full": it runs over x and r, "outer": over x only, "reduction": x outer, r reduced);
- the op DAG (SSA, :class:`Op`): loads and stores with their index expressions (sympy over the node's
  variables, kept as strings), pointwise ops, constants, dtype conversions, masks, reductions (sum, max,
  min, prod; welford as mean and a second centred sum);
- the buffers every access names (:class:`BufferSpec`), with their Inductor layouts (size, stride,
  offset, dtype);
- provenance: origins as ATen op names and the user's stack-trace lines.

Dynamic shapes: a spec may be *symbolic*. Sizes, strides, offsets, iteration ranges, index and mask
expressions may then hold Inductor's shape symbols (``s27``, ``u0``) as strings (a number stays an
int); ``spec.symbols`` lists them and :meth:`KernelSpec.specialize` substitutes their values at run
time, giving the static spec the program generators read.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Union

import sympy
import torch

from ..errors import SpyreError


class LoweringError(SpyreError, NotImplementedError):
    """An Inductor node the Spyre compiler cannot lower (the message says what and what to do)."""


class UnsupportedOpError(LoweringError):
    """An op, store mode or reduction the card has no lowering for (compiler/fallback.py runs it eagerly)."""


class DynamicShapeError(LoweringError):
    """A symbolic value the Spyre compiler cannot keep symbolic until run time (the message says which)."""


class UnsupportedDtypeError(LoweringError, TypeError):
    """A dtype the card cannot compute in."""


# What the card's vector unit computes in (16-bit floats are DLFloat16 in memory, fp32 in the unit).
COMPUTABLE = {"float16", "bfloat16", "float32", "int64", "int32", "int16", "int8", "uint8", "bool"}


def check_computable(dtype: str | None, where: str) -> None:
    if dtype is not None and dtype not in COMPUTABLE:
        hint = ("convert to float32 (or float16) first" if dtype == "float64"
                else "use float16, bfloat16, float32 or an integer type")
        raise UnsupportedDtypeError(
            f"{where} computes in {dtype}, which the Spyre card cannot compute in (its vector unit "
            f"computes in fp32); {hint}"
        )


# torch dtype <-> the names used in specs
_DTYPE_NAMES = {
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
    torch.complex64: "complex64", torch.complex128: "complex128",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}
_NAME_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise LoweringError(f"the Spyre compiler has no mapping for dtype {dtype}") from None


def torch_dtype(name: str) -> torch.dtype:
    return _NAME_DTYPES[name]


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------
# A size, stride, offset or range: a number, or (in a symbolic spec) an expression over shape symbols
# kept as a string ("s27", "128*s0").
Dim = Union[int, str]


@dataclass
class Op:
    """One SSA value. ``args`` are op ids; ``attrs`` hold the rest (a constant's ``value``, a load's
    ``buffer`` and ``index``, a reduction's type, the masks guarding a load). In a symbolic spec an
    ``index`` or an indirect ``size`` may name shape symbols, and a constant with ``expr: true`` holds
    an expression over them as its ``value`` (welford's element count)."""

    id: int
    op: str  # "load", "store", "constant", "index_expr", "to_dtype", "reduction", "where", "add", ...
    args: list[int]
    dtype: str | None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class NodeSpec:
    name: str  # the scheduler node's name (e.g. "op3")
    sizes: list[Dim]
    reduction_sizes: list[Dim]
    placement: str  # "full", "outer" or "reduction"
    ops: list[Op]
    origins: list[str] = field(default_factory=list)


@dataclass
class BufferSpec:
    name: str
    dtype: str
    size: list[Dim]
    stride: list[Dim]
    offset: Dim
    role: str  # "input", "output", "inout"


@dataclass
class KernelSpec:
    name: str
    x_sizes: list[Dim]
    r_sizes: list[Dim]
    nodes: list[NodeSpec]
    buffers: list[BufferSpec]
    source_ops: list[str] = field(default_factory=list)
    source_lines: list[str] = field(default_factory=list)
    # Which program generator builds it: "" = pointwise/reduction (codegen/pointwise); other
    # generators (matmul, attention, gather) are in generators.GENERATORS and read ``params``.
    generator: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    # Buffers written and read only inside this kernel (Inductor removed them from the graph): they
    # never reach device memory; their reads are served from the values stored.
    internal: list[str] = field(default_factory=list)
    # Shape symbols the spec uses (empty: a static spec); the wrapper passes their values to each call.
    symbols: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.generator:
            return self.generator
        return "reduction" if self.r_sizes else "pointwise"

    def buffer(self, name: str) -> BufferSpec:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def specialize(self, values: dict[str, int]) -> "KernelSpec":
        """This spec with every shape symbol replaced by its value: a static spec (placements are
        checked again on the numbers). A static spec is returned as it is."""
        if not self.symbols:
            return self
        missing = [s for s in self.symbols if s not in values]
        if missing:
            raise DynamicShapeError(f"kernel {self.name} needs the values of shape symbols {missing} "
                                    f"(given: {sorted(values)})")
        sub = _Substitution({s: int(values[s]) for s in self.symbols})
        x_sizes, r_sizes = sub.dims(self.x_sizes), sub.dims(self.r_sizes)
        xnumel, rnumel = math.prod(x_sizes), math.prod(r_sizes) if r_sizes else 1
        nodes = []
        for n in self.nodes:
            sizes, rsizes = sub.dims(n.sizes), sub.dims(n.reduction_sizes)
            _check_placement(n.placement, sizes, rsizes, xnumel, rnumel, f"kernel {self.name} node {n.name}")
            nodes.append(NodeSpec(n.name, sizes, rsizes, n.placement, [sub.op(o) for o in n.ops], list(n.origins)))
        buffers = [BufferSpec(b.name, b.dtype, sub.dims(b.size), sub.dims(b.stride), sub.dim(b.offset), b.role)
                   for b in self.buffers]
        return KernelSpec(self.name, x_sizes, r_sizes, nodes, buffers, list(self.source_ops),
                          list(self.source_lines), self.generator, dict(self.params), list(self.internal))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "KernelSpec":
        d = json.loads(text)
        nodes = [NodeSpec(**{**n, "ops": [Op(**o) for o in n["ops"]]}) for n in d.pop("nodes")]
        buffers = [BufferSpec(**b) for b in d.pop("buffers")]
        return cls(nodes=nodes, buffers=buffers, **d)

    def describe(self) -> str:
        sym = f" (symbols {', '.join(self.symbols)})" if self.symbols else ""
        lines = [f"kernel {self.name}: {self.kind} over x={self.x_sizes} r={self.r_sizes}{sym}"]
        for n in self.nodes:
            lines.append(f"  node {n.name} ({n.placement}) sizes={n.sizes} rsizes={n.reduction_sizes}")
            for o in n.ops:
                lines.append(f"    %{o.id} = {o.op}({', '.join(_fmt_arg(a) for a in o.args)}) "
                             f"{o.dtype or ''} {o.attrs if o.attrs else ''}".rstrip())
        return "\n".join(lines)


class _Substitution:
    """Shape-symbol values applied to the parts of a spec that may be symbolic."""

    def __init__(self, values: dict[str, int]):
        self.values = values
        self._subs = {sympy.Symbol(k): sympy.Integer(v) for k, v in values.items()}

    def _expr(self, text: str) -> sympy.Expr:
        from .access import parse_index

        return parse_index(text).xreplace(self._subs)

    @staticmethod
    def _expr_symbols(text: str) -> set[sympy.Symbol]:
        from .access import parse_index

        return parse_index(text).free_symbols

    def dim(self, v: Dim) -> int:
        if isinstance(v, int):
            return v
        e = self._expr(v)
        if not e.is_number:
            raise DynamicShapeError(f"{v} has symbols {sorted(map(str, e.free_symbols))} with no value "
                                    f"(values given for {sorted(self.values)})")
        return int(e)

    def dims(self, vs: list[Dim]) -> list[int]:
        return [self.dim(v) for v in vs]

    def op(self, o: Op) -> Op:
        attrs = dict(o.attrs)
        index = attrs.get("index")
        if isinstance(index, str) and any(s.name in self.values for s in self._expr_symbols(index)):
            attrs["index"] = str(self._expr(index))
        if "size" in attrs:  # an indirect index's range
            attrs["size"] = self.dim(attrs["size"])
        if attrs.pop("expr", False):  # a constant computed from shape symbols
            attrs["value"] = float(self._expr(attrs["value"]))
        return Op(o.id, o.op, list(o.args), o.dtype, attrs)


def _fmt_arg(a: Any) -> str:
    return f"%{a}"


def _check_placement(placement: str, sizes: list[int], rsizes: list[int], xnumel: int, rnumel: int,
                     where: str) -> None:
    """A symbolic spec's placement, checked again once its sizes are numbers."""
    n = math.prod(sizes)
    fits = {"reduction": bool(rsizes) and n == xnumel and math.prod(rsizes) == rnumel,
            "full": not rsizes and n == xnumel * rnumel, "outer": not rsizes and n == xnumel}
    if not fits.get(placement, False):
        raise LoweringError(f"{where}: a {placement!r} node over {sizes} x {rsizes} does not fit the kernel's "
                            f"{xnumel} x {rnumel} space at these shape values")

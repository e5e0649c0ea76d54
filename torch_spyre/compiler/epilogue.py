"""Matmul epilogue fusion: bias, activation and residual after a matmul folded into the matmul kernel.

A compiled graph computes ``act(a @ b + bias) + residual`` as a matmul kernel and then pointwise kernels
that read the matmul's output back from device memory (and pay a kernel's fixed cost each). The matmul
generator can apply all of it to the fp32 accumulator while the tile is still in scratchpad
(``codegen/matmul``: the epilogue runs on the vector unit before the one rounding and the store), so this
pass rewrites the chain into one op, ``spyre::matmul_epilogue``, which ``lowerings.py`` lowers to one
matmul kernel.

The rewrite runs in the device's post-grad pass (``backend.py``) on the functional ATen graph, when the
``matmul_epilogue`` optimization is on (``optimizations.py``); with it off the graph is left as it is. From
each ``mm``/``addmm``/``bmm``/``baddbmm`` it follows a chain of single-user nodes:

- one reshape that keeps the last dim (a Linear on [B, S, K] is ``addmm`` on [B*S, K] viewed back);
- adds of a tensor that is full along N (a bias [N], or a residual of the output's shape): before an
  activation it is the bias, after it the residual;
- one activation: GELU (erf and tanh forms), SiLU or ReLU. Inductor decomposes these (fp16 GELU becomes
  an upcast, ``x * 0.5 * (1 + erf(x * 0.7071...))`` and a downcast), so the pass recognizes an
  activation by what it computes, not by how it is spelled: the smallest single-exit subgraph of
  scalar pointwise ops hanging off the value is evaluated in float64 on sample points and compared with
  each activation (:func:`_activation_of`).

A chain stops at anything else (a node with two users, a dtype change of the result, a second
activation); what it gathered up to there is fused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

DEVICE = "spyre"
OP_NAME = "matmul_epilogue"
_aten = torch.ops.aten
_prims = torch.ops.prims

MATMULS = {_aten.mm.default: "mm", _aten.addmm.default: "addmm", _aten.bmm.default: "bmm",
           _aten.baddbmm.default: "baddbmm"}
VIEWS = (_aten.reshape.default, _aten.view.default, _aten._unsafe_view.default)

#: activation (the vector unit's op name) -> its float64 reference
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "relu": torch.relu,
}

# Scalar pointwise ops an activation may be spelled with (after Inductor's decompositions).
_POINTWISE = {
    _aten.mul.Tensor, _aten.mul.Scalar, _aten.add.Tensor, _aten.add.Scalar, _aten.sub.Tensor, _aten.sub.Scalar,
    _aten.div.Tensor, _aten.div.Scalar, _aten.neg.default, _aten.erf.default, _aten.tanh.default,
    _aten.sigmoid.default, _aten.exp.default, _aten.reciprocal.default, _aten.pow.Tensor_Scalar,
    _aten.relu.default, _aten.gelu.default, _aten.silu.default, _aten.clamp_min.default,
    _prims.convert_element_type.default, _aten._to_copy.default,
}
_CASTS = (_prims.convert_element_type.default, _aten._to_copy.default)
_MAX_ACTIVATION_NODES = 24  # a decomposed activation is a handful of nodes; this bounds the search
# Sample points: both signs, the region where the activations differ most, and the tails.
_SAMPLES = torch.cat([torch.linspace(-8.0, 8.0, 161, dtype=torch.float64),
                      torch.tensor([-30.0, -0.001, 0.0, 0.001, 30.0], dtype=torch.float64)])

# =============================================================================================
# The fused op
# =============================================================================================
def reference(a, b, bias, residual, activation, alpha, beta, norm_weight=None, norm_bias=None, norm_eps=None,
              note=None):
    """What ``spyre::matmul_epilogue`` computes, with torch ops: ``act(alpha * a @ b + beta * bias) + residual``
    (``torch.matmul`` broadcasting: ``a`` [B, M, K] may meet ``b`` [K, N]), then, with ``norm_eps``, a
    LayerNorm over the last dim (``epilogue_norm.py``). ``note`` is why a fusion was not applied (it goes to
    the kernel's decisions; it does not change the result)."""
    out = torch.matmul(a, b)
    if alpha != 1.0:
        out = out * alpha
    if bias is not None:
        out = out + (bias * beta if beta != 1.0 else bias)
    if activation is not None:
        out = apply_activation(activation, out)
    return residual_and_norm(out, residual, norm_weight, norm_bias, norm_eps)


def residual_and_norm(out, residual, norm_weight, norm_bias, norm_eps):
    """The tail both fused references share (this op's and ``spyre::fused_mlp``'s): ``+ residual``, then
    with ``norm_eps`` a LayerNorm over the last dim (weight and bias in ``out``'s dtype)."""
    if residual is not None:
        out = out + residual
    if norm_eps is not None:
        w, c = (None if t is None else t.to(out.dtype) for t in (norm_weight, norm_bias))
        out = torch.nn.functional.layer_norm(out, out.shape[-1:], w, c, norm_eps)
    return out


def apply_activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown matmul epilogue activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name](x)


def _eager(a, b, bias, residual, activation, alpha, beta, norm_weight=None, norm_bias=None, norm_eps=None, note=None):
    out_dtype = a.dtype
    if norm_eps is not None:  # the norm in fp32 on the rounded sum, as the decomposed graph computed it
        y = reference(a, b, bias, residual, activation, alpha, beta).to(out_dtype).float()
        w, c = (None if t is None else t.float() for t in (norm_weight, norm_bias))
        return torch.nn.functional.layer_norm(y, y.shape[-1:], w, c, norm_eps).to(out_dtype)
    return reference(a, b, bias, residual, activation, alpha, beta).to(out_dtype)


def _meta(a, b, bias, residual, activation, alpha, beta, norm_weight=None, norm_bias=None, norm_eps=None, note=None):
    return a.new_empty((*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]))


_libs: dict[str, torch.library.Library] = {}


def define_device_op(name: str, schema: str, eager: Callable, meta: Callable) -> Any:
    """Define ``spyre::<name>`` once (idempotent) with its eager kernel (torch ops, on any device: a graph that
    falls back to eager still computes the right thing) and its meta kernel; returns the op overload. The
    compiler's fused ops (this one, ``fused_mlp.py``'s) are defined this way."""
    if name not in _libs:
        lib = torch.library.Library("spyre", "FRAGMENT")
        lib.define(f"{name}{schema}")
        lib.impl(name, eager, "CompositeExplicitAutograd")
        lib.impl(name, meta, "Meta")
        _libs[name] = lib
    return getattr(torch.ops.spyre, name).default


def define_op() -> None:
    """Define ``spyre::matmul_epilogue`` (idempotent); its eager kernel is :func:`reference` in torch ops."""
    op()


def op() -> Any:
    return define_device_op(OP_NAME, "(Tensor a, Tensor b, Tensor? bias, Tensor? residual, str? activation, "
                            "float alpha, float beta, Tensor? norm_weight=None, Tensor? norm_bias=None, "
                            "float? norm_eps=None, str? note=None) -> Tensor", _eager, _meta)


# =============================================================================================
# The rewrite
# =============================================================================================
@dataclass
class Chain:
    """What one matmul's chain gathered: the nodes it replaces and the epilogue they amount to."""

    matmul: Any
    kind: str
    last: Any  # the node whose value the fused op produces
    nodes: list = field(default_factory=list)  # every node replaced, the matmul first
    view: Any = None  # the reshape of the matmul's output, if any
    bias: Any = None
    residual: Any = None
    activation: str | None = None
    alpha: float = 1.0
    beta: float = 1.0

    @property
    def fused(self) -> list[str]:
        """The epilogue steps folded into the matmul, in order (what the kernel's decisions record)."""
        steps = ["bias"] if self.bias is not None and self.kind not in ("addmm", "baddbmm") else []
        steps += [self.activation] if self.activation else []
        return steps + (["residual"] if self.residual is not None else [])


def fuse_matmul_epilogues(gm: torch.fx.GraphModule) -> list[Chain]:
    """Rewrite every fusable chain of ``gm`` into ``spyre::matmul_epilogue``; returns what was fused. With
    the ``matmul_epilogue`` optimization switched off, nothing (the graph is left as it is)."""
    from . import optimizations

    if not optimizations.enabled("matmul_epilogue"):
        return []
    done = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in MATMULS or not _on_device(node):
            continue
        chain = _follow(node)
        if chain is not None and chain.fused and _rewrite(gm.graph, chain):
            done.append(chain)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return val if isinstance(val, torch.Tensor) else None


def _on_device(node: Any) -> bool:
    val = _val(node)
    return val is not None and val.device.type == DEVICE and val.dtype in (torch.float16, torch.bfloat16, torch.float32)


def _only_user(node: Any) -> Any:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _follow(mm: Any) -> Chain | None:
    kind = MATMULS[mm.target]
    n_in = 3 if kind in ("addmm", "baddbmm") else 2
    beta = float(mm.kwargs.get("beta", mm.args[n_in] if len(mm.args) > n_in else 1))
    alpha = float(mm.kwargs.get("alpha", mm.args[n_in + 1] if len(mm.args) > n_in + 1 else 1))
    chain = Chain(mm, kind, mm, [mm], alpha=alpha, beta=beta, bias=mm.args[0] if n_in == 3 else None)
    dtype, n = _val(mm).dtype, _val(mm).shape[-1]
    cur = mm
    user = _only_user(cur)
    if user is not None and user.target in VIEWS and _val(user) is not None and _same_shape(_val(user).shape[-1:], (n,)) \
            and len(_val(user).shape) <= 3:
        chain.view = cur = user
        chain.nodes.append(user)
    while True:
        user = _only_user(cur)
        addend = _addend(user, cur, dtype, n) if user is not None and user.op == "call_function" else None
        if addend is not None:
            if chain.activation is None and chain.bias is None:
                chain.bias = addend
            elif chain.residual is None:
                chain.residual = addend
            else:
                break
            cur = user
            chain.nodes.append(user)
            continue
        if chain.activation is not None or chain.residual is not None:
            break
        found = _activation_of(cur, dtype)
        if found is None:
            break
        chain.activation, region, cur = found
        chain.nodes += region
    chain.last = cur
    return chain


def _addend(node: Any, cur: Any, dtype: torch.dtype, n: int) -> Any:
    """The other operand of ``cur + other`` if it can ride the epilogue: a spyre tensor of a float dtype,
    full along N (a bias [N] or a residual), whose sum keeps the matmul's dtype."""
    if node.target != _aten.add.Tensor or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return None
    x, y = node.args
    other = y if x is cur else x if y is cur else None
    if other is None or other is cur or not hasattr(other, "meta"):
        return None
    ov, out = _val(other), _val(node)
    if ov is None or out is None or out.dtype != dtype or not _same_shape(out.shape, _val(cur).shape):
        return None
    if ov.device.type != DEVICE or ov.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    if ov.dim() == 0 or ov.dim() > out.dim() or not _same_shape(ov.shape[-1:], (n,)):
        return None
    full = _same_shape(ov.shape, out.shape)
    row = _same_shape((math.prod(ov.shape[:-1]),), (1,))  # a bias: broadcast over every row
    return other if full or row else None


def _activation_of(x: Any, dtype: torch.dtype) -> tuple[str, list, Any] | None:
    """``(name, nodes, exit)`` if a subgraph of scalar pointwise ops fed only by ``x`` computes one of
    :data:`ACTIVATIONS` of ``x`` and is read only through its exit node, whose dtype is ``dtype``."""
    region: list = []  # topological: each node's region inputs come before it
    inside = {x}
    frontier = list(x.users)
    while frontier and len(region) < _MAX_ACTIVATION_NODES:
        node = frontier.pop(0)
        if node in inside or not _scalar_pointwise(node, inside):
            continue
        inside.add(node)
        region.append(node)
        frontier += list(node.users)
    for i, exit_node in enumerate(region):
        if _val(exit_node) is None or _val(exit_node).dtype != dtype or not _same_shape(_val(exit_node).shape, _val(x).shape):
            continue
        sub = _ancestors_within(exit_node, set(region[:i + 1]))
        if any(u not in sub for node in [x, *sub] if node is not exit_node for u in node.users):
            continue  # something outside reads an intermediate: it must stay
        ordered = [node for node in region[:i + 1] if node in sub]
        name = _which_activation(x, ordered, exit_node)
        if name is not None:
            return name, ordered, exit_node
    return None


def _scalar_pointwise(node: Any, inside: set) -> bool:
    if node.op != "call_function" or node.target not in _POINTWISE:
        return False
    if node.target == _aten._to_copy.default and set(node.kwargs) - {"dtype"}:
        return False  # a copy to another device or layout is not a cast
    for arg in (*node.args, *node.kwargs.values()):
        if hasattr(arg, "op"):  # an FX node: must be computed inside the region
            if arg not in inside:
                return False
        elif not isinstance(arg, (int, float, bool, str, torch.dtype)) and arg is not None:
            return False
    return True


def _ancestors_within(node: Any, region: set) -> set:
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in seen or n not in region:
            continue
        seen.add(n)
        todo += [a for a in n.all_input_nodes]
    return seen


def _which_activation(x: Any, ordered: list, exit_node: Any) -> str | None:
    values = {x: _SAMPLES}
    try:
        for node in ordered:
            if node.target in _CASTS:
                values[node] = values[node.args[0]]  # evaluated in float64: the kernel rounds once, at the end
                continue
            args = [values[a] if hasattr(a, "op") else a for a in node.args]
            kwargs = {k: values[v] if hasattr(v, "op") else v for k, v in node.kwargs.items()}
            values[node] = node.target(*args, **kwargs)
    except (RuntimeError, TypeError, KeyError):
        return None
    got = values[exit_node]
    if not isinstance(got, torch.Tensor) or got.dtype != torch.float64 or got.shape != _SAMPLES.shape:
        return None
    for name, fn in ACTIVATIONS.items():
        if torch.allclose(got, fn(_SAMPLES), rtol=1e-9, atol=1e-12):
            return name
    return None


def _rewrite(graph: torch.fx.Graph, chain: Chain) -> bool:
    """Replace the chain by ``spyre::matmul_epilogue``; False (graph untouched) when it cannot be expressed.

    After a reshape the fused op works in the reshaped shape when ``a`` is itself a reshape of a tensor of
    that shape (a Linear's [B, S, K] input seen as [B*S, K]): it reads that tensor, so a residual is read
    as it lies and no merged-dims view needs a copy. Otherwise it works in the matmul's shape and the
    result is reshaped as the graph did. Shapes in new reshapes must be plain ints (symbolic sizes live in
    FX nodes), so with symbolic shapes an addend that would need one ends the fusion."""
    mm, last = chain.matmul, chain.last
    n_in = 3 if chain.kind in ("addmm", "baddbmm") else 2
    a, b = mm.args[n_in - 2], mm.args[n_in - 1]
    out_val = _val(last)
    source = a.args[0] if chain.view is not None and hasattr(a, "target") and a.target in VIEWS else None
    if source is not None and chain.kind in ("mm", "addmm") and out_val.dim() == 3 and _val(source) is not None \
            and _same_shape(_val(source).shape, (*out_val.shape[:-1], _val(a).shape[-1])):
        a, work = source, out_val
    else:
        work = _val(mm)
    addends = []
    for t in (chain.bias, chain.residual):
        shape = None if t is None else _val(t).shape
        if t is None or _same_shape(shape, work.shape) or len(shape) == 1:
            addends.append((t, None))
            continue
        target = list(work.shape) if math.prod(shape) == math.prod(work.shape) else [work.shape[-1]]
        if not all(isinstance(d, int) for d in target):
            return False
        addends.append((t, target))
    with graph.inserting_before(last):
        bias, residual = (t if target is None else _reshape(graph, t, target) for t, target in addends)
        fused = graph.call_function(op(), (a, b, bias, residual, chain.activation, chain.alpha, chain.beta))
        fused.meta["val"] = work
        fused.meta["spyre_epilogue"] = {"kind": chain.kind, "fused": chain.fused,
                                       "from_ops": [str(n.target) for n in chain.nodes]}
        result = fused
        if work is not out_val:  # the graph's own reshape of the matmul's output, applied to the result
            result = graph.call_function(chain.view.target, (fused, *chain.view.args[1:]), dict(chain.view.kwargs)) \
                if chain.view is not None else fused
            result.meta["val"] = out_val
    flat = mm.args[n_in - 2]
    last.replace_all_uses_with(result)
    for node in reversed(chain.nodes):
        if not node.users:
            graph.erase_node(node)
    if a is not flat and not flat.users:  # the [B*S, K] view that nothing reads now
        graph.erase_node(flat)
    return True


def _same_shape(x, y) -> bool:
    """Equal shapes, symbolic sizes compared without adding guards (unknown counts as different)."""
    if len(x) != len(y):
        return False
    for p, q in zip(x, y):
        if isinstance(p, int) and isinstance(q, int):
            if p != q:
                return False
        elif not statically_known_true(p == q):
            return False
    return True


def _reshape(graph: torch.fx.Graph, t: Any, shape: list[int]) -> Any:
    node = graph.call_function(_aten.reshape.default, (t, shape))
    node.meta["val"] = _val(t).reshape(shape)
    return node


__all__ = ["ACTIVATIONS", "Chain", "define_op", "fuse_matmul_epilogues", "op", "reference", "residual_and_norm"]

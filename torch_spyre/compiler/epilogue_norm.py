"""LayerNorm as a matmul epilogue: ``LayerNorm(matmul + bias + residual)`` in the matmul's kernel.

A post-LN transformer (BERT and its family) normalizes the output projection's sum with the residual:
after the matmul kernel (with its bias and residual folded in, ``epilogue.py``) a reduction kernel reads
the sum back, normalizes every row and writes it again, paying a kernel's fixed cost. When one core holds
whole rows of the output, the matmul can normalize its fp32 accumulator itself before the one rounding
(``codegen/matmul``: one N tile of all N, row sums on the vector unit). This pass rewrites
``spyre::matmul_epilogue`` followed by a LayerNorm over its last dim into the same op with the norm's
weight, bias and eps (``norm_weight``, ``norm_bias``, ``norm_eps``).

It runs in the device's post-grad pass after the epilogue fusion, when the ``matmul_layer_norm``
optimization is on (``optimizations.py``). The LayerNorm is recognized in the form Inductor's
decomposition gives it: an upcast to fp32 (for 16-bit values), ``var_mean(correction=0, keepdim)`` over
the last dim, ``(x - mean) * rsqrt(var + eps)``, an optional ``* weight`` and ``+ bias`` of [N], the
downcast. Each intermediate must have no other reader, except a cast nobody reads: the spyre-aware
decomposition casts the statistics (mean, rstd) of 16-bit inputs to the input's dtype, as the CPU returns
them (``device/norm_stats.py``), and those casts stay in a graph until dead code is eliminated (Inductor
does it before this pass; ``make_fx`` does not). 16-bit matmuls only (an fp32 matmul's kernel
multiplies 16-bit parts concatenated along K, ``fp32_matmul.py``; the norm was not built for it).

When no tiling of the fused kernel fits the scratchpad (whole rows of a wide N per core), the graph keeps
the LayerNorm's own kernel and the matmul's decisions say why (``note``): the compile never fails for it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from . import epilogue
from .epilogue import _only_user, _val

_aten, _prims = torch.ops.aten, torch.ops.prims
_UPCASTS = (_prims.convert_element_type.default, _aten._to_copy.default)


@dataclass
class Norm:
    """A matched LayerNorm after a fused matmul: its operands and the nodes it replaces."""

    matmul: Any  # the spyre::matmul_epilogue node
    weight: Any
    bias: Any
    eps: float
    last: Any  # the node whose value the fused op produces
    nodes: list


def fuse_layer_norms(gm: torch.fx.GraphModule) -> list[Norm]:
    """Fold every LayerNorm after a ``spyre::matmul_epilogue`` of 16-bit values into it; returns what was
    folded. With the ``matmul_layer_norm`` optimization off, nothing."""
    from . import optimizations

    if not optimizations.enabled("matmul_layer_norm"):
        return []
    op, done, changed = epilogue.op(), [], False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not op or len(node.args) > 7 \
                or _val(node) is None or _val(node).dtype not in (torch.float16, torch.bfloat16):
            continue
        found = match(node)
        if found is None:
            continue
        reason = fit_reason(found)
        if reason is not None:
            node.args = (*node.args[:7], None, None, None, f"matmul_layer_norm not used: {reason}")
            changed = True
            continue
        _rewrite(gm.graph, found)
        done.append(found)
    if done or changed:
        gm.graph.lint()
        gm.recompile()
    return done


def _is(node: Any, *targets: Any) -> bool:
    return getattr(node, "op", None) == "call_function" and node.target in targets


def match(x: Any) -> Norm | None:
    """The LayerNorm over the last dim of ``x`` that is its only reader, or None."""
    vx = _val(x)
    n, last_dim = vx.shape[-1], vx.dim() - 1
    nodes = []
    cur = x
    up = _only_user(x)
    if up is not None and _is(up, *_UPCASTS) and _val(up) is not None and _val(up).dtype == torch.float32:
        cur = up
        nodes.append(up)
    users = list(cur.users)
    vm = next((u for u in users if _is(u, _aten.var_mean.correction)), None)
    sub = next((u for u in users if _is(u, _aten.sub.Tensor) and u.args[0] is cur), None)
    if vm is None or sub is None or len(users) != 2:
        return None
    dims = vm.args[1] if len(vm.args) > 1 else vm.kwargs.get("dim")
    if list(dims or []) not in ([last_dim], [-1]) or vm.kwargs.get("correction", 1) != 0 \
            or not vm.kwargs.get("keepdim", False):
        return None
    items = {u.args[1]: u for u in vm.users if u.target is operator.getitem}
    if set(items) != {0, 1} or len(vm.users) != 2:
        return None
    var, mean = items[0], items[1]
    if _live_only_user(mean) is not sub or sub.args[1] is not mean:
        return None
    add_eps = _only_user(var)
    if not _is(add_eps, _aten.add.Scalar, _aten.add.Tensor) or add_eps.args[0] is not var \
            or not isinstance(add_eps.args[1], (int, float)):
        return None
    rsqrt = _only_user(add_eps)
    if not _is(rsqrt, _aten.rsqrt.default):
        return None
    norm = _only_user(sub)
    if not _is(norm, _aten.mul.Tensor) or _live_only_user(rsqrt) is not norm or set(norm.args) != {sub, rsqrt}:
        return None
    dead = [u for s in (mean, rsqrt) for u in s.users if _dead_cast(u)]
    nodes += [*dead, vm, var, mean, sub, add_eps, rsqrt, norm]
    cur, weight, bias = norm, None, None
    nxt = _only_user(cur)
    if _is(nxt, _aten.mul.Tensor) and _vector(_other(nxt, cur), n):
        weight, cur = _other(nxt, cur), nxt
        nodes.append(nxt)
        nxt = _only_user(cur)
    if _is(nxt, _aten.add.Tensor) and _vector(_other(nxt, cur), n):
        bias, cur = _other(nxt, cur), nxt
        nodes.append(nxt)
        nxt = _only_user(cur)
    if _val(cur).dtype != vx.dtype:
        if not (_is(nxt, *_UPCASTS) and _val(nxt) is not None and _val(nxt).dtype == vx.dtype):
            return None
        cur = nxt
        nodes.append(nxt)
    return Norm(x, weight, bias, float(add_eps.args[1]), cur, nodes)


def _dead_cast(node: Any) -> bool:
    """A dtype cast whose value nobody reads (the statistics' cast to the input's dtype, norm_stats.py)."""
    return _is(node, *_UPCASTS) and not node.users


def _live_only_user(node: Any) -> Any:
    """``node``'s only reader, not counting casts nobody reads; None if it has several."""
    users = [u for u in node.users if not _dead_cast(u)]
    return users[0] if len(users) == 1 else None


def _other(node: Any, cur: Any) -> Any:
    a, b = node.args[:2]
    return b if a is cur else a if b is cur else None


def _vector(t: Any, n: int) -> bool:
    """A [N] tensor (the norm's weight or bias)."""
    v = _val(t) if isinstance(t, torch.fx.Node) else None
    return v is not None and tuple(v.shape) == (n,) and v.is_floating_point()


def fit_reason(m: Norm) -> str | None:
    """None when some tiling of the fused kernel fits the scratchpad, else why not. Checked on the static
    shapes for every layout the graph's layout plan may give at run time (not known here): the weight
    sticked on K (transposed in the kernel, the most scratchpad) and A sticked on K or on M (then
    transposed in scratchpad: two more A buffers, rows in whole sticks). The norm is kept only when both
    fit. The residual is taken sticked on N, as the layout plan asks for it (sticked on M it needs
    2 x 64 more rows per chunk: 128x1024x1024 would not fit, and BERT-large would lose the fusion)."""
    from ..card.layout import StickLayout
    from ..device import cards
    from .access import TensorView, device_dtype_of
    from .codegen.matmul import MatmulSpec, MatmulSpecError, cached_rank_plans

    a, b, bias, residual = m.matmul.args[:4]
    shapes = [_val(t).shape if t is not None else None for t in (a, b, bias, residual, m.weight, m.bias)]
    if any(s is not None and not all(isinstance(d, int) for d in s) for s in shapes):
        return "symbolic shapes (the fit is checked on static shapes)"

    def view(name: str, t: Any, transposed: bool = False, stick: int = -1) -> TensorView | None:
        if t is None:
            return None
        shape, ddt = tuple(_val(t).shape), device_dtype_of(_val(t).dtype)
        if transposed and len(shape) == 2:
            return TensorView(name, StickLayout(shape[::-1], -1, ddt), shape, (1, shape[0]))
        if len(shape) < 2 or shape[-2] <= 1:
            stick = -1  # no M dim to stick on
        return TensorView(name, StickLayout(shape, stick, ddt), shape)

    vb = view("b", b, transposed=True)
    out_shape = tuple(_val(m.matmul).shape)
    for a_stick in (-1, -2):  # A sticked on K, on M
        va = view("a", a, stick=a_stick)
        if len(va.shape) == 3 and len(vb.shape) == 2:
            vb = vb.expanded(va.shape[0])
        out = TensorView("out", StickLayout(out_shape, -1, va.dtype), out_shape)
        spec = MatmulSpec(va, vb, out, view("bias", bias), float(m.matmul.args[5]), float(m.matmul.args[6]),
                          "baddbmm" if len(va.shape) == 3 else "addmm", "fit", activation=m.matmul.args[4],
                          residual=view("residual", residual), norm_eps=m.eps,
                          norm_weight=view("norm_weight", m.weight), norm_bias=view("norm_bias", m.bias))
        try:
            cached_rank_plans(spec, cards.config(), keep=1)
        except MatmulSpecError as e:
            return f"no tiling with whole rows per core fits with A sticked on {'K' if a_stick == -1 else 'M'} ({e})"
    return None


def _rewrite(graph: torch.fx.Graph, m: Norm) -> None:
    x = m.matmul
    with graph.inserting_before(m.last):
        fused = graph.call_function(epilogue.op(), (*x.args[:7], m.weight, m.bias, m.eps, None))
        fused.meta["val"] = _val(m.last)
        fused.meta["spyre_epilogue"] = {**x.meta.get("spyre_epilogue", {}), "layer_norm": True}
    m.last.replace_all_uses_with(fused)
    erase_matched(graph, [x], m)


def erase_matched(graph: torch.fx.Graph, before: list[Any], m: Norm) -> None:
    """Erase the norm's nodes and then ``before`` (the nodes feeding it that the fused node replaced), each
    once nobody reads it. The statistics' unread casts go first: they read the norm's own nodes."""
    dead = [n for n in m.nodes if _dead_cast(n)]
    for node in dead:
        graph.erase_node(node)
    for node in reversed([*before, *(n for n in m.nodes if n not in dead)]):
        if not node.users:
            graph.erase_node(node)


__all__ = ["Norm", "erase_matched", "fuse_layer_norms", "match"]

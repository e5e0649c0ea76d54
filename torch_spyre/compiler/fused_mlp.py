"""Fused MLP: up (and gate) -> activation (and gate product) -> down as one kernel.

A compiled MLP block (``down(act(gate(x)) * up(x))`` for SwiGLU/GeGLU, ``down(act(up(x)))`` for a plain
FFN) is three (or two) matmul kernels and a pointwise kernel for the gate product, with the intermediate
h written to device memory and read back. ``codegen/mlp`` computes it in one kernel that keeps h in
the cores' scratchpads; this pass rewrites the pattern into ``spyre::fused_mlp``, which ``lowerings.py``
lowers to that kernel, or to the unfused kernels when no tiling fits the scratchpad (with the reason in
their decisions).

It runs in the device's post-grad pass (``backend.py``) before the matmul epilogue rewrite
(``epilogue.py``), when the ``fused_mlp`` optimization is on (``optimizations.py``). From each
``mm``/``addmm`` (the down projection) it walks back:

- its A: a reshape to [tokens, I] (optional) of the gate product ``mul(act_exit, up)`` (either order)
  or, without a gate, of ``act_exit``; ``act_exit`` is the exit of an activation of the gate's (or the
  up's) output, recognised by what it computes (``epilogue._activation_of``: SiLU, GELU erf/tanh, ReLU);
- the up and gate matmuls (through one reshape each): ``mm``/``addmm`` (alpha = beta = 1) of the same x
  (the same tensor, or reshapes of the same tensor to the same shape), B of shape [H, I].

Every intermediate must have only the users inside the pattern (a graph that also reads h or the gate's
output keeps them: it is not rewritten), dtypes fp16/bf16 on spyre, shapes static.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import epilogue
from .epilogue import VIEWS, _on_device, _only_user, _val

OP_NAME = "fused_mlp"
_aten = torch.ops.aten
_MATMULS = (_aten.mm.default, _aten.addmm.default)


def reference(x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation, residual=None, norm_weight=None,
              norm_bias=None, norm_eps=None, note=None):
    """What ``spyre::fused_mlp`` computes, with torch ops; with ``norm_eps``, ``LayerNorm(mlp + residual)``
    over the last dim (``mlp_norm.py``; ``note``: why that was not folded, for the kernel's decisions)."""
    u = x @ w_up + (b_up if b_up is not None else 0)
    if w_gate is not None:
        g = x @ w_gate + (b_gate if b_gate is not None else 0)
        h = epilogue.apply_activation(activation, g) * u
    else:
        h = epilogue.apply_activation(activation, u)
    out = h @ w_down + (b_down if b_down is not None else 0)
    return epilogue.residual_and_norm(out, residual, norm_weight, norm_bias, norm_eps)


def _eager(x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation, residual=None, norm_weight=None,
           norm_bias=None, norm_eps=None, note=None):
    if norm_eps is not None:  # the norm in fp32 on the rounded sum, as the decomposed graph computed it
        y = reference(x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation, residual).to(x.dtype).float()
        w, c = (None if t is None else t.float() for t in (norm_weight, norm_bias))
        return torch.nn.functional.layer_norm(y, y.shape[-1:], w, c, norm_eps).to(x.dtype)
    return reference(x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation, residual).to(x.dtype)


def _meta(x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation, residual=None, norm_weight=None,
          norm_bias=None, norm_eps=None, note=None):
    return x.new_empty((*x.shape[:-1], w_down.shape[-1]))


def define_op() -> None:
    """Define ``spyre::fused_mlp`` (idempotent); its eager kernel is :func:`reference` in torch ops."""
    op()


def op() -> Any:
    return epilogue.define_device_op(OP_NAME, "(Tensor x, Tensor w_up, Tensor? w_gate, Tensor w_down, Tensor? b_up, "
                                     "Tensor? b_gate, Tensor? b_down, str activation, Tensor? residual=None, "
                                     "Tensor? norm_weight=None, Tensor? norm_bias=None, float? norm_eps=None, "
                                     "str? note=None) -> Tensor", _eager, _meta)


@dataclass
class Mlp:
    """One matched MLP: the nodes it replaces and its operands."""

    x: Any
    w_up: Any
    w_gate: Any
    w_down: Any
    b_up: Any
    b_gate: Any
    b_down: Any
    activation: str
    last: Any  # the node whose value the fused op produces
    nodes: list


def fuse_mlps(gm: torch.fx.GraphModule) -> list[Mlp]:
    """Rewrite every MLP block of ``gm`` into ``spyre::fused_mlp``; returns what was fused. With the
    ``fused_mlp`` optimization off, nothing."""
    from . import optimizations

    if not optimizations.enabled("fused_mlp"):
        return []
    done = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _MATMULS and _on_device(node) \
                and _val(node).dtype in (torch.float16, torch.bfloat16):
            found = match(node)
            if found is not None:
                _rewrite(gm.graph, found)
                done.append(found)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _unit_scales(mm: Any) -> bool:
    if mm.target != _aten.addmm.default:
        return True
    beta = mm.kwargs.get("beta", mm.args[3] if len(mm.args) > 3 else 1)
    alpha = mm.kwargs.get("alpha", mm.args[4] if len(mm.args) > 4 else 1)
    return beta == 1 and alpha == 1


def _operands(mm: Any) -> tuple[Any, Any, Any]:
    """(a, b, bias or None) of an mm/addmm."""
    if mm.target == _aten.addmm.default:
        return mm.args[1], mm.args[2], mm.args[0]
    return mm.args[0], mm.args[1], None


def _through_view(node: Any) -> Any:
    """The node a single reshape reads, or the node itself."""
    return node.args[0] if getattr(node, "target", None) in VIEWS else node


def _static(node: Any) -> bool:
    v = _val(node)
    return v is not None and all(isinstance(s, int) for s in v.shape)


def match(down: Any) -> Mlp | None:
    """The MLP ending in the matmul ``down``, or None."""
    if not _unit_scales(down):
        return None
    a_d, w_down, b_down = _operands(down)
    if _only_user(a_d) is not down:
        return None
    prod = _through_view(a_d)
    if prod is not a_d and _only_user(prod) is not a_d:
        return None
    nodes = [down] + ([a_d] if prod is not a_d else [])
    if getattr(prod, "target", None) == _aten.mul.Tensor and len(prod.args) == 2 and _only_user(prod) is not None:
        for act_exit, up_val in (prod.args, reversed(prod.args)):
            found = _gated(act_exit, up_val)
            if found is not None:
                up, gate, activation, region = found
                return _assemble(down, up, gate, activation, nodes + [prod] + region, b_down, w_down)
        return None
    found = _ungated(prod)
    if found is None:
        return None
    up, activation, region = found
    return _assemble(down, up, None, activation, nodes + region, b_down, w_down)


def _matmul_of(val: Any) -> tuple[Any, list] | None:
    """The mm/addmm whose only user (through at most one reshape) is ``val``'s chain."""
    mm = _through_view(val)
    if not hasattr(mm, "target") or mm.target not in _MATMULS or not _unit_scales(mm):
        return None
    if mm is not val and _only_user(mm) is not val:
        return None
    return mm, ([mm] if mm is val else [mm, val])


def _activation_region(out: Any) -> tuple[str, list, Any] | None:
    """(activation, nodes, its input) when ``out`` is the exit of an activation of a matmul's value."""
    for start in _candidate_inputs(out):
        found = epilogue._activation_of(start, _val(start).dtype)
        if found is not None and found[2] is out:
            return found[0], found[1], start
    return None


def _candidate_inputs(out: Any) -> list:
    """Nodes an activation region ending at ``out`` may start from: ancestors that are (reshapes of)
    matmuls, nearest first."""
    seen, todo, found = set(), [out], []
    while todo and len(seen) < 64:
        n = todo.pop(0)
        if n in seen or not hasattr(n, "op"):
            continue
        seen.add(n)
        if _matmul_of(n) is not None:
            found.append(n)
            continue
        todo += list(n.all_input_nodes)
    return found


def _gated(act_exit: Any, up_val: Any):
    region = _activation_region(act_exit)
    if region is None:
        return None
    activation, nodes, gate_val = region
    if _only_user(act_exit) is None or _only_user(up_val) is None:
        return None
    g, u = _matmul_of(gate_val), _matmul_of(up_val)
    if g is None or u is None or g[0] is u[0]:
        return None
    # the gate's value is read only by the activation region
    if any(user not in nodes for user in gate_val.users):
        return None
    return u, g, activation, nodes

def _ungated(act_exit: Any):
    region = _activation_region(act_exit)
    if region is None:
        return None
    activation, nodes, up_val = region
    u = _matmul_of(up_val)
    if u is None or any(user not in nodes for user in up_val.users):
        return None
    return u, activation, nodes


def _assemble(down, up, gate, activation, nodes, b_down, w_down) -> Mlp | None:
    up_mm, up_nodes = up
    a_u, w_up, b_up = _operands(up_mm)
    w_gate = b_gate = None
    nodes = nodes + up_nodes
    if gate is not None:
        gate_mm, gate_nodes = gate
        a_g, w_gate, b_gate = _operands(gate_mm)
        if not _same_input(a_u, a_g):
            return None
        nodes += gate_nodes
    x = a_u
    for t in (x, w_up, w_gate, w_down, b_up, b_gate, b_down):
        if t is not None and (not _static(t) or not _on_device(t) or _val(t).dtype not in (torch.float16, torch.bfloat16)):
            return None
    xv, wu, wd = _val(x), _val(w_up), _val(w_down)
    if not xv.is_contiguous():  # the kernel reads x sticked on its last dim, as a contiguous x is laid out
        return None
    if xv.dim() != 2 or wu.dim() != 2 or wd.dim() != 2 or wu.shape[0] != xv.shape[1] \
            or tuple(wd.shape) != (wu.shape[1], xv.shape[1]):
        return None
    if w_gate is not None and tuple(_val(w_gate).shape) != tuple(wu.shape):
        return None
    for b, n in ((b_up, wu.shape[1]), (b_gate, wu.shape[1]), (b_down, wd.shape[1])):
        if b is not None and tuple(_val(b).shape) != (n,):
            return None  # a bias that is not a plain [N] vector: left to the matmul kernels
    return Mlp(x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation, down, nodes)


def _same_input(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return getattr(a, "target", None) in VIEWS and getattr(b, "target", None) in VIEWS and a.args[0] is b.args[0] \
        and tuple(_val(a).shape) == tuple(_val(b).shape)


def _rewrite(graph: torch.fx.Graph, m: Mlp) -> None:
    """Replace the pattern by ``spyre::fused_mlp``. When x is a reshape [tokens, H] of a [B, S, H] tensor
    and the down matmul's only user reshapes back to [B, S, H], the fused op reads and writes the 3-d
    tensors (the merged-dims view would otherwise need a copy kernel)."""
    x, last = m.x, m.last
    source = x.args[0] if getattr(x, "target", None) in VIEWS else None
    back = _only_user(last)
    if source is not None and _val(source) is not None and _val(source).dim() == 3 and back is not None \
            and back.target in VIEWS and _val(back) is not None \
            and tuple(_val(back).shape) == (*_val(source).shape[:-1], _val(last).shape[-1]):
        x, last = source, back
    with graph.inserting_before(last):
        fused = graph.call_function(op(), (x, m.w_up, m.w_gate, m.w_down, m.b_up, m.b_gate, m.b_down, m.activation))
        fused.meta["val"] = _val(last)
        fused.meta["spyre_fused_mlp"] = {"activation": m.activation, "gated": m.w_gate is not None,
                                         "from_ops": [str(n.target) for n in m.nodes]}
    last.replace_all_uses_with(fused)
    # The pattern's nodes (and the reshapes of x they read) are dead now; nothing else is touched.
    dead = list(dict.fromkeys([last, *m.nodes, *_x_views(m)]))
    while True:
        gone = [n for n in dead if not n.users]
        if not gone:
            break
        for n in gone:
            graph.erase_node(n)
            dead.remove(n)


def _x_views(m: Mlp) -> list:
    """The reshapes of x the up and gate matmuls read (dead when the fused op reads x's source)."""
    out = []
    for n in m.nodes:
        if getattr(n, "target", None) in _MATMULS:
            a = _operands(n)[0]
            if getattr(a, "target", None) in VIEWS:
                out.append(a)
    return out


__all__ = ["Mlp", "define_op", "fuse_mlps", "match", "op", "reference"]

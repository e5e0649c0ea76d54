"""Sibling matmuls: matmuls that read the same input run as one kernel.

An attention block projects one input three times (Q, K and V: three ``addmm`` of the same activations);
a gated MLP that the fused MLP kernel does not take projects it twice. Each is a kernel of its own, and at
small batches each costs little more than the kernel's 20 µs fixed cost. This pass rewrites such a group
into one op, ``spyre::matmul_group(a, [b0, b1, ...], [bias0, bias1, ...])``, whose result is the members'
outputs side by side along N ([..., N0 + N1 + ...]); each member's value becomes a slice of it (a view,
no copy). ``lowerings.py`` lowers the op to one kernel of the ``"matmul_group"`` generator
(``codegen/matmul/group.py``): the members' matmul programs, each planned as on its own and writing its
columns of the shared output, run one after another in one launch. The consumers read the slices in place:
attention reads q, k and v as head views of the one buffer (``codegen/attention``'s lane heads).

The rewrite runs in the device's post-grad pass after the fused MLP's and the matmul epilogues' (so a
matmul with an activation or a residual keeps its epilogue kernel), when the ``matmul_group``
optimization is on (``optimizations.py``). A member is a plain ``mm`` / ``addmm`` (alpha = beta = 1, a
bias of [N] or none) of 16-bit floats (an fp32 matmul multiplies 16-bit parts concatenated along K, ``fp32_matmul.py``,
which the group generator was not built for), with a 2-d weight whose N is whole sticks (each member's columns start on a stick
boundary: stores move whole sticks, and two matmuls must not share one). Matmuls whose inputs are the
same node, or reshapes of one node to one shape, form a group; two or more are rewritten, as many as keep
all their operands within the device bytes one core may address in a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import epilogue
from .epilogue import VIEWS, _on_device, _val
from .fused_mlp import _operands, _static

OP_NAME = "matmul_group"
_aten = torch.ops.aten
_MATMULS = (_aten.mm.default, _aten.addmm.default)
_STICK_BYTES = 128
# Nodes a member's weight or bias may be computed by and that the rewrite may move up to the group's
# first matmul (views of a graph input: a Linear's ``permute(weight)``).
_MOVABLE = (*VIEWS, _aten.permute.default, _aten.t.default, _aten.transpose.int)


def reference(a, b, bias):
    """What ``spyre::matmul_group`` computes, with torch ops: each member's ``a @ b[i] (+ bias[i])``, in
    ``a``'s dtype, side by side along the last dim."""
    outs = [torch.matmul(a, w) if c is None else torch.matmul(a, w) + c for w, c in zip(b, bias)]
    return torch.cat(outs, dim=-1)


def _eager(a, b, bias):
    return reference(a, b, bias).to(a.dtype)


def _meta(a, b, bias):
    return a.new_empty((*a.shape[:-1], sum(w.shape[-1] for w in b)))


def define_op() -> None:
    """Define ``spyre::matmul_group`` (idempotent); its eager kernel is :func:`reference` in torch ops."""
    op()


def op() -> Any:
    return epilogue.define_device_op(OP_NAME, "(Tensor a, Tensor[] b, Tensor?[] bias) -> Tensor", _eager, _meta)


@dataclass
class Group:
    """One rewritten group: the matmuls (in graph order) and the fused node."""

    a: Any
    members: list
    fused: Any = None


def group_matmuls(gm: torch.fx.GraphModule) -> list[Group]:
    """Rewrite every group of sibling matmuls of ``gm`` into ``spyre::matmul_group``; returns the groups.
    With the ``matmul_group`` optimization off, nothing (the graph is left as it is)."""
    from . import optimizations

    if not optimizations.enabled(OP_NAME):
        return []
    groups: dict[Any, list] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _MATMULS and _member(node):
            key = _input_key(_operands(node)[0])
            if key is not None:
                groups.setdefault(key, []).append(node)
    done = []
    for members in groups.values():
        order = {n: i for i, n in enumerate(gm.graph.nodes)}  # again: a rewrite adds and moves nodes
        members = _within_span([m for m in members if _movable_operands(m, members[0], order)])
        if len(members) >= 2:
            done.append(_rewrite(gm.graph, members, order))
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _within_span(members: list) -> list:
    """The first members whose operands together stay within the device bytes one core may address in a
    kernel (``core_address_span_bytes``): a core of the group's kernel may touch all of them, where each
    member's own kernel touched only its own (members of large weights are left to their kernels)."""
    from ..device import cards

    limit = cards.config().core_address_span_bytes

    def nbytes(t: Any) -> int:
        v = _val(t) if isinstance(t, torch.fx.Node) else None
        return 0 if v is None else v.numel() * v.element_size()

    kept, total = [], nbytes(_operands(members[0])[0]) if members else 0
    for m in members:
        _, b, bias = _operands(m)
        more = nbytes(b) + nbytes(bias) + nbytes(m)
        if total + more > limit:
            break
        kept.append(m)
        total += more
    return kept


def _member(mm: Any) -> bool:
    if not _on_device(mm) or _val(mm).dtype not in (torch.float16, torch.bfloat16) or mm.kwargs:
        return False
    if mm.target == _aten.addmm.default and any(s != 1 for s in mm.args[3:5]):
        return False  # beta or alpha given positionally and not 1
    a, b, bias = _operands(mm)
    va, vb = _val(a), _val(b)
    if va is None or vb is None or va.dim() != 2 or vb.dim() != 2 or va.dtype != vb.dtype:
        return False
    n = vb.shape[-1]
    if not isinstance(n, int) or n % (_STICK_BYTES // vb.element_size()):
        return False  # N symbolic, or a member's columns would share a stick with the next member's
    if bias is not None and (_val(bias) is None or tuple(_val(bias).shape) != (n,) or _val(bias).dtype != vb.dtype):
        return False
    return True


def _input_key(a: Any) -> Any:
    """Matmuls reading the same node, or reshapes of one node to the same shape, share this key; None for
    an input of symbolic sizes (dynamic shapes: the group's span check needs static sizes)."""
    if not _static(a):
        return None
    if getattr(a, "target", None) in VIEWS:
        return (a.args[0], tuple(_val(a).shape))
    return a


def _movable_operands(mm: Any, first: Any, order: dict) -> bool:
    """Can the member's weight and bias be computed before the group's first matmul (where the fused op
    goes)? They already are, or they are views of nodes that are."""
    _, b, bias = _operands(mm)
    return all(x is None or _available(x, first, order) for x in (b, bias))


def _available(x: Any, first: Any, order: dict, depth: int = 0) -> bool:
    if not isinstance(x, torch.fx.Node) or x.op in ("placeholder", "get_attr") or order[x] < order[first]:
        return True
    return depth < 4 and x.op == "call_function" and x.target in _MOVABLE \
        and all(_available(i, first, order, depth + 1) for i in x.all_input_nodes)


def _hoist(x: Any, first: Any, order: dict) -> None:
    """Move ``x`` (and what it reads) before ``first`` when it comes after it (``_available`` said it may)."""
    if not isinstance(x, torch.fx.Node) or x.op in ("placeholder", "get_attr") or order[x] < order[first]:
        return
    for i in x.all_input_nodes:
        _hoist(i, first, order)
    first.prepend(x)
    order[x] = order[first] - 0.5  # before first, after what was before it


def _rewrite(graph: torch.fx.Graph, members: list, order: dict) -> Group:
    first = members[0]
    a = _operands(first)[0]
    rows = tuple(_val(a).shape[:-1])
    source = a.args[0] if getattr(a, "target", None) in VIEWS else None
    if source is not None and _val(source) is not None and _val(source).dim() == 3 \
            and _val(source).shape[-1] == _val(a).shape[-1]:
        a = source  # read [B, S, K] itself: its [B*S, K] view merges dims, which would need a copy kernel
    bs, biases = [], []
    for m in members:
        _, b, bias = _operands(m)
        _hoist(b, first, order)
        if bias is not None:
            _hoist(bias, first, order)
        bs.append(b)
        biases.append(bias)
    with graph.inserting_before(first):
        fused = graph.call_function(op(), (a, bs, biases))
        fused.meta["val"] = _meta(_val(a), [_val(b) for b in bs], biases)
        fused.meta["spyre_matmul_group"] = {"members": [str(m.target) for m in members]}
        notes = [f"member {i}: {m.meta['spyre_note']}" for i, m in enumerate(members) if m.meta.get("spyre_note")]
        if notes:  # e.g. a transposed product (transposed_product.py): into the group's decisions
            fused.meta["spyre_notes"] = notes
        offset = 0
        slices = []
        for m in members:
            n = _val(m).shape[-1]
            s = graph.call_function(_aten.slice.Tensor, (fused, -1, offset, offset + n))
            s.meta["val"] = fused.meta["val"][..., offset:offset + n]
            if a is not _operands(first)[0]:  # back to the member's [B*S, N]: a view (S * stride is B's stride)
                s = graph.call_function(_aten.view.default, (s, [*rows, n]))
                s.meta["val"] = _val(s.args[0]).view(*rows, n)
            slices.append(s)
            offset += n
    for m, s in zip(members, slices):
        m.replace_all_uses_with(s)
        graph.erase_node(m)
    return Group(a, members, fused)


__all__ = ["Group", "define_op", "group_matmuls", "op", "reference"]

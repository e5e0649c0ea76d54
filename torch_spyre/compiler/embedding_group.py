"""Sibling embedding lookups: gathers of rows by index tensors of one shape run as one kernel.

BERT's embeddings look up three tables (words, token types, positions) with index tensors of one shape
([B, S]; positions [1, S], the same at batch 1) and sum the rows: three gather kernels, each costing
little more than a kernel's 20 µs fixed cost at small batches, before the sum + LayerNorm kernel. This
pass rewrites such a group into ``spyre::embedding_group([w0, w1, ...], [i0, i1, ...])``, whose result
is the lookups stacked along a new first dim ([n, *index shape, D]); each member's value becomes
``select(result, 0, k)`` (a view, no copy). ``lowerings.py`` lowers the op to one kernel of the
``"gather"`` generator: the members' gather programs, each planned as on its own and writing its slice of
the shared output, run one after another in one launch (``codegen/matmul/group.py``'s ``sequence``).

It runs in the device's post-grad pass, when the ``embedding_group`` optimization is on
(``optimizations.py``). A member is ``aten.embedding`` (no padding index semantics needed: the forward
ignores it) of a 2-d table of 16-bit floats (or fp32) on spyre, static shapes; members share the table's
dtype, its row width D and the index tensor's shape, and every input of every member must be computed
before the first member (the group is placed there), or be a view of such (BERT's position ids, a slice
of a buffer, computed after the word lookup: the view is moved up). Two or more are rewritten; a lone
lookup is left alone. A group is priced first (:func:`priced_reason`: the members' gather programs for
the static shapes in their default layouts, timed by the card's timing model, in turn in one launch
against one launch each); where one launch is not faster (MiniLM's batch 32: the two [32, 128] lookups
take 180.8 µs in turn, 2 x 79.3 µs apart) the lookups stay apart and their kernels' decisions say why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from . import epilogue
from .epilogue import VIEWS, _on_device, _val

OP_NAME = "embedding_group"
_aten = torch.ops.aten
# Nodes an index (or table) may be computed by that the rewrite may move up to the first member: views.
_MOVABLE = (*VIEWS, _aten.slice.Tensor, _aten.expand.default, _aten.unsqueeze.default, _aten.squeeze.dim,
            _aten.select.int, _aten.permute.default, _aten.alias.default)


def reference(weights, indices):
    """What ``spyre::embedding_group`` computes, with torch ops: the lookups stacked along a new dim 0."""
    return torch.stack([torch.nn.functional.embedding(i, w) for w, i in zip(weights, indices)])


def _meta(weights, indices):
    return weights[0].new_empty((len(weights), *indices[0].shape, weights[0].shape[-1]))


def op() -> Any:
    return epilogue.define_device_op(OP_NAME, "(Tensor[] weights, Tensor[] indices) -> Tensor", reference, _meta)


def _member(node: Any) -> tuple | None:
    """(dtype, D, index shape) of a lookup that may join a group, else None."""
    if node.op != "call_function" or node.target is not _aten.embedding.default or not _on_device(node):
        return None
    w, i = node.args[:2]
    vw, vi, v = _val(w), _val(i), _val(node)
    if vw is None or vi is None or v is None or vw.dim() != 2 or vw.dtype not in (torch.float16, torch.bfloat16,
                                                                                   torch.float32):
        return None
    if vi.dtype not in (torch.int64, torch.int32) or not all(isinstance(d, int) for d in (*vw.shape, *vi.shape)):
        return None
    return (vw.dtype, int(vw.shape[1]), tuple(vi.shape))


def group_embeddings(gm: torch.fx.GraphModule) -> list[list[Any]]:
    """Rewrite every group of sibling lookups of ``gm``; returns the groups (lists of the replaced nodes).
    With the ``embedding_group`` optimization off, nothing."""
    from . import optimizations

    if not optimizations.enabled("embedding_group"):
        return []
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    groups: dict[tuple, list] = {}
    for node in gm.graph.nodes:
        key = _member(node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    done = []
    for members in groups.values():
        first = members[0]
        # The group is placed at the first member: only lookups whose inputs already exist there join.
        members = [first] + [m for m in members[1:] if all(_hoistable(a, first, order) for a in m.args[:2])]
        if len(members) < 2:
            continue
        reason = priced_reason(members)
        if reason is not None:
            for m in members:
                m.meta["spyre_note"] = f"embedding_group not used: {reason}"
            continue
        for m in members[1:]:
            for a in m.args[:2]:
                _hoist(a, first, order)
        _rewrite(gm.graph, members)
        done.append(members)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def priced_reason(members: list) -> str | None:
    """None when the members' gathers in one launch are estimated faster than one launch each, else why
    not (the card's timing model on the programs for the static shapes, default layouts)."""
    from ..card.layout import StickLayout
    from ..card.timing import time_program
    from ..device import cards
    from .access import CodegenError, TensorView, device_dtype_of
    from .codegen.gather import build_gather, group_member_specs
    from .codegen.matmul.group import sequence

    def whole(name: str, v: torch.Tensor) -> TensorView:
        return TensorView.whole(name, StickLayout(tuple(v.shape), -1, device_dtype_of(v.dtype)))

    cfg = cards.config()
    out = _meta([_val(m.args[0]) for m in members], [_val(m.args[1]) for m in members])
    try:
        specs = group_member_specs([whole(f"source{k}", _val(m.args[0])) for k, m in enumerate(members)],
                                   [whole(f"index{k}", _val(m.args[1])) for k, m in enumerate(members)],
                                   whole("out", out), "embedding_group")
        programs = [build_gather(s, cfg)[0] for s in specs]
        # Apart, each lookup writes a buffer of its own (its chunks follow its own output's bursts).
        alone = [build_gather(replace(s, out=whole(f"out{k}", _val(m))), cfg)[0]
                 for k, (s, m) in enumerate(zip(specs, members))]
    except CodegenError as e:
        return f"a member's gather does not build ({e})"
    apart = sum(time_program(p, cfg).total_s for p in alone)
    together = time_program(sequence("embedding_group", programs), cfg).total_s
    if together < apart:
        return None
    return (f"{len(members)} lookups in one launch take {together * 1e6:.1f} us against {apart * 1e6:.1f} us "
            "in one launch each (card timing model)")


def _hoistable(node: Any, first: Any, order: dict) -> bool:
    """``node`` exists before ``first``, or is a view whose inputs do (or are such views)."""
    if order[node] < order[first]:
        return True
    return node.op == "call_function" and node.target in _MOVABLE and \
        all(_hoistable(a, first, order) for a in node.all_input_nodes)


def _hoist(node: Any, first: Any, order: dict) -> None:
    """Move ``node`` (a :func:`_hoistable` one) and the views it reads to just before ``first``."""
    if order[node] < order[first]:
        return
    for a in node.all_input_nodes:
        _hoist(a, first, order)
    first.prepend(node)
    order[node] = order[first] - 0.5  # now before first (and after what it reads, moved before it)


def _rewrite(graph: torch.fx.Graph, members: list) -> None:
    weights, indices = [m.args[0] for m in members], [m.args[1] for m in members]
    with graph.inserting_before(members[0]):
        fused = graph.call_function(op(), (weights, indices))
        fused.meta["val"] = _meta([_val(w) for w in weights], [_val(i) for i in indices])
        fused.meta["spyre_embedding_group"] = {"members": len(members)}
        for k, m in enumerate(members):
            view = graph.call_function(_aten.select.int, (fused, 0, k))
            view.meta["val"] = _val(m)
            m.replace_all_uses_with(view)
    for m in members:
        graph.erase_node(m)


__all__ = ["group_embeddings", "op", "reference"]

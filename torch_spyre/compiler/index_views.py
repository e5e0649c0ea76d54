"""An index by aranges over whole dims is a view: ``x[arange(B)[:, None], arange(S)[None, :]]`` is ``x``.

Hugging Face's mask builders (transformers 5: ``padding_mask_function``) read the padding mask as
``attention_mask[batch_idx, kv_idx]`` with index tensors that are ``arange``s broadcast against each other.
Inductor lowers ``aten.index`` to a gather kernel (and kernels computing the indices), which on the card
are a kernel's fixed cost each for what is a relabelling of ``x``'s elements. This pass rewrites such an
index into views of ``x`` (reshape, permute, reshape, expand), so the mask's pointwise ops read ``x``
directly and fuse into one kernel.

A rewritten ``aten.index.Tensor(x, indices)`` has one index per dim of ``x``, each an ``iota``/``arange``
from 0 with step 1 whose length is that dim's size, seen through unsqueezes, reshapes or ``+ 0`` only, so
its values run along at most one dim of the result; two indices never run along the same dim. Everything
else (any other index, fewer indices than dims, ``None`` entries) is left to the gather. Runs in the
device's post-grad pass first, when the ``index_views`` optimization is on (``optimizations.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from .epilogue import VIEWS, _val

_aten, _prims = torch.ops.aten, torch.ops.prims
_THROUGH = (*VIEWS, _aten.unsqueeze.default)


def view_indexes(gm: torch.fx.GraphModule) -> list[Any]:
    """Rewrite every index by whole-dim aranges in ``gm`` into views; returns the rewritten index nodes.
    With the ``index_views`` optimization off, nothing."""
    from . import optimizations

    if not optimizations.enabled("index_views"):
        return []
    done = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is _aten.index.Tensor and _val(node) is not None \
                and _val(node).device.type == "spyre":
            dims = _arange_dims(node)
            if dims is not None:
                _rewrite(gm.graph, node, dims)
                done.append(node)
    if done:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return done


def _arange_length(node: Any) -> int | None:
    """n when ``node`` is ``arange(n)`` (``iota(n, start=0, step=1)``) seen through views and ``+ 0``."""
    while getattr(node, "op", None) == "call_function":
        if node.target in _THROUGH:
            node = node.args[0]
        elif node.target in (_aten.add.Tensor, _aten.add.Scalar) and node.args[1] == 0 \
                and not isinstance(node.args[1], bool):
            node = node.args[0]
        elif node.target is _prims.iota.default:
            ok = node.kwargs.get("start", 0) == 0 and node.kwargs.get("step", 1) == 1
            return node.args[0] if ok and isinstance(node.args[0], int) else None
        elif node.target in (_aten.arange.default, _aten.arange.start, _aten.arange.start_step):
            args = list(node.args)
            start, end, step = (0, args[0], 1) if node.target is _aten.arange.default else \
                (args[0], args[1], args[2] if len(args) > 2 else node.kwargs.get("step", 1))
            return end if start == 0 and step == 1 and isinstance(end, int) else None
        else:
            return None
    return None


def _arange_dims(index: Any) -> list[int | None] | None:
    """For each dim of ``x``, the result dim its arange runs along (None: a dim of size 1), or None when the
    index is not one of whole-dim aranges on distinct result dims."""
    x, indices = index.args[0], index.args[1]
    vx, out = _val(x), _val(index)
    if vx is None or len(indices) != vx.dim() or any(i is None for i in indices):
        return None
    dims, used = [], set()
    for k, idx in enumerate(indices):
        n, v = _arange_length(idx), _val(idx)
        if n is None or v is None or n != vx.shape[k] or not all(isinstance(s, int) for s in (*v.shape, *out.shape)):
            return None
        along = [d for d, s in enumerate(v.shape) if s != 1]
        if n == 1 and not along:
            dims.append(None)
            continue
        if len(along) != 1 or v.shape[along[0]] != n:
            return None
        d = along[0] + out.dim() - v.dim()  # indices broadcast from the right
        if d in used:
            return None
        used.add(d)
        dims.append(d)
    return dims


def _rewrite(graph: torch.fx.Graph, index: Any, dims: list[int | None]) -> None:
    x = index.args[0]
    vx, out = _val(x), _val(index)
    kept = [k for k, d in enumerate(dims) if d is not None]
    order = sorted(kept, key=lambda k: dims[k])  # x's dims in the order of the result dims they run along

    def add(target, args, val):
        node = graph.call_function(target, args)
        node.meta["val"] = val
        return node

    with graph.inserting_before(index):
        cur, v = x, vx
        squeezed = [vx.shape[k] for k in kept]
        if len(squeezed) != vx.dim():
            v = v.reshape(squeezed)
            cur = add(_aten.reshape.default, (cur, squeezed), v)
        perm = [kept.index(k) for k in order]
        if perm != list(range(len(perm))):
            v = v.permute(perm)
            cur = add(_aten.permute.default, (cur, perm), v)
        shape = [1] * out.dim()
        for k in order:
            shape[dims[k]] = vx.shape[k]
        if list(v.shape) != shape:
            v = v.reshape(shape)
            cur = add(_aten.reshape.default, (cur, shape), v)
        if list(v.shape) != list(out.shape):
            v = v.expand(list(out.shape))
            cur = add(_aten.expand.default, (cur, list(out.shape)), v)
    index.replace_all_uses_with(cur)
    graph.erase_node(index)


__all__ = ["view_indexes"]

"""The residual and LayerNorm after a fused MLP, in the MLP's kernel.

A post-LN transformer (BERT and its family) ends each layer with ``LayerNorm(mlp(x) + x)``: after the
fused MLP kernel (``fused_mlp.py``) a reduction kernel reads the MLP's output and the residual back, adds
and normalizes them, and pays a kernel's fixed cost (MiniLM: 6 of its kernels, 23.3 µs each at batch 1).
The MLP kernel's finisher (the core that adds the partial sums of the down projection, rounds and stores)
can instead add the residual and keep the row tile's whole rows in fp32, then normalize them before the
one rounding (``codegen/mlp``). This pass rewrites ``spyre::fused_mlp`` -> ``add(residual)`` ->
LayerNorm over the last dim into ``spyre::fused_mlp`` with ``residual``, ``norm_weight``, ``norm_bias``
and ``norm_eps``.

It runs in the device's post-grad pass after the MLP rewrite, when the ``mlp_layer_norm`` optimization is
on (``optimizations.py``). The LayerNorm is recognized as ``epilogue_norm.match`` recognizes it (Inductor's
decomposition); the add's other operand must have the MLP output's shape and dtype, and every
intermediate no other reader. The graph keeps the LayerNorm's own kernel, and the MLP kernel's decisions
say why (``note``), when the fused kernel with the norm fits no tiling of the scratchpad (checked on the
static shapes, weights in the layout that needs the most: the compile never fails for it), or when the
norm on the one finisher core would take longer than the kernel it saves (:func:`priced_reason`: at
MiniLM's batch 32, 4096 tokens, ~190 µs of vector work on one core against ~77 µs for the separate
kernel, which spreads it over every core; at batch 1, ~6 µs against ~22 µs).
"""

from __future__ import annotations

from typing import Any

import torch

from . import epilogue_norm, fused_mlp
from .epilogue import _only_user, _val

_aten = torch.ops.aten


def fuse_mlp_norms(gm: torch.fx.GraphModule) -> list[epilogue_norm.Norm]:
    """Fold every residual + LayerNorm after a ``spyre::fused_mlp`` into it; returns what was folded. With
    the ``mlp_layer_norm`` optimization off, nothing."""
    from . import optimizations

    if not optimizations.enabled("mlp_layer_norm"):
        return []
    op, done, changed = fused_mlp.op(), [], False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not op or len(node.args) > 8 or node.kwargs:
            continue
        found = match(node)
        if found is None:
            continue
        norm, add, residual = found
        reason = fit_reason(node, residual, norm)
        if reason is not None:
            node.args = (*node.args[:8], None, None, None, None, f"mlp_layer_norm not used: {reason}")
            changed = True
            continue
        _rewrite(gm.graph, node, add, residual, norm)
        done.append(norm)
    if done or changed:
        gm.graph.lint()
        gm.recompile()
    return done


def match(mlp: Any) -> tuple[epilogue_norm.Norm, Any, Any] | None:
    """(the LayerNorm, the add, the residual) after ``mlp``, or None."""
    v = _val(mlp)
    if v is None or v.dtype not in (torch.float16, torch.bfloat16) or not all(isinstance(d, int) for d in v.shape):
        return None
    add = _only_user(mlp)
    if getattr(add, "target", None) is not _aten.add.Tensor or len(add.args) != 2 or add.kwargs:
        return None
    residual = add.args[1] if add.args[0] is mlp else add.args[0] if add.args[1] is mlp else None
    rv = _val(residual) if isinstance(residual, torch.fx.Node) else None
    if rv is None or tuple(rv.shape) != tuple(v.shape) or rv.dtype != v.dtype or _val(add).dtype != v.dtype:
        return None
    norm = epilogue_norm.match(add)
    return None if norm is None else (norm, add, residual)


def fit_reason(mlp: Any, residual: Any, norm: epilogue_norm.Norm) -> str | None:
    """None when some tiling of the fused kernel with the norm fits the scratchpad, else why not."""
    from ..card.layout import StickLayout
    from ..device import cards
    from .access import TensorView, device_dtype_of
    from .codegen import mlp as mlp_gen

    x, w_up, w_gate, w_down, b_up, b_gate, b_down, activation = mlp.args[:8]
    ddt = device_dtype_of(_val(mlp).dtype)

    def view(name: str, t: Any) -> TensorView | None:
        if t is None:
            return None
        shape = tuple(_val(t).shape)
        if not all(isinstance(d, int) for d in shape):
            raise TypeError("symbolic")
        if name.startswith("w_"):  # the worst case: nn.Linear's own layout (sticked on K), transposed in kernel
            return TensorView(name, StickLayout(shape[::-1], -1, ddt), shape, (1, shape[0]))
        return TensorView(name, StickLayout(shape, -1, ddt), shape)

    try:
        views = {n: view(n, t) for n, t in (("x", x), ("w_up", w_up), ("w_gate", w_gate), ("w_down", w_down),
                                             ("b_up", b_up), ("b_gate", b_gate), ("b_down", b_down), ("out", mlp),
                                             ("residual", residual), ("norm_weight", norm.weight),
                                             ("norm_bias", norm.bias))}
    except TypeError:
        return "symbolic shapes (the fit is checked on static shapes)"
    cfg = cards.config()
    priced = priced_reason(_val(mlp).numel() // _val(mlp).shape[-1], _val(mlp).shape[-1], _val(mlp).element_size(),
                           residual is not None, cfg)
    if priced is not None:
        return priced
    spec = mlp_gen.MlpSpec(views["x"], views["w_up"], views["w_down"], views["out"], views["w_gate"], views["b_up"],
                           views["b_gate"], views["b_down"], activation, residual=views["residual"],
                           norm_weight=views["norm_weight"], norm_bias=views["norm_bias"], norm_eps=norm.eps)
    return mlp_gen.fit(spec, cfg)


# fp32 passes of the finisher's norm over a row tile (bias, residual, row sum, centring, square, sum of
# squares, scaling by rstd, weight) and the 16-bit one writing the output (+ norm bias): ``codegen/mlp/emit.py``.
NORM_F32_PASSES, NORM_OUT_PASSES = 8, 1


def priced_reason(tokens: int, h: int, itemsize: int, residual: bool, cfg: Any) -> str | None:
    """None when the norm on the MLP kernel's finisher (one core's vector unit, after the last partial
    sums) is estimated cheaper than the separate LayerNorm kernel it replaces (a kernel's fixed cost and
    its DRAM traffic: the MLP output and the residual read, the result written), else why not."""
    from ..card import costs

    n = tokens * h
    fused = (NORM_F32_PASSES * costs.vector_cycles(cfg, n, 4) + NORM_OUT_PASSES * costs.vector_cycles(cfg, n, itemsize)
             ) / cfg.clock_hz
    separate = cfg.kernel_fixed_cost_s + (1 + residual) * n * itemsize / cfg.dram_read_bandwidth \
        + n * itemsize / cfg.dram_write_bandwidth
    if fused < separate:
        return None
    return (f"the norm of {tokens} tokens x {h} on the finisher core (est. {fused * 1e6:.1f} us of vector work) "
            f"costs more than the separate LayerNorm kernel (est. {separate * 1e6:.1f} us)")


def _rewrite(graph: torch.fx.Graph, mlp: Any, add: Any, residual: Any, norm: epilogue_norm.Norm) -> None:
    with graph.inserting_before(norm.last):
        fused = graph.call_function(fused_mlp.op(), (*mlp.args[:8], residual, norm.weight, norm.bias, norm.eps, None))
        fused.meta["val"] = _val(norm.last)
        fused.meta["spyre_fused_mlp"] = {**mlp.meta.get("spyre_fused_mlp", {}), "layer_norm": True}
    norm.last.replace_all_uses_with(fused)
    epilogue_norm.erase_matched(graph, [mlp, add], norm)


__all__ = ["fuse_mlp_norms", "match"]

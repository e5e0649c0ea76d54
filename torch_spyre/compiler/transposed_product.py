"""A matmul read transposed by a kernel that needs it in the other stick layout computes the transposed
product instead: ``(a @ b).t()`` is ``b.t() @ a.t()`` (issue 13 §5, an intermediate relayout folded into
its producer).

The matmul writes its output sticked on N. When the product is read transposed by a kernel that wants its
rows along the stick dim (attention's K from ``(w @ x.t()).t()``), Inductor puts a transposing copy
kernel between the two: the intermediate written, read back and written again in the
other layout, a kernel's fixed cost and more. ``b.t() @ a.t()`` writes it once in the layout the reader
wants; the price is the matmul reading its operands transposed (its in-kernel transposes). The card's
timing model prices both at compile time (the copy as the relayout program of the product's shape, which
moves the same stick blocks; the matmul both ways, each operand sticked on its unit-stride dim) and the
rewrite is made only when it is the faster; the figures go into the matmul's decisions (``spyre_note``).

Only 2-D 16-bit ``aten.mm`` of static shape whose one user is the transpose (others are kept, the
reason in the matmul's decisions); the transpose's users seen through unsqueezes must
include a ``spyre::flash_attention`` operand (a ``clone`` keeps its copy kernel either way; a matmul reads
the transposed view in kernel). Runs in the device's post-grad pass
before the matmul groups (a folded product reading the group's input joins it), when the
``transposed_product`` optimization is on (``optimizations.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from .epilogue import _val

_aten = torch.ops.aten
_THROUGH = (_aten.unsqueeze.default,)


def fold_transposed_products(gm: torch.fx.GraphModule, config: Any = None) -> list[str]:
    """Rewrite each priced-faster transposed matmul in ``gm``; returns the notes of every site considered
    (rewritten or not, and why). With the ``transposed_product`` optimization off, nothing."""
    from . import optimizations

    if not optimizations.enabled("transposed_product"):
        return []
    notes, changed = [], False
    for node in list(gm.graph.nodes):
        mm = _transposed_mm(node)
        if mm is None or not _read_in_other_layout(node):
            continue
        a, b = mm.args
        skip = _not_priced(_val(a), _val(b), _val(mm))
        if skip:  # kept, and the matmul's decisions say why
            mm.meta["spyre_note"] = f"read transposed, kept (then a transposing copy; transposed_product): {skip}"
            notes.append(f"{mm.name}: {mm.meta['spyre_note']}")
            continue
        try:
            copy_s, extra_s = _prices(_val(a), _val(b), _val(mm), config)
        except Exception as e:  # noqa: BLE001 - a shape the generators refuse: leave the graph as it is
            notes.append(f"{mm.name}: transposed product not priced ({type(e).__name__}: {e})")
            continue
        figures = (f"the transposing copy kernel {copy_s * 1e6:.2f} us, the product's in-kernel transposes "
                   f"{extra_s * 1e6:+.2f} us (card timing model)")
        if extra_s >= copy_s:
            mm.meta["spyre_note"] = f"read transposed, kept (then a transposing copy; transposed_product): {figures}"
            notes.append(f"{mm.name}: {mm.meta['spyre_note']}")
            continue
        note = (f"computed as b^T @ a^T, written once in the layout its reader wants (transposed_product): "
                f"{figures}")
        with gm.graph.inserting_before(node):
            bt, at = _transposed(gm.graph, b), _transposed(gm.graph, a)
            folded = gm.graph.call_function(_aten.mm.default, (bt, at))
            folded.meta["val"] = torch.empty_like(_val(node), memory_format=torch.contiguous_format)
            folded.meta["spyre_note"] = note
            for k in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "original_aten"):
                if k in mm.meta:  # provenance, for the debug output and the decisions
                    folded.meta[k] = mm.meta[k]
        node.replace_all_uses_with(folded)
        gm.graph.erase_node(node)
        gm.graph.erase_node(mm)
        for x in dict.fromkeys((a, b)):  # a transpose only the old product read (once, also when a is b)
            if _is_transpose(x) and not x.users:
                gm.graph.erase_node(x)
        notes.append(f"{mm.name}: {note}")
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return notes


def _not_priced(a: Any, b: Any, out: Any) -> str | None:
    """Why a site is left as it is without pricing, or None: a symbolic size (pricing would specialize a
    ``dynamic=True`` graph to the current shape: a recompile per shape), a dtype the card's matmul does not
    take as one 16-bit pass (fp32 runs as several passes of parts, not priced here), or an output with a dim
    of 1 (its transposed view is already unit-stride in its last dim: attention copies nothing)."""
    if any(v is None for v in (a, b, out)):
        return "no shape recorded"
    if not all(isinstance(d, int) for v in (a, b, out) for d in (*v.shape, *v.stride())):
        return "a symbolic shape, not priced (that would fix the graph to this call's sizes)"
    if out.dtype not in (torch.float16, torch.bfloat16):
        return f"{str(out.dtype).replace('torch.', '')}, not priced (only 16-bit products are)"
    if 1 in out.shape:
        return "a dim of 1: its transposed view needs no copy"
    return None


def _transposed(graph: torch.fx.Graph, x: Any) -> Any:
    """``x.t()``: the node ``x`` transposes when it is a 2-D transpose (so that ``(w @ x.t()).t()`` reads
    ``x`` itself, and joins a matmul group reading it), else a new permute."""
    if _is_transpose(x):
        return x.args[0]
    t = graph.call_function(_aten.permute.default, (x, [1, 0]))
    t.meta["val"] = _val(x).permute(1, 0)
    return t


def _is_transpose(node: Any) -> bool:
    if getattr(node, "op", None) != "call_function" or _val(node) is None or _val(node).dim() != 2:
        return False
    t = node.target
    return (t is _aten.t.default or (t is _aten.permute.default and list(node.args[1]) == [1, 0])
            or (t is _aten.transpose.int and sorted(d % 2 for d in node.args[1:3]) == [0, 1]))


def _transposed_mm(node: Any) -> Any:
    """The ``aten.mm`` node ``node`` transposes (2-D), when it is that mm's only user; else None."""
    src = node.args[0] if _is_transpose(node) else None
    if getattr(src, "target", None) is not _aten.mm.default or len(src.users) != 1 or _val(src) is None \
            or _val(src).dim() != 2 or _val(src).device.type != "spyre":
        return None
    return src


def _read_in_other_layout(node: Any) -> bool:
    """``node`` reaches (through unsqueezes) an attention operand, which reads rows along the stick dim:
    Inductor realizes the transposed view for it with a copy kernel that the fold removes. (Not a
    ``clone``/``.contiguous()``: its copy stays after the fold, only no longer transposing, 0.3-0.5 us.)"""
    attention = getattr(getattr(torch.ops, "spyre", None), "flash_attention", None)
    todo = list(node.users)
    while todo:
        u = todo.pop()
        if u.target in _THROUGH:
            todo += list(u.users)
        elif attention is not None and u.target is attention.default:
            return True
    return False


def _prices(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: Any) -> tuple[float, float]:
    """(simulated seconds of the transposing copy of ``a @ b``, of ``b.t() @ a.t()`` minus ``a @ b``)."""
    from ..card.layout import StickLayout
    from ..card.timing import time_program
    from .access import device_dtype_of
    from .codegen.matmul import build_matmul
    from .relayout import relayout_program

    if config is None:
        from ..device import cards

        config = cards.config()
    dtype = device_dtype_of(out.dtype)
    src, dst = StickLayout(tuple(out.shape), 1, dtype), StickLayout(tuple(out.shape), 0, dtype)
    copy_s = time_program(relayout_program(src, dst, config), config).total_s
    as_is, folded = (time_program(build_matmul(_mm_spec(x, y, dtype), config)[0], config).total_s
                     for x, y in ((a, b), (b.t(), a.t())))
    return copy_s, folded - as_is


def _mm_spec(a: torch.Tensor, b: torch.Tensor, dtype: str) -> Any:
    """The matmul ``a @ b`` of these views, each over its own dense buffer sticked on its unit-stride dim."""
    from ..card.layout import StickLayout
    from .access import TensorView
    from .codegen import matmul as mm

    def view(name: str, t: torch.Tensor) -> TensorView:
        order = sorted(range(t.dim()), key=lambda d: -t.stride(d))  # the buffer's dims, outermost first
        host = tuple(t.shape[d] for d in order)
        return TensorView(name, StickLayout(host, len(host) - 1, dtype), tuple(t.shape), tuple(t.stride()), 0)

    out = torch.empty(a.shape[0], b.shape[1], device="meta")
    return mm.MatmulSpec(view("a", a), view("b", b), view("out", out), None, kind="mm", name="priced")


__all__ = ["fold_transposed_products"]

"""Ops the compiler cannot lower for the card never fail the compile: they run as the eager op.

Two places find them, both on graphs on spyre:

- **at lowering** (:func:`lowering_refusal`, asked by Inductor's ``GraphLowering.call_function`` through
  the seam's ``guard_lowerings``): after Inductor lowers an FX node, the IR it built is recorded as a
  kernel of it would be (``kernel_ir.ir_ops``). An op the vector unit does not have (``lgamma``; bit
  operations on integers, which the pointwise generator would refuse), a store
  with a mode (``atomic_add`` from ``index_put(accumulate=True)``, ``scatter_add``, ``index_add``) or an
  index read from memory inside a pointwise kernel (``index_copy``, ``scatter``) makes the node a
  *fallback kernel*: Inductor's own ``FallbackKernel``, which calls the ATen op on the graph's spyre
  tensors. A pointwise node is lowered again at once; a node whose lowering already registered buffers
  (a scatter) is marked and the graph compiled again (the seam's ``retry_compile_after_fallbacks``).
- **at code generation** (``scheduling.py``): a fused node whose kernel spec still raises
  ``LoweringError`` marks the FX nodes it came from, and the graph is compiled again with them as
  fallback kernels. So does a fused pointwise/reduction kernel whose *program* cannot be generated:
  programs are made at run time, per placement of the bound tensors, where nothing can fall back any
  more, so :func:`check_generates` makes one at compile time for the placements the wrapper allocates
  (the layout plan's, else the default layout of each buffer); every FX node of the kernel is marked.

At run time the fallback kernel's op goes through the device like any eager op (``device/fallback.py``):
as a cached single-op program when the eager path can make one, else on the host. The generated code
calls :func:`~torch_spyre.compiler.kernel_runtime.note_compile_fallback` before it: counted in
``torch_spyre.fallback_stats().compile_fallbacks``, its work tagged for the profiler
(``profile.compile_fallbacks()``), a warning once per op naming it and why.

Dtype and dynamic-shape refusals are not fallbacks: they keep their errors (the card cannot hold the
data, or the shape must be made static). The eager path's own one-op compiles do not fall back either:
their refusal is the reason the eager op runs on the host.
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch import inductor as torch_inductor
from .._torch.device import OpOverload
from .kernel_spec import DynamicShapeError, LoweringError, Op, UnsupportedDtypeError, UnsupportedOpError, torch_dtype

DEVICE = "spyre"


def lowering_refusal(target: Any, out: Any, new_operations: list) -> tuple[str, bool] | None:
    """Why the card cannot run the IR Inductor built for ``target`` and whether dropping that IR undoes it
    (``(reason, undoable)``), or None when it can (or the graph is not on spyre)."""
    from . import eager

    if eager.compiling():
        return None
    for op in new_operations:
        if torch_inductor.is_computed_buffer(op) and _on_spyre(op):
            reason = _refusal("computed", op)
            if reason:
                return reason, False
    for leaf in _leaves(out):
        kind, node = torch_inductor.ir_kind(leaf)
        if kind in ("pointwise", "reduction", "scatter", "computed") and _on_spyre(node):
            reason = _refusal(kind, node)
            if reason:
                return reason, kind != "computed"
    return None


def _leaves(out: Any) -> list:
    if isinstance(out, (list, tuple)):
        return [x for o in out for x in _leaves(o)]
    return [out] if torch_inductor.is_ir_node(out) else []


def _on_spyre(node: Any) -> bool:
    try:
        device = node.get_device()
    except Exception:  # noqa: BLE001 - IR without a device
        return False
    return isinstance(device, torch.device) and device.type == DEVICE


def _refusal(kind: str, node: Any) -> str | None:
    from .kernel_ir import ir_ops

    try:
        ops = ir_ops(kind, node)
    except UnsupportedOpError as e:
        return str(e)
    except Exception:  # noqa: BLE001 - dtype and shape errors are the compile's to report; IR this check
        return None  # cannot walk (a buffer whose layout is not fixed): the kernel spec decides at codegen
    return index_from_memory(ops) or _bit_operation(ops)


def _bit_operation(ops: list[Op]) -> str | None:
    """The pointwise generator's refusal of bit operations on non-bool operands, found at lowering."""
    from .codegen.pointwise.values import bool_only_refusal

    dtypes = {o.id: o.dtype for o in ops}
    for o in ops:
        refusal = bool_only_refusal(o.op, {dtypes.get(a) for a in o.args})
        if refusal:
            return refusal
    return None


def index_from_memory(ops: list[Op]) -> str | None:
    """Why an op list cannot be a pointwise kernel because an index is read from memory (the pointwise
    generator computes indices from the loop indices only; reads at loaded indices are the gather
    generator's, which its lowerings reach for embedding, index_select, x[idx], gather), or None."""
    by_id = {o.id: o for o in ops}

    def loads(i: int, seen: set[int]) -> bool:
        if i in seen or i not in by_id:
            return False
        seen.add(i)
        o = by_id[i]
        return o.op == "load" or any(loads(a, seen) for a in o.args)

    for o in ops:
        if o.op == "indirect" and loads(o.args[0], set()):
            return ("an index read from memory inside a fused kernel (data-dependent indexing); the card's "
                    "gathers take embedding, index_select, x[idx] with one index tensor and torch.gather")
    return None


def mark_unlowered(error: LoweringError) -> bool:
    """A kernel spec or program could not be made (at code generation): mark the FX nodes of the
    scheduler node(s) that failed as fallback kernels for the compile's next attempt. True if any was
    marked."""
    from . import eager

    nodes = getattr(error, "failed_nodes", None) or [getattr(error, "failed_node", None)]
    if nodes == [None] or eager.compiling() or isinstance(error, (UnsupportedDtypeError, DynamicShapeError)):
        return False
    marked = False
    for node in nodes:
        for origin in getattr(node.node, "origins", None) or ():
            if origin.op == "call_function" and isinstance(origin.target, OpOverload):
                torch_inductor.mark_fallback(origin, str(error))
                marked = True
    return marked


def check_generates(spec: Any, nodes: list, stick_dim: Any) -> None:
    """Raise a ``LoweringError`` for a fused pointwise/reduction kernel whose program cannot be generated
    for the placements the compiled graph will most likely bind: each buffer in the layout the wrapper
    allocates it in (``stick_dim(name)``: the layout plan's sticked dim, else None for the default
    layout of its size and strides): the generator's ``LoweringError`` or ``CodegenError``, naming the
    scheduler ``nodes`` (``failed_nodes``) for :func:`mark_unlowered`. Whole-op kernels (matmul,
    attention, ...) have their own fit checks and are not generated here; nor are symbolic kernels,
    kernels reading a buffer at a storage offset (its allocation is not known) or the eager path's
    one-op compiles (their refusal sends the op to the host)."""
    from ..card.layout import StickLayout
    from ..device import cards, tensor
    from . import eager
    from .access import CodegenError, TensorView
    from .kernel_runtime import check_program

    if spec.generator or spec.symbols or eager.compiling() or any(b.offset for b in spec.buffers) \
            or any(0 in b.size for b in spec.buffers):
        return
    places = {}
    for b in spec.buffers:
        layout = tensor.layout_for(b.size, b.stride, torch_dtype(b.dtype))
        stick = stick_dim(b.name)
        if stick is not None:
            layout = StickLayout(layout.host_shape, stick, layout.device_dtype)
        places[b.name] = TensorView.whole(b.name, layout, 0)
    try:
        check_program(spec, places, cards.config())  # kept for the kernel's first call
    except (LoweringError, CodegenError) as e:
        if isinstance(e, (UnsupportedDtypeError, DynamicShapeError)):
            raise
        err = (type(e) if isinstance(e, LoweringError) else LoweringError)(
            f"{e} (its program, made at compile time to check it)")
        err.failed_nodes = list(nodes)
        raise err from None
    except Exception:  # noqa: BLE001 - placements guessed wrong are not the kernel's failure: the run decides
        return


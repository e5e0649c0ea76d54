"""The wrapper codegen: the Python module Inductor generates for a spyre graph.

The generated module reads like this::

    # kernel spyre_add_mul_0: pointwise over x=[128, 256]; from aten.add.Tensor, aten.mul.Tensor
    #   at model.py:12 in forward: y = (x + 1) * w
    spyre_add_mul_0 = SpyreKernel.load('/tmp/torchinductor_u/xy/cxy....json')
    ...
    def call(args):
        arg0_1, arg1_1 = args
        buf0 = empty_spyre((128, 256), (256, 1), torch.float16, 0)  # sticks on dim 1
        spyre_add_mul_0.run(arg0_1=arg0_1, arg1_1=arg1_1, buf0=buf0)
        return (buf0, )

Here: :class:`SpyreWrapperCodegen` (made by :func:`_make_wrapper_class`, registered with Inductor by
``backend.register``), which writes that module: kernels defined from their specs, spyre buffers allocated
with their stick layouts (and the graph's layout plan, ``layout_plan.py``), dead buffers reused only with
the same stick layout, host fallbacks counted, shape symbols checked to be bound.

The objects the generated module calls live in ``kernel_runtime.py`` (:class:`SpyreKernel`,
:func:`empty_spyre`, :func:`note_host_fallback`, the shape-cache and host-fallback counters); this module
re-exports them, and the generated code imports them from here.
"""

from __future__ import annotations

from typing import Any

import sympy

from .._torch import inductor as torch_inductor
from .generators import GENERATORS, register_builtin_generators, register_generator  # noqa: F401
from .kernel_ir import KernelSpec
from .kernel_runtime import (  # noqa: F401 - what generated code and callers use from ``wrapper``
    DEFAULT_SHAPE_CACHE_SIZE,
    SHAPE_CACHE_ENV,
    SpyreKernel,
    empty_spyre,
    host_fallback_stats,
    note_compile_fallback,
    note_host_fallback,
    reset_compile_fallback_warnings,
    reset_host_fallback_stats,
    reset_shape_cache_stats,
    shape_cache_size,
    shape_cache_stats,
)


# ---------------------------------------------------------------------------------------------
# Inductor side (codegen)
# ---------------------------------------------------------------------------------------------
def _make_wrapper_class():
    PythonWrapperCodegen = torch_inductor.PythonWrapperCodegenBase

    class SpyreWrapperCodegen(PythonWrapperCodegen):
        """Python wrapper for spyre graphs: spyre buffers with their layouts, kernels prepared once."""

        def __init__(self):
            super().__init__()
            self._spyre_kernel_names: set[str] = set()
            self._spyre_imports = False

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return PythonWrapperCodegen.create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures)
            return SpyreWrapperCodegen()

        def write_header(self) -> None:
            super().write_header()
            self.imports.splice(
                """
                from torch_spyre.compiler.wrapper import SpyreKernel, empty_spyre, note_compile_fallback, note_host_fallback
                """,
                strip=True,
            )

        # --- kernels ------------------------------------------------------------------------------
        def next_spyre_kernel_name(self, nodes) -> str:
            try:
                base = torch_inductor.fused_kernel_name(nodes, "original_aten")
            except Exception:  # noqa: BLE001 - a name is cosmetic
                base = "fused"
            base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in base)[:48].strip("_") or "kernel"
            i = len(self._spyre_kernel_names)
            name = f"spyre_{base}_{i}"
            self._spyre_kernel_names.add(name)
            return name

        def next_spyre_kernel_name_for(self, base: str) -> str:
            name = f"spyre_{base}_{len(self._spyre_kernel_names)}"
            self._spyre_kernel_names.add(name)
            return name

        def define_spyre_kernel(self, spec: KernelSpec) -> None:
            path = torch_inductor.write_cache_file(spec.to_json(), "json")
            ops = ", ".join(spec.source_ops) or "?"
            if spec.generator:
                shapes = ", ".join(f"{b.name}{b.size}" for b in spec.buffers)
                what = f"{spec.generator} ({spec.params.get('kind', spec.generator)}: {shapes})"
            else:
                what = f"{spec.kind} over x={spec.x_sizes} r={spec.r_sizes}"
            if spec.symbols:
                what += f", symbolic in {', '.join(spec.symbols)}"
            self.header.writeline(f"# kernel {spec.name}: {what}; from {ops}")
            for line in spec.source_lines[:3]:
                self.header.writeline(f"#   at {line}")
            self.header.writeline(f"{spec.name} = SpyreKernel.load({path!r})")

        def call_spyre_kernel(self, spec: KernelSpec, refs: dict[str, str] | None = None) -> None:
            """``spec.run(buffer=ref, ..., s27=s27)``: ``refs`` are the buffers' expressions (default: their
            names); every shape symbol of the spec is passed from the ``call`` function's locals."""
            refs = refs if refs is not None else {b.name: b.name for b in spec.buffers}
            _check_symbols_bound(spec)
            args = [f"{name}={ref}" for name, ref in refs.items()] + [f"{s}={s}" for s in spec.symbols]
            self.writeline(f"{spec.name}.run({', '.join(args)})")

        # --- the layout plan (layout_plan.py) ------------------------------------------------------
        @property
        def layout_plan(self):
            """The graph's layout plan, made once from the graph's operations (they all exist when the
            wrapper is created; its prefix is written then)."""
            plan = getattr(self, "_layout_plan", None)
            if plan is None:
                plan = self._layout_plan = _graph_layout_plan()
            return plan

        def codegen_inputs(self):
            """After Inductor's input handling: relayout the weights the plan names, once (later calls
            only check), and record the plan for ``TORCH_SPYRE_DEBUG``."""
            super().codegen_inputs()
            plan = self.layout_plan
            if not plan.choices and not plan.notes:
                return
            import hashlib

            text = plan.to_json()
            name = "spyre_layout_plan_" + hashlib.sha256(text.encode()).hexdigest()[:12]
            self.imports.writeline("from torch_spyre.compiler.layout_plan import ensure_weight_layout, note_plan, "
                                   "relayout_buffer")
            self.header.writeline(f"note_plan({name!r}, {text!r})  # the graph's layout plan")
            for c in plan.weights():
                self.prefix.writeline(f"ensure_weight_layout({c.buffer}, {c.stick_dim}, {tuple(c.host_shape)}, "
                                      f"{c.reason!r})")

        # --- allocation with layouts -------------------------------------------------------------
        def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
            if device.type != "spyre":
                return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
            if allocation_shape is not None and tuple(allocation_shape) != tuple(shape):
                return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
            size_t = self.codegen_python_shape_tuple(shape)
            stride_t = self.codegen_python_shape_tuple(stride)
            stick = self.layout_plan.stick_dim(name)
            if stick is not None:
                why = self.layout_plan.choices[name].reason
                line = (f"{name} = empty_spyre({size_t}, {stride_t}, {dtype}, {device.index or 0}, "
                        f"stick_dim={stick})  # {why}")
            else:
                comment = _layout_comment(shape, stride, dtype)
                line = f"{name} = empty_spyre({size_t}, {stride_t}, {dtype}, {device.index or 0}){comment}"
            return "; ".join([*self._relayouts_before(name), line]) if self.layout_plan.relayouts_before(name) else line

        def _relayouts_before(self, name: str) -> list[str]:
            """The relayout kernels the plan runs right before the kernel writing ``name`` (its producers
            have run by the time that kernel's output is allocated); the relayouted tensor takes the
            buffer's name, so every later kernel reads it."""
            return [f"{c.buffer} = relayout_buffer({c.buffer}, {c.stick_dim})"
                    for c in self.layout_plan.relayouts_before(name)]

        def make_buffer_reuse(self, old, new, delete_old: bool):
            """Inductor reuses a dead buffer of the same byte size; on the card that is only right when the
            stick layout is the same too (a generator is given the allocation's layout, and a matmul wants
            its operands' sticks where they belong). Otherwise: free the old one, allocate the new one."""
            device = new.get_device()
            plan = self.layout_plan
            keep = plan.reusable(old.get_name()) and plan.reusable(new.get_name())
            if device is None or device.type != "spyre" or (keep and _same_stick_layout(old, new, plan)):
                return super().make_buffer_reuse(old, new, delete_old)
            alloc = self.make_allocation(new.get_name(), device, new.get_dtype(), new.get_size(), new.get_stride())
            if delete_old and old.get_name() not in torch_inductor.current_graph().get_output_names():
                return f"{self.make_buffer_free(old)}; {alloc}"
            return alloc

        # --- host fallbacks are counted ------------------------------------------------------------
        def _note_fallback(self, node: Any) -> None:
            name = (getattr(node, "python_kernel_name", None) or
                    (node.get_kernel_name() if hasattr(node, "get_kernel_name") else type(node).__name__))
            if not _is_spyre_node(node):
                return
            fallback = torch_inductor.fallback_reason_of(node)
            if fallback is not None:  # an op the compiler could not lower: the eager op (fallback.py)
                op, reason = fallback
                self.writeline(f"note_compile_fallback({op!r}, {reason!r})")
            else:
                self.writeline(f"note_host_fallback({str(name)!r})")

        def generate_fallback_kernel(self, node) -> None:
            self._note_fallback(node)
            super().generate_fallback_kernel(node)

        def generate_extern_kernel_alloc(self, node) -> None:
            self._note_fallback(node)
            super().generate_extern_kernel_alloc(node)

        def generate_extern_kernel_out(self, node) -> None:
            self._note_fallback(node)
            super().generate_extern_kernel_out(node)

        def generate_extern_kernel_multi_out(self, node) -> None:
            self._note_fallback(node)
            super().generate_extern_kernel_multi_out(node)

        def generate_scatter_fallback(self, node) -> None:
            self._note_fallback(node)
            super().generate_scatter_fallback(node)

        def generate_index_put_fallback(self, node) -> None:
            self._note_fallback(node)
            super().generate_index_put_fallback(node)

    return SpyreWrapperCodegen


def _is_spyre_node(node: Any) -> bool:
    try:
        dev = node.get_device()
    except Exception:  # noqa: BLE001
        return True
    return dev is None or dev.type == "spyre"


def _check_symbols_bound(spec: KernelSpec) -> None:
    """Every shape symbol a kernel needs must be a local of the wrapper's ``call``: Inductor binds the
    symbols of the graph inputs' sizes and strides (and SymInt inputs) there, and unbacked ``u<n>`` where
    they are computed. Inputs that are not tensors (an opaque object such as vLLM's layer names, a
    ScriptObject, a generator) have no size and bind nothing."""
    bound = {s for s in spec.symbols if s.startswith("u")}
    for value in torch_inductor.current_graph().graph_inputs.values():
        if isinstance(value, sympy.Expr):
            bound |= {str(x) for x in value.free_symbols}
            continue
        size = value.maybe_get_size() if hasattr(value, "maybe_get_size") else None
        if size is None:
            continue
        for e in [*size, *(value.maybe_get_stride() or ())]:
            bound |= {str(x) for x in sympy.sympify(e).free_symbols}
    missing = [s for s in spec.symbols if s not in bound]
    if missing:
        from .kernel_ir import DynamicShapeError

        raise DynamicShapeError(f"kernel {spec.name} needs shape symbols {missing}, which no graph input's size "
                                "binds in the wrapper; mark that dim static (torch._dynamo.mark_static) or "
                                "compile with dynamic=False")


def _is_static(values) -> bool:
    return all(isinstance(v, int) or getattr(v, "is_number", False) for v in values)


def _same_stick_layout(old: Any, new: Any, plan: Any = None) -> bool:
    """Whether two buffers get the same stick layout (the default one, or the layout plan's stick dim)."""
    from ..card.layout import StickLayout
    from ..device import tensor

    old_size, old_stride, new_size, new_stride = old.get_size(), old.get_stride(), new.get_size(), new.get_stride()
    if not _is_static([*old_size, *old_stride, *new_size, *new_stride]):
        # The layouts would have to agree for every value of the symbols: only the same view is sure to.
        return (old.get_dtype() == new.get_dtype() and list(old_size) == list(new_size)
                and list(old_stride) == list(new_stride))
    try:
        def layout(b, size, stride):
            base = tensor.layout_for([int(x) for x in size], [int(x) for x in stride], b.get_dtype())
            stick = plan.stick_dim(b.get_name()) if plan is not None else None
            return base if stick is None else StickLayout(base.host_shape, stick, base.device_dtype)

        return layout(old, old_size, old_stride) == layout(new, new_size, new_stride)
    except Exception:  # noqa: BLE001 - a layout this cannot compute: do not reuse
        return False


def _graph_layout_plan():
    """The layout plan of the graph being compiled (``V.graph``): its whole-op kernels' operands, who
    produces each buffer, which inputs are weights (AOTAutograd's static inputs: parameters and buffers
    of the module). Buffers and operands with symbolic sizes or no geometry of their own (a multi-output
    kernel's node) are left out and keep the default layouts; the plan covers the rest. (A MoE router's topk
    in a graph used to leave the whole graph without a plan: GraniteMoeHybrid's Mamba mixer then wrote a
    bmm's B operand sticked on its batch dim, which the matmul refuses.)"""
    from . import layout_plan as lp

    try:
        buffers, operands = _graph_buffers(), _graph_operands()
    except (TypeError, ValueError, AttributeError, NotImplementedError) as e:  # a node the plan cannot read
        return lp.LayoutPlan(notes=[f"no layout plan: {type(e).__name__}: {e}"])
    graph = torch_inductor.current_graph()
    return lp.plan_layouts(buffers, operands, inference=bool(getattr(graph, "is_inference", False)))


def _static_input_names() -> set[str]:
    names = list(torch_inductor.current_graph().graph_input_names)
    return {names[i] for i in torch_inductor.static_input_indices() if i < len(names)}


def _static_geometry(node: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(size, stride) of a node, or None when they are symbolic or it has none (a kernel with several outputs,
    e.g. topk's values and indices: its MultiOutputLayout has no geometry, each output has its own)."""
    try:
        layout = node.get_layout()
        size, stride = layout.size, layout.stride
    except (NotImplementedError, AttributeError):
        return None
    if not _is_static([*size, *stride]):
        return None
    return tuple(int(x) for x in size), tuple(int(x) for x in stride)


def _graph_buffers() -> list[Any]:
    from ..device.dtypes import device_dtype
    from .layout_plan import BufferInfo

    graph = torch_inductor.current_graph()
    weights = _static_input_names()
    mutated = set(graph.mutated_buffers)
    out = []
    for name, box in graph.graph_inputs.items():
        if torch_inductor.is_tensor_box(box) and _on_spyre(box) and (geometry := _static_geometry(box)):
            out.append(BufferInfo(name, *geometry, "weight" if name in weights else "input",
                                  device_dtype(box.get_dtype()), name in mutated))
    for op in graph.operations:
        if not torch_inductor.is_buffer(op) or not _on_spyre(op) or not (geometry := _static_geometry(op)):
            continue
        generated_here = "pointwise" if torch_inductor.is_computed_buffer(op) else "other"
        producer = getattr(op, "spyre_generator", None) or generated_here
        out.append(BufferInfo(op.get_name(), *geometry, producer, device_dtype(op.get_dtype()),
                              op.get_name() in mutated))
    return out


def _graph_operands() -> list[Any]:
    from .layout_plan import Operand

    out = []
    for op in torch_inductor.current_graph().operations:
        gen = getattr(op, "spyre_generator", None)
        if not gen:
            continue
        kernel = f"the {op.spyre_label} writing {op.get_name()}"
        for role, x in [*zip(op.spyre_roles, op.inputs), ("out", op)]:
            if geometry := _static_geometry(x):
                out.append(Operand(kernel, gen, role, x.get_name(), *geometry))
    return out


def _on_spyre(node: Any) -> bool:
    try:
        dev = node.get_device()
    except Exception:  # noqa: BLE001
        return False
    return dev is not None and dev.type == "spyre"


def _layout_comment(shape, stride, dtype) -> str:
    from ..device import tensor

    try:
        if not _is_static([*shape, *stride]):
            return _symbolic_layout_comment(shape, stride, dtype)
        layout = tensor.layout_for([int(s) for s in shape], [int(s) for s in stride], dtype)
        return f"  # host {list(layout.host_shape)} sticked on dim {layout.stick_dim}, {layout.nbytes} device bytes"
    except Exception:  # noqa: BLE001 - shapes this cannot lay out here (e.g. empty): no comment
        return ""


def _symbolic_layout_comment(shape, stride, dtype) -> str:
    """The layout of a symbolic allocation, worked out on the size hints (the sticked dim is the same for
    every value of the symbols, since it is the unit-stride dim); its byte size depends on the symbols."""
    from ..device import tensor

    hint = torch_inductor.current_graph().sizevars.optimization_hint
    layout = tensor.layout_for([hint(s) for s in shape], [hint(s) for s in stride], dtype)
    order = sorted((i for i, s in enumerate(shape) if hint(s) != 1), key=lambda i: -hint(stride[i]))
    if len(order) == len(layout.host_shape):  # dense: the sizes by decreasing stride
        host = [str(shape[i]) for i in order]
    else:  # a flat layout of the elements the strides reach
        host = [str(sympy.expand(1 + sum((sympy.sympify(n) - 1) * st for n, st in zip(shape, stride))))]
    symbols = sorted({str(x) for e in shape for x in sympy.sympify(e).free_symbols})
    return (f"  # host [{', '.join(map(str, host))}] sticked on dim {layout.stick_dim}, device bytes "
            f"depend on {', '.join(symbols)}")


def __getattr__(name: str) -> Any:
    if name == "SpyreWrapperCodegen":
        cls = _make_wrapper_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)

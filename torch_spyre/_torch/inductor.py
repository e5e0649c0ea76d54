"""The compiler's side of the seam: Inductor, Dynamo, the FX graph cache and fake tensors.

Importing this module is cheap: Inductor is imported on the first call (or the first base class asked
for), so the compiler's modules can import it at their top. What the compiler needs, by what it does for us:

- registering a backend for a device: :func:`register_device_backend`, :func:`register_device_op_overrides`,
  :func:`register_device_interface`, :func:`registered_scheduling`, :func:`registered_wrapper_codegen`,
  :func:`never_trace` (Dynamo skips the device's Python kernels);
- base classes: :data:`SchedulingBase`, :data:`PythonWrapperCodegenBase`, :data:`DeviceInterfaceBase`,
  :data:`DeviceOpOverridesBase`, :data:`ExternKernelOutBase`, :data:`GraphModulePassBase`;
- the graph being compiled and its IR: :func:`current_graph`, :func:`current_fx_node`, :func:`write_into`, :func:`written_into`,
  :func:`recording_ops`, :func:`loop_ops`,
  :func:`realize_input`, :func:`require_contiguous`, :func:`copy_input`, :func:`fixed_layout`,
  :func:`tensor_box`, :func:`to_dtype`, :func:`permute`, :func:`pointwise`, ``is_*`` tests of IR nodes;
- the scheduler: :func:`is_fusable_node`, :func:`is_foreach_node`, :func:`ranges_compatible`,
  :func:`size_product`, :func:`ordered_set`, :func:`reduce_to_single_element`;
- the generated wrapper: :func:`write_cache_file`, :func:`fused_kernel_name`, :func:`static_input_indices`;
- shape symbols and index expressions: :func:`is_shape_symbol`, ``index_functions`` (Inductor's sympy
  functions: ``FloorDiv``, ``ModularIndexing``, ...);
- compiling one graph outside ``torch.compile``: :func:`fake_tensor_mode`, :func:`compile_graph`,
  :func:`disable_fx_graph_cache`; :func:`graph_compile_in_progress` (not while another compiles);
- ops the card cannot lower run as fallback kernels (the eager op): :func:`guard_lowerings`,
  :func:`retry_compile_after_fallbacks`, :func:`mark_fallback`, :func:`fallback_reason_of`, ``ir_kind``.

The patches of torch's global state the compiler makes (docs/architecture.md, "Patches of torch's
global state"): :func:`register_lowering` (Inductor's lowerings table),
:func:`keep_device_constants_unfolded` (joint-graph constant folding),
:func:`keep_device_out_of_combo_kernels` (the scheduler's grouping of combo kernels),
:func:`guard_lowerings` (``GraphLowering.call_function``) and :func:`retry_compile_after_fallbacks` (the
in-process compile of one FX graph).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable

# Every private torch symbol this module uses ("module:attribute.path"); tests/test_torch_seam.py
# imports each one.
PRIVATE_SYMBOLS = [
    "torch._inductor.codegen.common:register_backend_for_device",
    "torch._inductor.codegen.common:register_device_op_overrides",
    "torch._inductor.codegen.common:get_scheduling_for_device",
    "torch._inductor.codegen.common:get_wrapper_codegen_for_device",
    "torch._inductor.codegen.common:DeviceOpOverrides",
    "torch._inductor.codegen.common:BackendFeature.REDUCE_TO_SINGLE_ELEMENT",
    "torch._inductor.codegen.simd:SIMDKernel.is_compatible",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen.create",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen.make_allocation",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen.make_buffer_reuse",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen.codegen_inputs",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen.generate_fallback_kernel",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen.generate_extern_kernel_out",
    "torch._inductor.scheduler:BaseScheduling",
    "torch._inductor.scheduler:SchedulerNode",
    "torch._inductor.scheduler:FusedSchedulerNode",
    "torch._inductor.scheduler:ForeachKernelSchedulerNode",
    "torch._inductor.scheduler:ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels",
    "torch._inductor.scheduler:ForeachKernelSchedulerNode.set_group_algorithm_for_combo_kernels",
    "torch._inductor.ir:IRNode",
    "torch._inductor.ir:ExternKernel.realize_input",
    "torch._inductor.ir:ExternKernel.require_contiguous",
    "torch._inductor.ir:ExternKernel.copy_input",
    "torch._inductor.ir:ExternKernelOut",
    "torch._inductor.ir:FixedLayout",
    "torch._inductor.ir:TensorBox.create",
    "torch._inductor.ir:ReinterpretView",
    "torch._inductor.ir:Buffer",
    "torch._inductor.ir:ComputedBuffer",
    "torch._inductor.ir:Pointwise.create",
    "torch._inductor.lowering:lowerings",
    "torch._inductor.lowering:to_dtype",
    "torch._inductor.lowering:permute",
    "torch._inductor.virtualized:V.graph",
    "torch._inductor.virtualized:V.set_ops_handler",
    "torch._inductor.virtualized:ops",
    "torch._inductor.utils:sympy_product",
    "torch._inductor.utils:get_fused_kernel_name",
    "torch._inductor.codecache:write",
    "torch._inductor.custom_graph_pass:CustomGraphModulePass",
    "torch._inductor.fx_passes.joint_graph:constant_fold_uniform_value",
    "torch._inductor.fx_passes.joint_graph:lazy_init",
    "torch._inductor.compile_fx:compile_fx",
    "torch._inductor.config:fx_graph_cache",
    "torch._inductor.graph:GraphLowering.call_function",
    "torch._ops:OpOverload",
    "torch._inductor.compile_fx:_InProcessFxCompile.codegen_and_compile",
    "torch._inductor.ir:Pointwise",
    "torch._inductor.ir:Reduction",
    "torch._inductor.ir:Scatter",
    "torch._inductor.ir:StorageBox",
    "torch._inductor.ir:MutationLayoutSHOULDREMOVE",
    "torch._inductor.ir:TensorBox",
    "torch._dynamo.device_interface:DeviceInterface",
    "torch._dynamo.device_interface:register_interface_for_device",
    "torch._dynamo.types:FrameAction.SKIP",
    "torch._dynamo.types:FrameExecStrategy",
    "torch._C._dynamo.eval_frame:set_code_exec_strategy",
    "torch._guards:TracingContext.try_get",
    "torch._subclasses.fake_tensor:FakeTensorMode",
    "torch.utils._ordered_set:OrderedSet",
    "torch.utils._sympy.symbol:SymT.SIZE",
    "torch.utils._sympy.symbol:SymT.UNBACKED_INT",
    "torch.utils._sympy.symbol:symbol_is_type",
    "torch.utils._sympy:functions",
]


_modules: dict[str, Any] = {}


def _module(name: str) -> Any:
    module = _modules.get(name)
    if module is None:
        module = _modules[name] = importlib.import_module(name)
    return module


def _ir() -> Any:
    return _module("torch._inductor.ir")


def _lowering() -> Any:
    return _module("torch._inductor.lowering")


def _V() -> Any:
    return _module("torch._inductor.virtualized").V


# --- base classes (resolved on first use: ``inductor.SchedulingBase``) -------------------------------
_BASES = {
    "SchedulingBase": ("torch._inductor.scheduler", "BaseScheduling"),
    "PythonWrapperCodegenBase": ("torch._inductor.codegen.wrapper", "PythonWrapperCodegen"),
    "DeviceInterfaceBase": ("torch._dynamo.device_interface", "DeviceInterface"),
    "DeviceOpOverridesBase": ("torch._inductor.codegen.common", "DeviceOpOverrides"),
    "ExternKernelOutBase": ("torch._inductor.ir", "ExternKernelOut"),
    "GraphModulePassBase": ("torch._inductor.custom_graph_pass", "CustomGraphModulePass"),
}
_LAZY = {
    # Inductor's sympy functions of index expressions (FloorDiv, ModularIndexing, ...): a module.
    "index_functions": ("torch.utils._sympy.functions", None),  # imported here: not loaded until Inductor is
}


def __getattr__(name: str) -> Any:
    where = _BASES.get(name) or _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _module(where[0]) if where[1] is None else getattr(_module(where[0]), where[1])
    globals()[name] = value
    return value


# --- registering a backend for a device -------------------------------------------------------------
def register_device_backend(device: str, scheduling: Any, wrapper_codegen: Any, custom_pass: Any = None) -> None:
    """Inductor generates code for ``device`` with this scheduling and Python wrapper codegen; the
    custom pass's ``uuid()`` is part of the FX graph cache key of every graph."""
    common = _module("torch._inductor.codegen.common")
    common.register_backend_for_device(device, scheduling, wrapper_codegen, device_custom_pass=custom_pass)


def register_device_op_overrides(device: str, overrides: Any) -> None:
    """The code the wrapper writes for ``device``'s streams, guards and synchronization."""
    _module("torch._inductor.codegen.common").register_device_op_overrides(device, overrides)


def register_device_interface(device: str, interface: Any) -> None:
    """What Dynamo and Inductor ask about ``device`` (properties, streams, current device)."""
    _module("torch._dynamo.device_interface").register_interface_for_device(device, interface)


def registered_scheduling(device: str) -> Any:
    return _module("torch._inductor.codegen.common").get_scheduling_for_device(device)


def registered_wrapper_codegen(device: str) -> Any:
    return _module("torch._inductor.codegen.common").get_wrapper_codegen_for_device(device)


def never_trace(codes: Iterable[Any]) -> None:
    """Dynamo never traces these code objects, nor anything they call (they run as plain Python)."""
    set_code_exec_strategy = _module("torch._C._dynamo.eval_frame").set_code_exec_strategy
    types = _module("torch._dynamo.types")
    for code in codes:
        set_code_exec_strategy(code, types.FrameExecStrategy(types.FrameAction.SKIP, types.FrameAction.SKIP))


# --- patches of global state ----------------------------------------------------------------------
def lowering_for(op: Any) -> Callable[..., Any] | None:
    """Inductor's lowering of an ATen op (None if it has none)."""
    return _lowering().lowerings.get(op)


def register_lowering(op: Any, fn: Callable[..., Any]) -> None:
    """Patch: ``fn`` lowers ``op`` in Inductor's global lowerings table (for every device: ``fn`` must
    hand other devices' tensors to the lowering it replaces, :func:`lowering_for`)."""
    _lowering().lowerings[op] = fn


def trace_patterns_on_host(device_type: str) -> None:
    """Patch: Inductor's joint-graph ``lazy_init(input_device)`` traces its replacement patterns (SDPA,
    pad_mm, misc) once per process and device, with example tensors on the graph's device; for
    ``device_type`` it traces them on the CPU instead (the patterns are ATen graphs, the same for any
    device)."""
    joint_graph = _module("torch._inductor.fx_passes.joint_graph")
    original = joint_graph.lazy_init
    if getattr(original, "_spyre_guard", False):
        return

    def lazy_init(input_device=None, *args, **kwargs):
        import torch

        if input_device is not None and torch.device(input_device).type == device_type:
            input_device = torch.device("cpu")
        return original(input_device, *args, **kwargs)

    lazy_init._spyre_guard = True
    joint_graph.lazy_init = lazy_init


def keep_device_constants_unfolded(on_device: Callable[[Any], bool]) -> None:
    """Patch: Inductor's joint-graph ``constant_fold_uniform_value`` pass skips graphs for which
    ``on_device(gm)`` is true (it would run foldable ops on real tensors of the graph's device)."""
    joint_graph = _module("torch._inductor.fx_passes.joint_graph")
    original = joint_graph.constant_fold_uniform_value
    if getattr(original, "_spyre_guard", False):
        return

    def constant_fold_uniform_value(gm):
        if on_device(gm):
            return None
        return original(gm)

    constant_fold_uniform_value._spyre_guard = True
    joint_graph.constant_fold_uniform_value = constant_fold_uniform_value


def keep_device_out_of_combo_kernels(device: str) -> None:
    """Patch: Inductor's grouping of nodes into combo kernels (``config.combo_kernels``, which vLLM turns on
    for every platform but the CPU) leaves out the nodes on ``device``, as Inductor itself leaves out the
    CPU's and MPS's. A combo kernel is a ``ForeachKernelSchedulerNode`` that only Triton (SIMD)
    schedulings can generate or benchmark: the scheduler asserts on any other backend. The grouping
    algorithm is the scheduler's hook for this (``set_group_algorithm_for_combo_kernels``); the one in
    place is wrapped, so other devices group as before."""
    foreach = _module("torch._inductor.scheduler").ForeachKernelSchedulerNode
    original = foreach.group_algorithm_for_combo_kernels
    if getattr(original, "_spyre_guard", False):
        return

    def group_nodes_for_combo_kernels(scheduler):
        groups = []
        for group in original(scheduler):
            kept = [n for n in group if getattr(n.get_device(), "type", None) != device]
            if kept:
                groups.append(kept)
        return groups

    group_nodes_for_combo_kernels._spyre_guard = True
    foreach.set_group_algorithm_for_combo_kernels(group_nodes_for_combo_kernels)


# --- the graph being compiled -----------------------------------------------------------------------
def current_graph() -> Any:
    """The ``GraphLowering`` being compiled (``V.graph``): sizevars, buffers, inputs, wrapper code."""
    return _V().graph


def lowering_origin() -> str | None:
    """The name of the aten op the FX node being lowered was before Inductor's decompositions (its
    ``original_aten``: ``"aten.index_select.default"`` for the ``aten.index`` Inductor decomposes it into),
    or None. A name, not the op: the recorded OpOverload is not always the object ``torch.ops`` gives."""
    node = getattr(_V().graph, "current_node", None)
    op = None if node is None else node.meta.get("original_aten")
    return None if op is None else str(op)


def current_fx_node() -> Any:
    """The FX node being lowered (``V.graph.current_node``), or None."""
    return getattr(_V().graph, "current_node", None)


def write_into(node: Any, dst: Any) -> None:
    """Make the buffer ``node`` (an extern kernel's output) be the storage of ``dst`` (a graph input's
    StorageBox): the kernel writes straight into it, and Inductor records the write as a mutation of ``dst``
    (``MutationLayoutSHOULDREMOVE``; no buffer is allocated for ``node``)."""
    node.layout = _ir().MutationLayoutSHOULDREMOVE(dst)


def written_into(node: Any) -> Any:
    """The buffer a node made by :func:`write_into` writes, or None."""
    layout = getattr(node, "layout", None)
    return layout.get_buffer() if isinstance(layout, _ir().MutationLayoutSHOULDREMOVE) else None


def recording_ops(handler: Any) -> Any:
    """Context manager: the loop body's ``ops.*`` calls go to ``handler`` (``V.set_ops_handler``)."""
    return _V().set_ops_handler(handler)


def loop_ops() -> Any:
    """The ``ops`` proxy that loop bodies (``inner_fn``) call: ``ops.add``, ``ops.masked``, ..."""
    return _module("torch._inductor.virtualized").ops


def is_ir_node(x: Any) -> bool:
    return isinstance(x, _ir().IRNode)


def is_reinterpret_view(x: Any) -> bool:
    """A view of a buffer with its own size/stride/offset (a permute, slice or reshape of it)."""
    return isinstance(x, _ir().ReinterpretView)


def is_tensor_box(x: Any) -> bool:
    return isinstance(x, _ir().TensorBox)


def is_buffer(x: Any) -> bool:
    return isinstance(x, _ir().Buffer)


def is_computed_buffer(x: Any) -> bool:
    """A buffer computed by a loop body (a pointwise/reduction kernel), not an extern kernel."""
    return isinstance(x, _ir().ComputedBuffer)


def has_flexible_layout(x: Any) -> bool:
    """A buffer whose strides Inductor may still choose (it freezes them later, e.g. in the order of
    what the buffer's kernel reads): what a reader sees now is not what it will get."""
    try:
        return isinstance(x.get_layout(), _ir().FlexibleLayout)
    except (AttributeError, NotImplementedError):
        return False


def realize_input(x: Any) -> Any:
    return _ir().ExternKernel.realize_input(x)


def require_contiguous(x: Any) -> Any:
    return _ir().ExternKernel.require_contiguous(x)


def copy_input(x: Any) -> Any:
    return _ir().ExternKernel.copy_input(x)


def fixed_layout(device: Any, dtype: Any, size: list, stride: list) -> Any:
    return _ir().FixedLayout(device, dtype, size, stride)


def tensor_box(node: Any) -> Any:
    """The value a lowering returns for an IR node."""
    return _ir().TensorBox.create(node)


def to_dtype(x: Any, dtype: Any) -> Any:
    return _lowering().to_dtype(x, dtype)


def permute(x: Any, dims: list[int]) -> Any:
    return _lowering().permute(x, dims)


def pointwise(device: Any, dtype: Any, inner_fn: Callable[..., Any], ranges: list) -> Any:
    """A pointwise IR node computing ``inner_fn(index)`` over ``ranges``."""
    return _ir().Pointwise.create(device=device, dtype=dtype, inner_fn=inner_fn, ranges=ranges)


# --- the scheduler -------------------------------------------------------------------------------------
def is_fusable_node(node: Any) -> bool:
    """A scheduler node of loop bodies (one, or fused): what a scheduling's ``codegen_node`` receives."""
    sched = _module("torch._inductor.scheduler")
    return isinstance(node, (sched.SchedulerNode, sched.FusedSchedulerNode))


def is_foreach_node(node: Any) -> bool:
    return isinstance(node, _module("torch._inductor.scheduler").ForeachKernelSchedulerNode)


def ranges_compatible(groups: Any, ranges: Any) -> bool:
    """Whether a node's iteration ranges fit a kernel's (numel, rnumel) groups."""
    return _module("torch._inductor.codegen.simd").SIMDKernel.is_compatible(groups, ranges)


def size_product(sizes: Any) -> Any:
    return _module("torch._inductor.utils").sympy_product(sizes)


def ordered_set(items: Iterable[Any] = ()) -> Any:
    """Inductor's ``OrderedSet`` (what its scheduler APIs take and return)."""
    return _module("torch.utils._ordered_set").OrderedSet(items)


def reduce_to_single_element() -> Any:
    """The backend features of a device whose reductions stay one kernel (no split reductions)."""
    common = _module("torch._inductor.codegen.common")
    return ordered_set([common.BackendFeature.REDUCE_TO_SINGLE_ELEMENT])


# --- the generated wrapper ---------------------------------------------------------------------------
def write_cache_file(text: str, extension: str) -> str:
    """Write ``text`` into Inductor's code cache; returns the file's path."""
    _, path = _module("torch._inductor.codecache").write(text, extension)
    return path


def fused_kernel_name(nodes: Any, policy: str) -> str:
    return _module("torch._inductor.utils").get_fused_kernel_name(nodes, policy)


def static_input_indices() -> tuple[int, ...]:
    """Indices of the graph inputs AOTAutograd marks static (a module's parameters and buffers)."""
    ctx = _module("torch._guards").TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return tuple(getattr(meta, "static_input_indices", None) or ())


# --- shape symbols --------------------------------------------------------------------------------------
def is_shape_symbol(symbol: Any) -> bool:
    """An Inductor size symbol the wrapper binds at run time: ``s<n>`` (from inputs) or ``u<n>`` (unbacked)."""
    sym = _module("torch.utils._sympy.symbol")
    return sym.symbol_is_type(symbol, (sym.SymT.SIZE, sym.SymT.UNBACKED_INT))


# --- compiling one graph ------------------------------------------------------------------------------
def fake_tensor_mode() -> Any:
    """A fresh ``FakeTensorMode`` (tensors with metadata and no data)."""
    return _module("torch._subclasses.fake_tensor").FakeTensorMode()


def graph_compile_in_progress() -> bool:
    """Whether this thread is inside ``torch.compile``'s compilation of a graph (Dynamo, AOTAutograd,
    Inductor: a ``TracingContext`` is set). Inductor cannot compile another graph from in there (its
    per-compile state, e.g. the Triton bundler, asserts), yet it runs eager ops on real tensors there,
    e.g. to print a graph's tensor constants into its repro string."""
    return _module("torch._guards").TracingContext.try_get() is not None


def compile_graph(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Compile an FX graph with Inductor (what ``torch.compile`` does per graph)."""
    return _module("torch._inductor.compile_fx").compile_fx(gm, example_inputs)


def disable_fx_graph_cache() -> None:
    """Inductor recompiles every graph instead of serving it from its FX graph cache."""
    _module("torch._inductor.config").fx_graph_cache = False


# --- ops the card cannot lower: fallback kernels ------------------------------------------------------
# An FX node whose meta holds FALLBACK_KEY (the reason) is lowered by Inductor as a fallback kernel (the
# ATen op called on the graph's tensors): Inductor's own ``should_fallback`` meta does that.
FALLBACK_KEY = "spyre_fallback"


def mark_fallback(node: Any, reason: str) -> None:
    """From now on ``node`` (an FX node of the graph being lowered) lowers to a fallback kernel."""
    node.meta[FALLBACK_KEY] = reason
    node.meta["should_fallback"] = True


def fallback_reason_of(ir_node: Any) -> tuple[str, str] | None:
    """``(op name, reason)`` if an IR node is a fallback kernel made for a node :func:`mark_fallback`
    marked, else None."""
    for origin in getattr(ir_node, "origins", None) or ():
        reason = getattr(origin, "meta", {}).get(FALLBACK_KEY)
        if reason is not None:
            return str(origin.target), reason
    return None


def _marked(gm: Any) -> int:
    return sum(1 for n in gm.graph.nodes if FALLBACK_KEY in n.meta)


def guard_lowerings(check: Callable[[Any, Any, list], tuple[str, bool] | None]) -> None:
    """Patch ``GraphLowering.call_function`` (one call per FX node): after Inductor lowers an op,
    ``check(target, out, new_operations)`` may refuse it, returning ``(reason, undoable)``. An undoable
    refusal (the lowering only built IR that nothing registered: a pointwise op) lowers the node again as a
    fallback kernel; otherwise the node is marked and the compile fails, to be retried
    (:func:`retry_compile_after_fallbacks`). ``check`` is asked only about ops on graphs it cares for
    (it returns None for the rest)."""
    graph_cls = _module("torch._inductor.graph").GraphLowering
    original = graph_cls.call_function
    if getattr(original, "_spyre_guard", False):
        graph_cls.call_function._spyre_check = check
        return

    def call_function(self, target, args, kwargs):
        node = getattr(self, "current_node", None)
        op_overload = _module("torch._ops").OpOverload
        if node is None or not isinstance(target, op_overload) or "should_fallback" in node.meta:
            return original(self, target, args, kwargs)
        before = len(self.operations)
        out = original(self, target, args, kwargs)
        refused = call_function._spyre_check(target, out, list(self.operations[before:]))
        if refused is None:
            return out
        reason, undoable = refused
        mark_fallback(node, reason)
        if not undoable:
            raise RuntimeError(f"{target} cannot be lowered for the card ({reason}); the compile is retried "
                               "with it as a fallback kernel")
        return original(self, target, args, kwargs)

    call_function._spyre_guard = True
    call_function._spyre_check = check
    graph_cls.call_function = call_function


def retry_compile_after_fallbacks(max_attempts: int = 64) -> None:
    """Patch the in-process compile of one FX graph: when it fails after marking more nodes as fallbacks
    (:func:`mark_fallback`: by a lowering check, or by the scheduling when a kernel cannot be lowered), the
    graph is compiled again, those nodes now fallback kernels. Each attempt marks at least one more node."""
    compile_fx = _module("torch._inductor.compile_fx")
    cls = compile_fx._InProcessFxCompile
    original = cls.codegen_and_compile
    if getattr(original, "_spyre_retry", False):
        return

    def codegen_and_compile(self, gm, example_inputs, inputs_to_check, graph_kwargs):
        for _ in range(max_attempts):
            marked = _marked(gm)
            try:
                return original(self, gm, example_inputs, inputs_to_check, graph_kwargs)
            except Exception:
                if _marked(gm) <= marked:
                    raise
        return original(self, gm, example_inputs, inputs_to_check, graph_kwargs)

    codegen_and_compile._spyre_retry = True
    cls.codegen_and_compile = codegen_and_compile


def ir_kind(x: Any) -> tuple[str, Any]:
    """What a lowering returned, unwrapped from its TensorBox/StorageBox: ``("pointwise", node)``,
    ``("reduction", node)``, ``("scatter", node)`` for IR not yet realized, ``("computed", buffer)`` for a
    computed buffer, ``("other", x)`` for anything else."""
    ir = _ir()
    while isinstance(x, (ir.TensorBox, ir.StorageBox)):
        x = x.data
    if isinstance(x, ir.ComputedBuffer):
        return "computed", x
    if isinstance(x, ir.Scatter):
        return "scatter", x
    if isinstance(x, ir.Pointwise):
        return "pointwise", x
    if isinstance(x, ir.Reduction):
        return "reduction", x
    return "other", x

"""The wrapper: Inductor's generated Python for a spyre graph, and the runtime objects it calls.

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

:class:`SpyreKernel` holds the kernel's :class:`~torch_spyre.compiler.kernel_ir.KernelSpec`. At its first
call with a given placement of its tensors (their stick layouts and storage offsets) it generates the
program, writes the ``TORCH_SPYRE_DEBUG`` files and prepares it for the card (validation, timing, patch
table); every call then only patches addresses and launches on the current stream.

Dynamic shapes: a symbolic spec (``spec.symbols``, e.g. ``["s27"]``) is called with the symbols'
values (``spyre_softmax_0.run(arg0_1=arg0_1, buf2=buf2, s27=s27)``); the kernel specializes the spec
for those values and generates per (values, placement). Prepared programs are kept in a per-kernel LRU
(``TORCH_SPYRE_SHAPE_CACHE_SIZE``, default 32), so a varying sequence length costs a bounded number of
card programs; :func:`shape_cache_stats` counts specializations, programs and evictions.

Host fallbacks inside compiled graphs (extern kernels Inductor could not lower) are counted:
:func:`host_fallback_stats` must stay empty for supported ops.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from typing import Any, Callable

import sympy
import torch

from .kernel_ir import KernelSpec

# ---------------------------------------------------------------------------------------------
# Runtime side (what generated code calls)
# ---------------------------------------------------------------------------------------------
_fallbacks: Counter[str] = Counter()
_fallback_lock = threading.Lock()


def note_host_fallback(name: str) -> None:
    """Called by generated code right before an op runs on the host inside a compiled graph."""
    with _fallback_lock:
        _fallbacks[name] += 1


def host_fallback_stats() -> dict[str, int]:
    """Op name -> number of host executions inside compiled spyre graphs."""
    with _fallback_lock:
        return dict(_fallbacks)


def reset_host_fallback_stats() -> None:
    with _fallback_lock:
        _fallbacks.clear()


def empty_spyre(size, stride, dtype: torch.dtype, card: int, stick_dim: int | None = None) -> torch.Tensor:
    """A spyre buffer allocated by a compiled graph. ``stick_dim`` (a dim of the dense host shape,
    outermost first) picks the sticked dimension; None keeps the device's default (the unit-stride dim)."""
    from ..card.layout import StickLayout
    from ..device import dtypes, tensor

    layout = None
    if stick_dim is not None:
        base = tensor.layout_for(size, stride, dtype)
        layout = StickLayout(base.host_shape, stick_dim, dtypes.device_dtype(dtype))
    return tensor.empty_strided(size, stride, dtype, card, layout=layout)


# Program generators by KernelSpec.generator ("" = pointwise/reduction). Other generators (matmul,
# attention, gather) register themselves here: fn(spec, places, config) -> Program.
GENERATORS: dict[str, Callable[..., Any]] = {}


def register_generator(name: str, fn: Callable[..., Any]) -> None:
    GENERATORS[name] = fn


def register_builtin_generators() -> None:
    """The whole-op generators this build has: every generator module that defines ``GENERATOR``
    (its name) and ``generate(kspec, places, config)``."""
    for module in ("codegen.matmul", "codegen.attention", "codegen.gather"):
        try:
            mod = __import__(f"torch_spyre.compiler.{module}", fromlist=["generate"])
        except ImportError:
            continue
        name = getattr(mod, "GENERATOR", None)
        if name and hasattr(mod, "generate"):
            GENERATORS.setdefault(name, mod.generate)


def _generator(spec: KernelSpec) -> Callable[..., Any]:
    if not spec.generator:
        from .codegen.pointwise import generate

        return generate
    if spec.generator not in GENERATORS:
        raise RuntimeError(f"kernel {spec.name} needs the {spec.generator!r} program generator, which is not "
                           f"registered (known: {', '.join(GENERATORS) or 'none'})")
    return GENERATORS[spec.generator]


# Whole-op programs by what they compute: the six identical matmuls of six transformer layers are
# planned once (operands are role names, so a program fits every kernel with the same key).
_WHOLE_OP_CACHE: dict[tuple, Any] = {}
_WHOLE_OP_CACHE_SIZE = 512


def _whole_op_program(spec: KernelSpec, places: dict[str, Any], config: Any):
    import json

    from ..program import Program

    key = (spec.generator, json.dumps(spec.params, sort_keys=True, default=str),
           tuple((b.name, b.dtype, tuple(b.size), tuple(b.stride), b.offset) for b in spec.buffers),
           tuple(sorted(places.items(), key=lambda kv: kv[0])), id(config))
    program = _WHOLE_OP_CACHE.get(key)
    if program is None:
        program = _generator(spec)(spec, places, config)
        if len(_WHOLE_OP_CACHE) >= _WHOLE_OP_CACHE_SIZE:
            _WHOLE_OP_CACHE.pop(next(iter(_WHOLE_OP_CACHE)))
        _WHOLE_OP_CACHE[key] = program
    if program.name == spec.name:
        return program
    meta = dict(program.metadata)
    if isinstance(meta.get("decisions"), dict):
        meta["decisions"] = {**meta["decisions"], "kernel": spec.name, "source_ops": list(spec.source_ops),
                             "source_lines": list(spec.source_lines)}
    return Program(spec.name, program.operands, program.cores, meta)


SHAPE_CACHE_ENV = "TORCH_SPYRE_SHAPE_CACHE_SIZE"
DEFAULT_SHAPE_CACHE_SIZE = 32

# Over all kernels: "specializations" (symbolic specs made static for new shape values), "programs"
# (programs generated and prepared), "evictions" (prepared programs dropped by a kernel's LRU), "hits".
_shape_stats: Counter[str] = Counter()


def shape_cache_stats() -> dict[str, int]:
    """Counters of every :class:`SpyreKernel` since the last :func:`reset_shape_cache_stats`."""
    with _fallback_lock:
        return {k: _shape_stats[k] for k in ("specializations", "programs", "evictions", "hits")}


def reset_shape_cache_stats() -> None:
    with _fallback_lock:
        _shape_stats.clear()


def _count(event: str) -> None:
    with _fallback_lock:
        _shape_stats[event] += 1


def shape_cache_size() -> int:
    """Prepared programs a kernel keeps (per shape values and placement), from ``TORCH_SPYRE_SHAPE_CACHE_SIZE``."""
    text = os.environ.get(SHAPE_CACHE_ENV, str(DEFAULT_SHAPE_CACHE_SIZE))
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"{SHAPE_CACHE_ENV}={text!r}: expected a whole number >= 1 (prepared programs kept per "
                         f"kernel; default {DEFAULT_SHAPE_CACHE_SIZE})")
    return size


class SpyreKernel:
    """One compiled kernel: specializes its spec per shape values, generates and prepares its program per
    (values, placement) in a bounded LRU, launches it per call."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.cache_size = shape_cache_size()
        self._prepared: OrderedDict[tuple, Any] = OrderedDict()
        self._specialized: OrderedDict[tuple, KernelSpec] = OrderedDict()
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.last_launch = None

    @classmethod
    def load(cls, path: str) -> "SpyreKernel":
        with open(path) as f:
            return cls(KernelSpec.from_json(f.read()))

    @property
    def name(self) -> str:
        return self.spec.name

    def placements(self, tensors: dict[str, torch.Tensor]):
        from ..device.storage import allocation_of
        from .access import TensorView

        places, allocs, card = {}, {}, None
        for b in self.spec.buffers:
            t = tensors[b.name]
            if t.device.type != "spyre":
                raise RuntimeError(f"kernel {self.name}: buffer {b.name} is on {t.device}, expected a spyre device")
            alloc = allocation_of(t)
            if alloc is None:
                return None, None, None
            c = t.device.index or 0
            if card is not None and c != card:
                raise RuntimeError(f"kernel {self.name}: tensors on spyre:{card} and spyre:{c}; move them to one card")
            card = c
            places[b.name] = TensorView.whole(b.name, alloc.meta["layout"], int(t.storage_offset()))
            allocs[b.name] = alloc
        return places, allocs, card

    def run(self, **args: Any) -> None:
        """``args``: the kernel's buffers by name, and the values of its shape symbols (``s27=...``)."""
        values = self._symbol_values(args)
        args = self._operands_in_walkable_views(args)
        places, allocs, card = self.placements(args)
        if places is None:  # a tensor of no elements: nothing to compute
            return
        key = (values, card, tuple(sorted(places.items(), key=lambda kv: kv[0])))
        with self._lock:
            prepared = self._prepared.get(key)
            if prepared is not None:
                self._prepared.move_to_end(key)
                self._note("hits")
        if prepared is None:
            prepared = self._prepare(places, card, key)
        from ..runtime.launch import launch

        self.last_launch = launch(prepared, allocs)

    def _operands_in_walkable_views(self, args: dict[str, Any]) -> dict[str, Any]:
        """The matmul generator reads each operand as one stride per dim of its allocation. The lowering
        copies views inside the graph that do not (``backend._matmul_operand``), but a graph *input* may
        itself be such a view (``torch.compile(f)(y.view(32, 64))`` with ``y`` allocated [4, 8, 64]):
        only the bound tensor shows it, so a contiguous one is copied here (a device copy, with the same
        strides the kernel's spec expects) before the kernel runs."""
        if self.spec.generator != "matmul":
            return args
        from .eager import walks_allocation_dims

        inputs = {b.name for b in self.spec.buffers if b.role == "input"}

        def copied(name: str, v: Any) -> Any:
            if (name in inputs and isinstance(v, torch.Tensor) and v.device.type == "spyre" and v.is_contiguous()
                    and not walks_allocation_dims(v)):
                return v.clone()
            return v

        return {name: copied(name, v) for name, v in args.items()}

    def _symbol_values(self, args: dict[str, Any]) -> tuple[tuple[str, int], ...]:
        missing = [s for s in self.spec.symbols if s not in args]
        if missing:
            raise TypeError(f"kernel {self.name} is symbolic in {self.spec.symbols} and was called without "
                            f"{missing}; pass their values (the generated wrapper does: {missing[0]}={missing[0]})")
        return tuple((s, int(args[s])) for s in self.spec.symbols)

    def specialized(self, values: dict[str, int]) -> KernelSpec:
        """The static spec for these shape-symbol values (cached alongside the prepared programs)."""
        key = tuple(sorted(values.items()))
        spec = self._specialized.get(key)
        if spec is None:
            spec = self.spec.specialize(values)
            if self.spec.symbols:
                self._note("specializations")
            self._specialized[key] = spec
            while len(self._specialized) > self.cache_size:
                self._specialized.popitem(last=False)
        self._specialized.move_to_end(key)
        return spec

    def program_for(self, places: dict[str, Any], config: Any, values: dict[str, int] | None = None):
        spec = self.specialized(values or {})
        if not spec.generator:
            return _generator(spec)(spec, places, config)
        return _whole_op_program(spec, places, config)

    def _prepare(self, places: dict[str, Any], card: int, key: tuple):
        """Generate and prepare the program for ``key`` = (shape values, card, placements)."""
        from ..device import cards
        from ..runtime.launch import prepare
        from . import debug

        values = dict(key[0])
        with self._lock:
            if key in self._prepared:
                return self._prepared[key]
            c = cards.card(card)
            program = self.program_for(places, c.config, values)
            debug.dump_kernel(self.specialized(values), program)
            prepared = prepare(program, c)
            self._note("programs")
            self._prepared[key] = prepared
            while len(self._prepared) > self.cache_size:
                self._prepared.popitem(last=False)
                self._note("evictions")
            return prepared

    def _note(self, event: str) -> None:
        self.stats[event] += 1
        _count(event)

    def __repr__(self) -> str:
        sym = f", symbolic in {', '.join(self.spec.symbols)}" if self.spec.symbols else ""
        return f"<SpyreKernel {self.name}: {len(self._prepared)} prepared program(s){sym}>"


# ---------------------------------------------------------------------------------------------
# Inductor side (codegen)
# ---------------------------------------------------------------------------------------------
def _make_wrapper_class():
    from torch._inductor import codecache
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

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
                from torch_spyre.compiler.wrapper import SpyreKernel, empty_spyre, note_host_fallback
                """,
                strip=True,
            )

        # --- kernels ------------------------------------------------------------------------------
        def next_spyre_kernel_name(self, nodes) -> str:
            from torch._inductor.utils import get_fused_kernel_name

            try:
                base = get_fused_kernel_name(nodes, "original_aten")
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
            _, path = codecache.write(spec.to_json(), "json")
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
            from torch._inductor.virtualized import V

            device = new.get_device()
            plan = self.layout_plan
            keep = plan.reusable(old.get_name()) and plan.reusable(new.get_name())
            if device is None or device.type != "spyre" or (keep and _same_stick_layout(old, new, plan)):
                return super().make_buffer_reuse(old, new, delete_old)
            alloc = self.make_allocation(new.get_name(), device, new.get_dtype(), new.get_size(), new.get_stride())
            if delete_old and old.get_name() not in V.graph.get_output_names():
                return f"{self.make_buffer_free(old)}; {alloc}"
            return alloc

        # --- host fallbacks are counted ------------------------------------------------------------
        def _note_fallback(self, node: Any) -> None:
            name = (getattr(node, "python_kernel_name", None) or
                    (node.get_kernel_name() if hasattr(node, "get_kernel_name") else type(node).__name__))
            if _is_spyre_node(node):
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
    they are computed."""
    from torch._inductor.virtualized import V

    bound = {s for s in spec.symbols if s.startswith("u")}
    for value in V.graph.graph_inputs.values():
        if isinstance(value, sympy.Expr):
            bound |= {str(x) for x in value.free_symbols}
        elif hasattr(value, "get_size"):
            for e in [*value.get_size(), *value.get_stride()]:
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
    of the module). A graph with symbolic shapes gets an empty plan (the default layouts)."""
    from torch._inductor.virtualized import V

    from . import layout_plan as lp

    try:
        buffers, operands = _graph_buffers(), _graph_operands()
    except (TypeError, ValueError, AttributeError, NotImplementedError):  # symbolic sizes and the like
        return lp.LayoutPlan(notes=["no layout plan: the graph's sizes are not static"])
    return lp.plan_layouts(buffers, operands, inference=bool(getattr(V.graph, "is_inference", False)))


def _static_input_names() -> set[str]:
    import torch._guards
    from torch._inductor.virtualized import V

    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    names = list(V.graph.graph_input_names)
    idxs = getattr(meta, "static_input_indices", None) or ()
    return {names[i] for i in idxs if i < len(names)}


def _static_geometry(node: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    layout = node.get_layout()
    return tuple(int(x) for x in layout.size), tuple(int(x) for x in layout.stride)


def _graph_buffers() -> list[Any]:
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    from ..device.dtypes import device_dtype
    from .layout_plan import BufferInfo

    weights = _static_input_names()
    mutated = set(V.graph.mutated_buffers)
    out = []
    for name, box in V.graph.graph_inputs.items():
        if isinstance(box, ir.TensorBox) and _on_spyre(box):
            out.append(BufferInfo(name, *_static_geometry(box), "weight" if name in weights else "input",
                                  device_dtype(box.get_dtype()), name in mutated))
    for op in V.graph.operations:
        if not isinstance(op, ir.Buffer) or not _on_spyre(op):
            continue
        generated_here = "pointwise" if isinstance(op, ir.ComputedBuffer) else "other"
        producer = getattr(op, "spyre_generator", None) or generated_here
        out.append(BufferInfo(op.get_name(), *_static_geometry(op), producer, device_dtype(op.get_dtype()),
                              op.get_name() in mutated))
    return out


def _graph_operands() -> list[Any]:
    from torch._inductor.virtualized import V

    from .layout_plan import Operand

    out = []
    for op in V.graph.operations:
        gen = getattr(op, "spyre_generator", None)
        if not gen:
            continue
        kernel = f"the {op.spyre_label} writing {op.get_name()}"
        for role, x in [*zip(op.spyre_roles, op.inputs), ("out", op)]:
            out.append(Operand(kernel, gen, role, x.get_name(), *_static_geometry(x)))
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
    from torch._inductor.virtualized import V

    from ..device import tensor

    hint = V.graph.sizevars.optimization_hint
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

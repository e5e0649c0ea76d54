"""Registration with Inductor for device ``spyre``: scheduling, wrapper, device op overrides, device interface.

This is the only file that registers anything with Inductor. :func:`register` is idempotent and cheap;
it runs when ``torch_spyre.compiler`` is imported (``torch_spyre`` imports it lazily on the first
``torch.compile``; see :func:`ensure_registered`).

The scheduling (:class:`SpyreScheduling`) decides fusion with rules it can lower (same iteration
space; pointwise into a reduction's loop; pointwise epilogues over a reduction's outer space) and turns
each fused node into one kernel: a :class:`~torch_spyre.compiler.kernel_ir.KernelSpec` defined in the
wrapper and launched per call (``wrapper.py``).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import torch

DEVICE = "spyre"
_lock = threading.Lock()
_registered = False


# ---------------------------------------------------------------------------------------------
# Device interface (Dynamo) and op overrides (Inductor's wrapper)
# ---------------------------------------------------------------------------------------------
def device_properties(device: Any = None) -> SimpleNamespace:
    """What Inductor asks about the card: its 32 cores (``multi_processor_count``), memory, name."""
    import torch_spyre  # noqa: F401  (registers the device)
    from ..device import cards

    idx = cards.index_of(device)
    cfg = cards.config()
    return SimpleNamespace(
        name="IBM Spyre (simulated)", type=DEVICE, index=idx, multi_processor_count=cfg.num_cores,
        num_cores=cfg.num_cores, total_memory=cfg.dram_capacity_bytes, clock_hz=cfg.clock_hz,
        scratchpad_bytes=cfg.scratchpad_bytes, scratchpad_plannable_bytes=cfg.scratchpad_plannable_bytes,
        stick_bytes=cfg.stick_bytes, warp_size=1, major=1, minor=0,
    )


def _make_device_interface():
    from torch._dynamo.device_interface import DeviceInterface

    class SpyreDeviceInterface(DeviceInterface):
        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                torch.spyre.set_device(device)

            @staticmethod
            def current_device() -> int:
                return torch.spyre.current_device()

            @staticmethod
            def get_device_properties(device: Any = None) -> Any:
                return device_properties(device)

        @staticmethod
        def current_device() -> int:
            return torch.spyre.current_device()

        @staticmethod
        def set_device(device: Any) -> None:
            torch.spyre.set_device(device)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            prev = torch.spyre.current_device()
            if device >= 0 and device != prev:
                torch.spyre.set_device(device)
            return prev

        exchange_device = maybe_exchange_device

        @staticmethod
        def device_count() -> int:
            return torch.spyre.device_count()

        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def current_stream() -> Any:
            return torch.spyre.current_stream()

        @staticmethod
        def synchronize(device: Any = None) -> None:
            torch.spyre.synchronize(device)

        @classmethod
        def get_device_properties(cls, device: Any = None) -> Any:
            return device_properties(device)

        @staticmethod
        def get_compute_capability(device: Any = None) -> Any:
            return 0

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def memory_allocated(device: Any = None) -> int:
            return torch.spyre.memory_allocated(device)

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return 0

    return SpyreDeviceInterface


def _make_op_overrides():
    from torch._inductor.codegen.common import DeviceOpOverrides

    class SpyreDeviceOpOverrides(DeviceOpOverrides):
        def import_get_raw_stream_as(self, name: str) -> str:
            return f"def {name}(_): return 0"

        def set_device(self, device_idx: int) -> str:
            return f"torch.spyre.set_device({device_idx})"

        def synchronize(self) -> str:
            return "torch.spyre.synchronize()"

        def device_guard(self, device_idx: int) -> str:
            return f"torch.spyre.device({device_idx})"

        def current_stream(self) -> str:
            return "torch.spyre.current_stream()"

    return SpyreDeviceOpOverrides()


# ---------------------------------------------------------------------------------------------
# Scheduling
# ---------------------------------------------------------------------------------------------
def _make_scheduling():
    from torch._inductor import scheduler as sched
    from torch._inductor.codegen.simd import SIMDKernel
    from torch._inductor.utils import sympy_product
    from torch._inductor.virtualized import V

    from . import kernel_ir

    class SpyreScheduling(sched.BaseScheduling):
        """Fusion rules the Spyre generators can lower, and one kernel per fused node."""

        kernel_count = 0

        def group_fn(self, sizes):
            return tuple(V.graph.sizevars.simplify(sympy_product(s)) for s in sizes)

        def get_backend_features(self, device):
            from torch._inductor.codegen.common import BackendFeature
            from torch.utils._ordered_set import OrderedSet

            # REDUCE_TO_SINGLE_ELEMENT: a reduction stays one kernel (Inductor's split reductions make
            # two-stage kernels tuned for GPUs; the card reduces a whole row per core).
            return OrderedSet([BackendFeature.REDUCE_TO_SINGLE_ELEMENT])

        # --- fusion ----------------------------------------------------------------------------
        def can_fuse_vertical(self, node1, node2) -> bool:
            return self._can_fuse(node1, node2)

        def can_fuse_horizontal(self, node1, node2) -> bool:
            return self._can_fuse(node1, node2)

        def _can_fuse(self, node1, node2) -> bool:
            if any(n.is_template() or isinstance(n, sched.ForeachKernelSchedulerNode) for n in (node1, node2)):
                return False
            if any(not isinstance(n, (sched.SchedulerNode, sched.FusedSchedulerNode)) for n in (node1, node2)):
                return False
            _, (numel1, rnumel1) = node1.group
            _, (numel2, rnumel2) = node2.group
            r1, r2 = node1.is_reduction(), node2.is_reduction()
            if r1 and r2:
                return numel1 == numel2 and rnumel1 == rnumel2
            if not r1 and not r2:
                return numel1 == numel2 and rnumel1 == rnumel2
            red, pw = (node1, node2) if r1 else (node2, node1)
            _, (numel, rnumel) = red.group
            _, (pnumel, _) = pw.group
            if pnumel == numel * rnumel:
                return all(SIMDKernel.is_compatible((numel, rnumel), n.get_ranges()) for n in pw.get_nodes())
            # A pointwise node over the reduction's outer space: only after the reduction (an epilogue).
            return pnumel == numel and r1

        # --- code generation -------------------------------------------------------------------
        def codegen_node(self, node) -> None:
            nodes = [n for n in node.get_nodes() if n.get_name() not in self.scheduler.removed_ops]
            if not nodes:
                return
            for n in nodes:
                n.mark_run()
            wrapper = V.graph.wrapper_code
            name = wrapper.next_spyre_kernel_name(nodes)
            local = self._kernel_local_buffers(nodes)
            spec = kernel_ir.kernel_spec(name, nodes, real_name=self._real_name, internal=local)
            V.graph.removed_buffers |= local
            wrapper.define_spyre_kernel(spec)
            wrapper.call_spyre_kernel(spec)
            self.free_buffers_in_scheduler()

        def _kernel_local_buffers(self, nodes) -> set[str]:
            """Buffers written and last read inside this kernel: they stay in scratchpad (Inductor's
            ``can_buffer_be_removed_through_fusion`` decides, as for its own kernels)."""
            from torch.utils._ordered_set import OrderedSet

            fused = OrderedSet(n.get_name() for n in nodes)
            outputs = set(V.graph.get_output_names())
            local = set()
            for n in nodes:
                for buf in n.get_outputs():
                    name = buf.get_name()
                    if name not in outputs and self.scheduler.can_buffer_be_removed_through_fusion(name, fused):
                        local.add(name)
            return local

        @staticmethod
        def _real_name(name: str) -> str:
            return V.graph.scheduler.mutation_real_name.get(name, name)

        def codegen_template(self, *args, **kwargs):
            raise kernel_ir.LoweringError("template kernels are not generated by the Spyre backend")

        def codegen_sync(self) -> None:
            pass

        def flush(self) -> None:
            pass

        def ready_to_flush(self) -> bool:
            return False

        def benchmark_fused_nodes(self, nodes):
            raise NotImplementedError("the Spyre backend does not benchmark kernels (no autotuning)")

        def benchmark_codegened_module(self, module):
            raise NotImplementedError("the Spyre backend does not benchmark kernels (no autotuning)")

        def generate_kernel_code_from_nodes(self, nodes, benchmark_kernel=False, hint_override=None):
            raise NotImplementedError("the Spyre backend does not benchmark kernels (no autotuning)")

    return SpyreScheduling


# ---------------------------------------------------------------------------------------------
# Lowerings that keep whole ops on the card (instead of Inductor's extern aten calls or indirect
# indexing): the matmul family -> generator "matmul", embedding/index_select -> generator "gather"
# ---------------------------------------------------------------------------------------------
MATMUL_KINDS = {"mm": 2, "bmm": 2, "addmm": 3, "baddbmm": 3}


def _make_extern_node():
    from torch._inductor import ir

    from . import kernel_ir

    class SpyreExternKernel(ir.ExternKernelOut):
        """One whole-op spyre kernel: ``inputs`` in the order of ``roles``, the output is role ``out``."""

        def __init__(self, layout, inputs, generator: str, roles: list[str], params: dict[str, Any], label: str):
            super().__init__(layout, inputs, python_kernel_name=f"spyre_{label}")
            self.spyre_generator, self.spyre_roles, self.spyre_params, self.spyre_label = generator, roles, params, label

        def codegen(self, wrapper) -> None:
            refs = {r: x.codegen_reference() for r, x in zip(self.spyre_roles, self.inputs)}
            refs["out"] = self.get_name()
            spec = kernel_ir.extern_kernel_spec(
                wrapper.next_spyre_kernel_name_for(self.spyre_label), self.spyre_generator,
                {r: x for r, x in zip(self.spyre_roles, self.inputs)} | {"out": self},
                self.spyre_params, self.get_origins(),
            )
            wrapper.define_spyre_kernel(spec)
            wrapper.call_spyre_kernel(spec, refs)

    return SpyreExternKernel


def _spyre_lowering(original, lower_fn, name: str):
    """``lower_fn`` for tensors on spyre, Inductor's own lowering for every other device."""
    from torch._inductor import ir

    def lower(*args, **kwargs):
        tensors = [a for a in args if isinstance(a, ir.IRNode)]
        device = tensors[0].get_device() if tensors else None
        if device is None or device.type != DEVICE:
            return original(*args, **kwargs)
        return lower_fn(*args, **kwargs)

    lower.__name__ = f"spyre_{name}_lowering"
    return lower


def _extern(generator: str, label: str, roles: list[str], inputs, size, dtype, params):
    from torch._inductor.ir import FixedLayout, TensorBox

    stride = [1] * len(size)
    for d in range(len(size) - 2, -1, -1):
        stride[d] = stride[d + 1] * size[d + 1]
    layout = FixedLayout(inputs[-1].get_device(), dtype, list(size), stride)
    return TensorBox.create(_make_extern_node.cls(layout, inputs, generator, roles, params, label))


def _lower_matmul(kind: str):
    def lower(*args, **kwargs):
        from torch._inductor import ir

        n_in = MATMUL_KINDS[kind]
        out_dtype = args[n_in - 1].get_dtype()
        inputs = [_matmul_operand(ir.ExternKernel.realize_input(_pe_dtype(a, i < n_in - 2)))
                  for i, a in enumerate(args[:n_in])]
        beta = kwargs.get("beta", args[n_in] if len(args) > n_in else 1)
        alpha = kwargs.get("alpha", args[n_in + 1] if len(args) > n_in + 1 else 1)
        a, b = inputs[-2], inputs[-1]
        roles = (["bias"] if n_in == 3 else []) + ["a", "b"]
        size = [*a.get_size()[:-1], b.get_size()[-1]]
        params = {"kind": kind, "alpha": float(alpha), "beta": float(beta)}
        if out_dtype == torch.float32:
            params["note"] = "fp32 operands rounded to DLFloat16 for the PE arrays (fp32 accumulation and output)"
        return _extern("matmul", kind, roles, inputs, size, out_dtype, params)

    return lower


def _pe_dtype(x, is_bias: bool):
    """The PE arrays multiply 16-bit floats: fp32 matmul operands are rounded to fp16 (DLFloat16 on the
    card) by a cast kernel; the product still accumulates and is written in fp32. A bias keeps its dtype."""
    from torch._inductor import lowering as L

    if is_bias or x.get_dtype() != torch.float32:
        return x
    return L.to_dtype(x, torch.float16)


def _lower_embedding(weight, indices, *args, **kwargs):
    from torch._inductor import ir

    w, i = ir.ExternKernel.realize_input(weight), ir.ExternKernel.realize_input(indices)
    size = [*i.get_size(), w.get_size()[1]]
    return _extern("gather", "embedding", ["source", "index"], [w, i], size, w.get_dtype(),
                   {"kind": "embedding", "dim": 0})


def _lower_index_select(x, dim, index):
    from torch._inductor import ir

    src, idx = ir.ExternKernel.realize_input(x), ir.ExternKernel.realize_input(index)
    dim = dim % max(len(src.get_size()), 1)
    size = list(src.get_size())
    size[dim] = idx.get_numel()
    return _extern("gather", "index_select", ["source", "index"], [src, idx], size, src.get_dtype(),
                   {"kind": "index_select", "dim": int(dim)})


def _lower_index(original):
    """``x[idx]`` (``aten.index.Tensor`` with one index tensor): an index_select along its dim for a
    1-d index, an embedding row gather for a 2-d source indexed on dim 0; other forms keep Inductor's
    lowering (indirect indexing, which the pointwise generator refuses with a clear error)."""

    def lower(x, indices):
        live = [(d, t) for d, t in enumerate(indices) if t is not None]
        if len(live) == 1:
            d, idx = live[0]
            if len(idx.get_size()) == 1:
                return _lower_index_select(x, d, idx)
            if d == 0 and len(x.get_size()) == 2:
                return _lower_embedding(x, idx)
        return original(x, indices)

    return lower


def _lower_gather(original):
    """``torch.gather(x, dim, index)`` -> the gather generator: along the last (stick) dim element by
    element; along another dim as a row gather when the index is constant along every other dim (an
    expanded index), else on the source and index moved so that ``dim`` is last (copy kernels) and the
    result moved back (a view). 0-d sources and empty indices keep Inductor's lowering."""
    from torch._inductor import ir
    from torch._inductor import lowering as L

    def lower(x, dim, index, sparse_grad=False):
        rank = len(x.get_size())
        if rank == 0 or len(index.get_size()) != rank or index.get_numel() == 0:
            return original(x, dim, index, sparse_grad)
        dim = dim % rank
        idx = ir.ExternKernel.realize_input(index)
        if dim != rank - 1 and not _varies_only_along(idx, dim):
            perm = [d for d in range(rank) if d != dim] + [dim]
            moved = lower(L.permute(x, perm), rank - 1, L.permute(index, perm))
            return L.permute(moved, [perm.index(d) for d in range(rank)])
        src = _gather_operand(x, starts_rows=dim != rank - 1)
        # A row gather reads the index along ``dim`` only (it is constant along the others): as it is.
        idx = _gather_operand(idx) if dim == rank - 1 else idx
        return _extern("gather", "gather", ["source", "index"], [src, idx], list(idx.get_size()),
                       src.get_dtype(), {"kind": "gather", "dim": int(dim)})

    return lower


def _varies_only_along(index, dim: int) -> bool:
    """The index is constant (stride 0) along every dim but ``dim`` of size > 1: an expanded index."""
    try:
        return all(int(n) <= 1 or int(st) == 0 for d, (n, st) in enumerate(zip(index.get_size(), index.get_stride()))
                   if d != dim)
    except (TypeError, AttributeError, NotImplementedError):
        return False


def _gather_operand(x, starts_rows: bool = False):
    """What the gather generator reads in place: a view whose last dim is unit-stride and walks one dim
    of its buffer (sticks of one row evenly spaced). Anything else gets a copy in its own layout.
    ``starts_rows``: gathered rows must also start at the first lane of a stick (a row gather moves whole
    sticks), so a view starting inside its buffer's last dim is copied too."""
    from torch._inductor import ir

    # A copy must be frozen contiguous: Inductor would otherwise give a copy kernel the stride order of
    # what it reads (the transposed order we are copying away from).
    contiguous = ir.ExternKernel.require_contiguous
    x = ir.ExternKernel.realize_input(x)
    try:
        size, stride = x.get_size(), x.get_stride()
        if isinstance(x, ir.ReinterpretView) and not _walks_buffer_dims(x):
            return contiguous(x)
        if int(size[-1]) > 1 and int(stride[-1]) != 1:
            return contiguous(x)
        if starts_rows and isinstance(x, ir.ReinterpretView):
            inner = int(x.data.get_layout().size[-1])
            if int(x.get_layout().offset) % max(inner, 1):
                return contiguous(x)
    except (TypeError, AttributeError, NotImplementedError):  # symbolic sizes: a copy is always readable
        return contiguous(x)
    return x


def _lower_cumsum(original):
    """``cumsum`` as a log-step (Hillis-Steele) scan: ceil(log_r(n)) pointwise kernels, step k adding to
    each element the r - 1 elements j * r^k (0 < j < r) before it along the dim (shifted, masked reads:
    the pointwise generator reads them as misaligned views, each mask cuts one box). Floats accumulate in
    fp32, integers in int64 (torch's result dtype for them). Each step is a full pass: right for the
    short scans models use (positions from an attention mask, a few thousand elements)."""
    from torch._inductor import ir
    from torch._inductor import lowering as L
    from torch._inductor.virtualized import ops

    def lower(x, axis=None, dtype=None):
        size = list(x.get_size())
        if not size or axis is None:
            return original(x, axis, dtype=dtype)
        if dtype is None:
            dtype = torch.int64 if not x.get_dtype().is_floating_point else x.get_dtype()
        dim = axis % len(size)
        acc = torch.float32 if dtype.is_floating_point else torch.int64
        y = L.to_dtype(x, acc)
        step, radix = 1, _scan_radix(int(x.get_numel()))
        while step < int(size[dim]):
            y = _scan_step(y, dim, step, radix, ir, ops)
            step *= radix
        return L.to_dtype(y, dtype)

    return lower


def _scan_radix(numel: int) -> int:
    """Elements summed per scan step. Each step is a kernel (~20 µs fixed cost) reading ``radix``
    shifted views: 8 for small scans (fewer kernels: [8, 4096] in 4 kernels, 128 µs against 165 µs with
    4), 4 past 256k elements, where the reads dominate ([256, 4096] fp32: 913 µs against 969 µs with 8)."""
    return 8 if numel <= 1 << 18 else 4


def _scan_step(y, dim: int, step: int, radix: int, ir, ops):
    """One scan step: out[..., i, ...] = sum over j < radix of y[i - j*step] (0 before the start),
    realized (the next step reads it shifted)."""
    load = y.make_loader()
    dtype = y.get_dtype()

    def earlier(index, j):
        shifted = list(index)
        shifted[dim] = index[dim] - j * step
        exists = ops.ge(ops.index_expr(index[dim], torch.int64), ops.constant(j * step, torch.int64))
        return ops.masked(exists, lambda: load(shifted), 0)

    def fn(index):
        total = load(index)
        for j in range(1, radix):
            total = ops.add(total, earlier(index, j))
        return total

    out = ir.Pointwise.create(device=y.get_device(), dtype=dtype, inner_fn=fn, ranges=list(y.get_size()))
    out.realize()
    return out


def _matmul_operand(x):
    """A view that merges or splits dims of its buffer (e.g. [B, S, K] seen as [B*S, K]) is not one
    stride per dim in the stick layout's device order: give the matmul a copy in its own layout (a
    pointwise kernel). Permutes and slices stay views; the matmul generator reads them as they are."""
    from torch._inductor import ir

    if isinstance(x, ir.ReinterpretView) and not _walks_buffer_dims(x):
        return ir.ExternKernel.copy_input(x)
    return x


def _walks_buffer_dims(view) -> bool:
    """Every view dim (of size > 1) moves along one dim of its buffer's dense host shape, each a
    different one (what a stick layout can serve as one stride): true of permutes and slices, false of
    reshapes that merge or split dims (heads split out of a fused projection, batch folded into rows).
    Symbolic sizes and strides are compared as Inductor's size variables prove them for every value of
    the symbols (what cannot be proved counts as false: a copy is correct, only slower)."""
    from torch._inductor.virtualized import V

    sv = V.graph.sizevars
    try:
        base = view.data.get_layout()
        host = [(n, st) for n, st in zip(base.size, base.stride) if not sv.statically_known_leq(n, 1)]
        used: set[int] = set()
        for n, st in zip(view.get_size(), view.get_stride()):
            if sv.statically_known_leq(n, 1):
                continue
            match = [h for h, (hn, hst) in enumerate(host)
                     if h not in used and sv.statically_known_equals(hst, st) and sv.statically_known_leq(n, hn)]
            if not match:
                return False
            used.add(match[0])
        return True
    except (TypeError, AttributeError):  # unusual layouts: copy to be safe
        return False


def _lower_flash_attention(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """``spyre::flash_attention`` (traced SDPA on spyre, see ``device/sdpa.py``) -> one kernel of the
    "attention" generator (``codegen/attention/``) reading q/k/v/mask as they lie (views included),
    writing a fresh contiguous [B, Hq, Lq, Dv]."""
    from torch._inductor import ir

    q, k, v = (_attention_operand(x) for x in (query, key, value))
    inputs, roles = [q, k, v], ["query", "key", "value"]
    if attn_mask is not None:
        inputs.append(_attention_operand(attn_mask))
        roles.append("attn_mask")
    B, Hq, Lq, _ = q.get_size()
    size = [B, Hq, Lq, v.get_size()[-1]]
    params = {"is_causal": bool(is_causal), "scale": None if scale is None else float(scale),
              "enable_gqa": bool(enable_gqa), "attn_mask": "attn_mask" if attn_mask is not None else None,
              "kind": "attention"}
    return _extern("attention", "sdpa", roles, inputs, size, q.get_dtype(), params)


def _attention_operand(x):
    """The generator reads rows along the stick dim (the last dim, unit stride): a view whose last dim
    has another stride (e.g. K given as a transpose of K^T) gets a copy in its own layout first."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    sv = V.graph.sizevars
    x = ir.ExternKernel.realize_input(x)
    try:
        size, stride = x.get_size(), x.get_stride()
        # Symbolic: only a last dim proved unit-stride (or of size 1) is read in place.
        if not (sv.statically_known_leq(size[-1], 1) or sv.statically_known_equals(stride[-1], 1)):
            return ir.ExternKernel.require_contiguous(x)
    except (TypeError, AttributeError, NotImplementedError):
        return ir.ExternKernel.require_contiguous(x)
    return x


def _register_sdpa_lowering() -> None:
    from torch._inductor import lowering as L

    op = getattr(getattr(torch.ops, "spyre", None), "flash_attention", None)
    if op is None:  # the device did not define it (torch_spyre.device.sdpa)
        return
    L.lowerings[op.default] = _lower_flash_attention


_SOURCES_HASH: str | None = None


def compiler_fingerprint() -> str:
    """Part of Inductor's FX-graph cache key for every graph (through the device's custom pass uuid): a
    hash of the compiler's sources, so a cached wrapper never outlives the compiler that wrote it, and of
    the card configuration, so a wrapper compiled for one card (its core count, scratchpad, stick size)
    is never served for another. Input layouts are not in the key because nothing cached depends on
    them: programs are generated from the cached kernel specs at run time, per placement (stick layout,
    storage offset) of the bound tensors."""
    import hashlib
    import pathlib

    from ..device import cards

    global _SOURCES_HASH
    if _SOURCES_HASH is None:
        h = hashlib.sha256()
        for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
        _SOURCES_HASH = h.hexdigest()
    card = hashlib.sha256(cards.config().model_dump_json().encode()).hexdigest()
    return f"{_SOURCES_HASH}-card-{card[:16]}"


def _make_version_pass():
    from torch._inductor.custom_graph_pass import CustomGraphModulePass

    class SpyreCompilerVersion(CustomGraphModulePass):
        """Not a transformation: Inductor stores a device's custom pass and puts its uuid in the FX
        graph cache key; this one carries :func:`compiler_fingerprint`."""

        def __call__(self, gm) -> None:
            return None

        def uuid(self) -> str:  # asked per cache lookup: the card configuration may change in a process
            return compiler_fingerprint()

    return SpyreCompilerVersion()


def _graph_on_spyre(gm) -> bool:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == DEVICE:
            return True
    return False


def _no_device_constant_folding() -> None:
    """Inductor's joint-graph constant folding runs the foldable ops on real tensors of the graph's
    device and reads the results back. On spyre that rounds through DLFloat16, whose single NaN/Inf code
    turns an fp16 ``-inf`` (or ``finfo(float16).min``, which rounds past fp16's range) into NaN, and the
    host work counts as device fallbacks. Spyre graphs skip that pass; Inductor's lowering still folds
    plain constants."""
    from torch._inductor.fx_passes import joint_graph

    original = joint_graph.constant_fold_uniform_value
    if getattr(original, "_spyre_guard", False):
        return

    def constant_fold_uniform_value(gm):
        if _graph_on_spyre(gm):
            return None
        return original(gm)

    constant_fold_uniform_value._spyre_guard = True
    joint_graph.constant_fold_uniform_value = constant_fold_uniform_value


def _register_lowerings() -> None:
    from torch._inductor import lowering as L

    _make_extern_node.cls = _make_extern_node()
    aten = torch.ops.aten
    table = {getattr(aten, k).default: (_lower_matmul(k), k) for k in MATMUL_KINDS}
    table[aten.embedding.default] = (_lower_embedding, "embedding")
    table[aten.index_select.default] = (_lower_index_select, "index_select")
    table[aten.index.Tensor] = (_lower_index(L.lowerings[aten.index.Tensor]), "index")
    table[aten.gather.default] = (_lower_gather(L.lowerings[aten.gather.default]), "gather")
    table[aten.cumsum.default] = (_lower_cumsum(L.lowerings[aten.cumsum.default]), "cumsum")
    for op, (fn, name) in table.items():
        original = L.lowerings.get(op)
        if original is None or getattr(original, "__name__", "").startswith("spyre_"):
            continue
        L.lowerings[op] = _spyre_lowering(original, fn, name)
    _register_sdpa_lowering()


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------
def _dynamo_skips_device_kernels() -> None:
    """Dynamo must not trace the device's Python kernels (and all they call) when the dispatcher
    enters them inside a compiled region, e.g. autograd's backward after a graph break."""
    from torch._C._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    from ..device.registration import kernel_entry_codes

    for code in kernel_entry_codes():
        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


def register() -> None:
    """Register the Spyre backend with Inductor and Dynamo for device ``spyre`` (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        import torch_spyre  # noqa: F401  (the device must exist first)

        from torch._dynamo.device_interface import register_interface_for_device
        from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides

        from .wrapper import _make_wrapper_class

        register_backend_for_device(DEVICE, _make_scheduling(), _make_wrapper_class(),
                                    device_custom_pass=_make_version_pass())
        register_device_op_overrides(DEVICE, _make_op_overrides())
        register_interface_for_device(DEVICE, _make_device_interface())
        _dynamo_skips_device_kernels()
        _register_lowerings()
        _no_device_constant_folding()
        from .wrapper import register_builtin_generators

        register_builtin_generators()
        _registered = True


def inductor_attr(name: str) -> Any:
    """What Inductor's lazy PrivateUse1 lookup (``torch.spyre.Scheduling`` etc., read on the first
    compile by ``init_backend_registration``) should get; registers everything on the way. The device
    module forwards its ``__getattr__`` for these names here."""
    register()
    from torch._inductor.codegen.common import get_scheduling_for_device, get_wrapper_codegen_for_device

    if name == "Scheduling":
        return get_scheduling_for_device(DEVICE)
    if name == "PythonWrapperCodegen":
        return get_wrapper_codegen_for_device(DEVICE)
    return None  # no C++ or FX wrapper for spyre

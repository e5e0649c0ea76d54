"""Registration with Inductor and Dynamo for device ``spyre``: :func:`register` (idempotent).

It registers (all through the seam, ``torch_spyre/_torch/inductor.py``):

- the scheduling (``scheduling.py``) and the Python wrapper codegen (``wrapper.py``), with the device's
  post-grad pass (indexes by aranges as views, ``index_views.py``; fused MLP blocks, ``fused_mlp.py``; matmul
  epilogue fusion, ``epilogue.py``, and LayerNorms into it, ``epilogue_norm.py``; sibling matmuls as one
  kernel, ``matmul_group.py``), whose uuid puts :func:`compiler_fingerprint` in the FX graph cache key;
- the device op overrides and the device interface (``device_interface.py``);
- Dynamo's skip of the device's Python kernels (never traced, even inside a compiled region);
- the lowerings that keep whole ops on the card (``lowerings.py``: patches Inductor's lowerings table);
- the skip of joint-graph constant folding for spyre graphs (a patch of Inductor's pass);
- spyre nodes kept out of combo kernels (a grouping algorithm wrapping the scheduler's own);
- the program generators (``generators.py``; one that fails to import raises);
- the fallback of ops the card cannot lower to the eager op (``fallback.py``: a check after each
  lowering, and a compile retried with the nodes a kernel could not lower as fallback kernels).

Nothing calls it at ``import torch_spyre``: the first ``torch.compile`` on spyre tensors reaches it through
Inductor's lookup of ``torch.spyre.Scheduling`` (answered by ``hooks.py``), the first eager program through
``eager.compile_one_op``; callers may also call it directly.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .._torch import inductor as torch_inductor
from .device_interface import device_properties  # noqa: F401 - re-exported (what Inductor asks about the card)

DEVICE = "spyre"
_lock = threading.Lock()
_registered = False


_SOURCES_HASH: str | None = None


def compiler_fingerprint() -> str:
    """Part of Inductor's FX-graph cache key for every graph (through the device's custom pass uuid): a
    hash of the compiler's sources, so a cached wrapper never outlives the compiler that wrote it, and of
    the card configuration (and of the device's decomposition patches, which change the graphs), so a
    wrapper compiled for one card (its core count, scratchpad, stick size) is never served for another,
    and of the optimizations switched off. Input layouts are not in the key because nothing cached
    depends on them: programs are generated from the cached kernel specs at run time, per placement
    (stick layout, storage offset) of the bound tensors."""
    import hashlib
    import pathlib

    from ..device import cards

    global _SOURCES_HASH
    if _SOURCES_HASH is None:
        h = hashlib.sha256()
        root = pathlib.Path(__file__).parent
        # the generators' subpackages too, and the device's attention op, whose rule the lowering asks
        # (device/sdpa.py: the output's strides)
        for path in [*sorted(root.rglob("*.py")), root.parent / "device" / "sdpa.py"]:
            h.update(str(path.relative_to(root.parent)).encode())
            h.update(path.read_bytes())
        # the decompositions the device patches change traced graphs (device/norm_stats.py)
        h.update((root.parent / "device" / "norm_stats.py").read_bytes())
        _SOURCES_HASH = h.hexdigest()
    from . import optimizations

    card = hashlib.sha256(cards.config().model_dump_json().encode()).hexdigest()
    return f"{_SOURCES_HASH}-card-{card[:16]}-off-{optimizations.fingerprint()}"


def _make_version_pass():
    class SpyrePostGradPass(torch_inductor.GraphModulePassBase):
        """The device's post-grad pass: Inductor runs it on every graph with spyre tensors after its own
        post-grad passes, and puts its uuid, :func:`compiler_fingerprint`, in the FX graph cache key.
        In order, each unless its optimization is off: indexes by whole-dim aranges become views
        (``index_views.py``), sibling embedding lookups one kernel (``embedding_group.py``), MLP blocks one fused kernel (``fused_mlp.py``) with the residual and LayerNorm
        after them (``mlp_norm.py``), matmuls read transposed by a kernel wanting the other layout compute the
        transposed product (``transposed_product.py``), matmul epilogues fold into the
        matmul (``epilogue.py``) and LayerNorms after them too (``epilogue_norm.py``), matmuls reading one
        input become one kernel (``matmul_group.py``)."""

        def __call__(self, gm) -> None:
            from . import (embedding_group, epilogue, epilogue_norm, fused_mlp, index_views, matmul_group, mlp_norm,
                           transposed_product)

            index_views.view_indexes(gm)
            embedding_group.group_embeddings(gm)
            fused_mlp.fuse_mlps(gm)
            mlp_norm.fuse_mlp_norms(gm)
            transposed_product.fold_transposed_products(gm)
            epilogue.fuse_matmul_epilogues(gm)
            epilogue_norm.fuse_layer_norms(gm)
            matmul_group.group_matmuls(gm)

        def uuid(self) -> str:  # asked per cache lookup: the card configuration may change in a process
            return compiler_fingerprint()

    return SpyrePostGradPass()


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
    torch_inductor.keep_device_constants_unfolded(_graph_on_spyre)


def _patterns_traced_on_host() -> None:
    """Inductor traces its replacement patterns once per process, with real example tensors on the graph's
    device, at the first compile that misses its FX graph cache on disk. On spyre that was card work (26
    device copies, 0.52 ms) charged to whatever request compiled first, so the simulated time of a request
    depended on the host's cache. Traced on the CPU, no card work is done for it."""
    torch_inductor.trace_patterns_on_host(DEVICE)


def _no_combo_kernels() -> None:
    """Inductor's combo kernels (``torch._inductor.config.combo_kernels``, on for every non-CPU platform
    under vLLM) bundle independent kernels into one Triton launch; only Triton schedulings can generate
    or benchmark them. Spyre nodes stay out of the grouping (as Inductor keeps CPU and MPS nodes out), so
    each becomes its own kernel, whatever that setting."""
    torch_inductor.keep_device_out_of_combo_kernels(DEVICE)


def _dynamo_skips_device_kernels() -> None:
    """Dynamo must not trace the device's Python kernels (and all they call) when the dispatcher
    enters them inside a compiled region, e.g. autograd's backward after a graph break."""
    from ..device.registration import kernel_entry_codes

    torch_inductor.never_trace(kernel_entry_codes())


def register() -> None:
    """Register the Spyre backend with Inductor and Dynamo for device ``spyre`` (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        from .device_interface import _make_device_interface, _make_op_overrides
        from .generators import register_builtin_generators
        from .lowerings import register_lowerings
        from .scheduling import _make_scheduling
        from .wrapper import _make_wrapper_class

        torch_inductor.register_device_backend(DEVICE, _make_scheduling(), _make_wrapper_class(),
                                               custom_pass=_make_version_pass())
        torch_inductor.register_device_op_overrides(DEVICE, _make_op_overrides())
        torch_inductor.register_device_interface(DEVICE, _make_device_interface())
        _dynamo_skips_device_kernels()
        register_lowerings()
        _no_device_constant_folding()
        _patterns_traced_on_host()
        _no_combo_kernels()
        register_builtin_generators()
        from .fallback import lowering_refusal

        torch_inductor.guard_lowerings(lowering_refusal)
        torch_inductor.retry_compile_after_fallbacks()
        _registered = True


def inductor_attr(name: str) -> Any:
    """What Inductor's lazy PrivateUse1 lookup (``torch.spyre.Scheduling`` etc., read on the first
    compile by ``init_backend_registration``) should get; registers everything on the way. The device
    module forwards these names here through the compiler's hooks (``hooks.py``)."""
    register()
    if name == "Scheduling":
        return torch_inductor.registered_scheduling(DEVICE)
    if name == "PythonWrapperCodegen":
        return torch_inductor.registered_wrapper_codegen(DEVICE)
    return None  # no C++ or FX wrapper for spyre

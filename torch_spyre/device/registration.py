"""Register the ``spyre`` device: rename PrivateUse1, install ``torch.spyre``, hooks, guard and kernels.

Runs inside ``import torch`` when the package is installed (the ``torch.backends`` autoload entry point),
so it imports nothing heavy: the kernels below are thin forwarders that import the device modules
(card model, configuration, numpy) on their first call.
"""

from __future__ import annotations

import threading

import torch

from .._torch import device as torch_device

_lock = threading.Lock()
_registered = False
_libraries: list[torch.library.Library] = []  # kept alive: dropping a Library unregisters its kernels


def _forward(name: str):
    def kernel(*args, **kwargs):
        from . import kernels

        return kernels.KERNELS[name](*args, **kwargs)

    kernel.__name__ = f"spyre_{name.replace('.', '_')}"
    return kernel


def _cpu_metadata(name: str):
    op = getattr(torch.ops.aten, name).default
    to_cpu = torch_device.redispatch_to_cpu

    def kernel(*args, **kwargs):
        return to_cpu(op, *args, **kwargs)

    kernel.__name__ = f"spyre_{name}"
    return kernel


def _fallback(op, *args, **kwargs):
    from . import fallback

    return fallback.run(op, *args, **kwargs)


KERNEL_NAMES = (
    "empty.memory_format", "empty_strided", "_to_copy", "_copy_from", "_copy_from_and_resize", "resize_",
    "set_.source_Storage", "set_.source_Storage_storage_offset", "set_.source_Tensor", "set_", "view.dtype",
)
# Ops with a composite kernel that refuses to run (a backend must override them): sent to the fallback.
FALLBACK_OPS = ("convolution_overrideable", "convolution_backward_overrideable")
# Ops whose composite kernel chains ops through tensors of the input's dtype, one of which can exceed
# DLFloat16's range (largest finite 8.573e9) where the result does not: soft_margin_loss stores
# exp(-target * input) before its log1p (exp(67) made the loss NaN where the CPU in bf16 gives 67). Sent to
# the fallback, each runs as one program whose intermediates stay in the vector unit (fp32), or on the host
# in fp32.
ONE_PROGRAM_OPS = ("soft_margin_loss", "soft_margin_loss_backward")


def _via_fallback(name: str):
    op = getattr(torch.ops.aten, name).default

    def kernel(*args, **kwargs):
        from . import fallback

        return fallback.run(op, *args, **kwargs)

    kernel.__name__ = f"spyre_{name}"
    return kernel


def _refuse_sparse(*args, **kwargs):
    """``sparse_coo_cpu.to('spyre')`` builds a sparse tensor on the card: refused as the results of ops
    are (fallback.py), with the card's clear error instead of a missing-kernel one."""
    from . import dtypes

    dtypes.check_layout(torch.sparse_coo, "a copy of a sparse tensor")


def _refuse_sparse_compressed(op, *args, **kwargs):  # op: None for the copy
    """A sparse compressed (CSR, CSC, BSR, BSC) tensor on the card: refused with the card's clear error.
    ``csr_cpu.to('spyre')`` is a CPU kernel that copies the parts to the card and builds the tensor there;
    it then reaches this key, so the copy is refused (without it the copy succeeded and reading the tensor
    back failed with torch's "col_indices expected sparse row compressed tensor layout")."""
    from . import dtypes

    layout = next((a.layout for a in args if isinstance(a, torch.Tensor) and a.layout != torch.strided),
                  torch.sparse_csr)
    dtypes.check_layout(layout, "a copy of a sparse tensor" if op is None else f"an argument of {op}")


# Ops whose CPU kernels only edit sizes/strides/offset of a tensor sharing the storage.
METADATA_OPS = ("view", "as_strided", "_reshape_alias", "alias", "unfold")


def kernel_entry_codes() -> list:
    """The code objects through which the dispatcher enters this package's kernels. They are the
    device's implementation, never user code: the compiler tells Dynamo never to trace them (or
    anything they call), e.g. when autograd runs them inside a compiled region."""
    return [_fallback.__code__, *{f(n).__code__ for f, n in ((_forward, KERNEL_NAMES[0]),
                                                             (_cpu_metadata, METADATA_OPS[0]),
                                                             (_via_fallback, FALLBACK_OPS[0]))}]


def register() -> None:
    """Make ``spyre`` a PyTorch device (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        current = torch_device.privateuse1_backend_name()
        if current not in ("privateuseone", "spyre"):
            raise RuntimeError(f"cannot register spyre: PrivateUse1 is already taken by {current!r}")
        from .. import spyre_module

        if current == "privateuseone":
            torch_device.register_python_device("spyre", spyre_module)
        aten = torch.library.Library("aten", "IMPL")
        for name in KERNEL_NAMES:
            aten.impl(name, _forward(name), "PrivateUse1")
        for name in METADATA_OPS:
            aten.impl(name, _cpu_metadata(name), "PrivateUse1")
        for name in FALLBACK_OPS + ONE_PROGRAM_OPS:
            aten.impl(name, _via_fallback(name), "PrivateUse1")
        from . import norm_stats, rnn_cells, sdpa, serialization, torch_patches

        # GRU/LSTM cells: torch's fused-cell ops as pointwise ops (rnn_cells.py); batch/layer norm statistics
        # in the CPU's dtype and shape (norm_stats.py)
        for name, kernel, key in rnn_cells.kernels() + norm_stats.kernels():
            aten.impl(name, kernel, key)
        norm_stats.patch_decompositions()  # and traced graphs the same statistics
        aten.impl("_sparse_coo_tensor_with_dims_and_tensors", _refuse_sparse, "SparsePrivateUse1")
        aten.impl("_pin_memory", _forward("_pin_memory"), "CPU")  # pinning for spyre (see kernels.py)
        catch_all = torch.library.Library("_", "IMPL")
        catch_all.fallback(_fallback, "PrivateUse1")
        catch_all.fallback(_refuse_sparse_compressed, "SparseCsrPrivateUse1")
        # _to_copy (.cpu()) has a composite kernel, which a backend fallback does not replace
        aten.impl("_to_copy", lambda *a, **k: _refuse_sparse_compressed(None, *a, **k), "SparseCsrPrivateUse1")
        _libraries.extend([aten, catch_all])

        sdpa.register()  # traced SDPA on spyre -> spyre::flash_attention (see sdpa.py)
        serialization.register()
        torch_patches.patch()
        _registered = True

"""What spyre replaces in torch's Python functions, and when: the device's side of three patches.

The patching itself is done by the seam, ``torch_spyre/_torch/device.py``; docs/architecture.md
("Patches of torch's global state") lists every patch torch_spyre makes and why. The three here
(the third is a kernel registered through the public ``torch.library``, so it needs no seam):

1. ``torch.accelerator``.

For a PrivateUse1 backend registered from Python, torch 2.13's C++ side hard-codes part of
``torch.accelerator`` (``torch/csrc/acc/Module.cpp``: the Python device guard always reports device 0,
cannot synchronize, and no C++ ``DeviceAllocator`` exists, so the memory functions fail an internal
assert). ``empty_host_cache`` is worse: once the device is initialized (a spyre tensor exists) torch calls
``at::getHostAllocator(PrivateUse1)``, which returns null for a backend that registered no C++ host
allocator (the check is debug-only), and the call through it kills the process with SIGSEGV; vLLM calls it
at shutdown. ``device_count``, ``is_available`` and ``current_accelerator`` already go through the device
module. The functions below are replaced by thin wrappers that call ``torch.spyre`` when the current
accelerator is spyre and the original otherwise.

2. Tensor printing (``tensor_totype``) converts a tensor's non-zero finite values to float64 *on the
   device*; the card has no float64, so spyre is treated as torch treats MPS and MAIA (float32).

3. ``aten::_has_compatible_shallow_copy_type`` (a kernel for PrivateUse1, the extension point
   ``c10/core/TensorImpl.h`` documents for PrivateUse1 backends). torch's own answer lists only the dense
   backends it knows (CPU, CUDA, MPS, HIP, XPU, HPU, MTIA), so for a CPU and a spyre tensor it is False and
   ``nn.Module._apply`` (``.to("spyre")``, ``.cpu()``) then wraps each converted tensor in a *new*
   Parameter per module that holds it: tied parameters (an LM head sharing the embedding) came apart,
   their memory was counted twice and training updated the copies separately. With the kernel,
   ``_apply`` takes the path it takes for CUDA (``param.data = converted``): every Parameter object is
   kept, so ties are kept (``model.lm_head.weight is model.embed.weight``).

tests/device/test_torch_patches.py checks items 1 and 2, tests/device/test_tied_parameters.py item 3, so a torch
release that changes them is noticed.
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch import device as torch_device

# torch.accelerator attribute -> torch.spyre function (same meaning, same arguments)
_MEMORY = {
    "memory_stats": "memory_stats",
    "empty_cache": "empty_cache",
    "empty_host_cache": "empty_host_cache",
    "get_memory_info": "mem_get_info",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
}
_DEVICE = {
    "synchronize": "synchronize",
    "current_device_index": "current_device",
    "current_device_idx": "current_device",
    "set_device_index": "set_device",
    "set_device_idx": "set_device",
    "current_stream": "current_stream",
    "set_stream": "set_stream",
    "get_device_capability": "get_device_capability",
}

_patched = False


def _is_spyre() -> bool:
    return torch_device.current_accelerator_type() == "spyre"


class _device_index:
    """``torch.accelerator.device_index(i)`` for spyre (the C++ exchange is a no-op for Python backends)."""

    def __init__(self, device: Any, /) -> None:
        self.idx = device
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx is not None:
            self.prev_idx = torch.spyre.current_device()
            torch.spyre.set_device(self.idx)

    def __exit__(self, *exc: Any) -> None:
        if self.idx is not None:
            torch.spyre.set_device(self.prev_idx)


_DENSE_SHALLOW_COPY_DEVICES = ("cpu", "spyre")
_libraries: list = []


def _has_compatible_shallow_copy_type(self: torch.Tensor, src: torch.Tensor) -> bool:
    """True for two dense strided tensors on the CPU or spyre, as torch answers for CPU and CUDA."""
    return all(t.layout == torch.strided and t.device.type in _DENSE_SHALLOW_COPY_DEVICES for t in (self, src))


def _patch_module_conversion_keeps_parameters() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
    _libraries.append(lib)


def patch() -> None:
    global _patched
    if _patched:
        return
    torch_device.print_as_float32("spyre")
    torch_device.route_accelerator_functions(lambda: torch.spyre, _MEMORY, _DEVICE, _device_index, _is_spyre)
    _patch_module_conversion_keeps_parameters()
    _patched = True

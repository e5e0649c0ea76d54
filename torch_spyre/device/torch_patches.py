"""The Python functions of torch that spyre replaces (all of them, in this one file).

1. ``torch.accelerator``.

For a PrivateUse1 backend registered from Python, torch 2.13's C++ side hard-codes part of
``torch.accelerator`` (``torch/csrc/acc/Module.cpp``: the Python device guard always reports device 0,
cannot synchronize, and no C++ ``DeviceAllocator`` exists, so the memory functions fail an internal
assert). ``device_count``, ``is_available`` and ``current_accelerator`` already go through the device
module. The functions below are replaced by thin wrappers that call ``torch.spyre`` when the current
accelerator is spyre and the original otherwise.

2. ``torch._tensor_str.tensor_totype``: printing a tensor converts its non-zero finite values to float64
   *on the device*; the card has no float64, so spyre is treated as torch treats MPS and MAIA (float32).

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

import functools
from typing import Any, Callable

import torch

# torch.accelerator attribute -> torch.spyre function (same meaning, same arguments)
_MEMORY = {
    "memory_stats": "memory_stats",
    "empty_cache": "empty_cache",
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
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == "spyre"


def _wrap(original: Callable, name: str) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _is_spyre():
            return getattr(torch.spyre, name)(*args, **kwargs)
        return original(*args, **kwargs)

    wrapper.__spyre_original__ = original  # type: ignore[attr-defined]
    return wrapper


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


def _patch_printing() -> None:
    import torch._tensor_str as ts

    original = ts.tensor_totype

    @functools.wraps(original)
    def tensor_totype(t):
        if t.device.type == "spyre":
            return t.to(dtype=torch.float)
        return original(t)

    tensor_totype.__spyre_original__ = original  # type: ignore[attr-defined]
    ts.tensor_totype = tensor_totype


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
    _patch_printing()
    _patch_module_conversion_keeps_parameters()
    import torch.accelerator as acc
    import torch.accelerator.memory as acc_memory

    for attr, name in _MEMORY.items():
        original = getattr(acc_memory, attr)
        wrapped = _wrap(original, name)
        setattr(acc_memory, attr, wrapped)
        if getattr(acc, attr, None) is original:
            setattr(acc, attr, wrapped)
    for attr, name in _DEVICE.items():
        if hasattr(acc, attr):
            setattr(acc, attr, _wrap(getattr(acc, attr), name))
    original_ctx = acc.device_index

    def device_index(device: Any, /):
        return _device_index(device) if _is_spyre() else original_ctx(device)

    acc.device_index = device_index
    _patched = True

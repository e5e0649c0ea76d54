"""What spyre replaces in torch's Python functions, and when: the device's side of two patches.

The patching itself is done by the seam, ``torch_spyre/_torch/device.py``; docs/architecture.md
("Patches of torch's global state") lists every patch torch_spyre makes and why. The two here:

1. ``torch.accelerator``.

For a PrivateUse1 backend registered from Python, torch 2.13's C++ side hard-codes part of
``torch.accelerator`` (``torch/csrc/acc/Module.cpp``: the Python device guard always reports device 0,
cannot synchronize, and no C++ ``DeviceAllocator`` exists, so the memory functions fail an internal
assert). ``device_count``, ``is_available`` and ``current_accelerator`` already go through the device
module. The functions below are replaced by thin wrappers that call ``torch.spyre`` when the current
accelerator is spyre and the original otherwise.

2. Tensor printing (``tensor_totype``) converts a tensor's non-zero finite values to float64 *on the
   device*; the card has no float64, so spyre is treated as torch treats MPS and MAIA (float32).

tests/device/test_torch_patches.py checks each one, so a torch release that changes them is noticed.
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch import device as torch_device

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


def patch() -> None:
    global _patched
    if _patched:
        return
    torch_device.print_as_float32("spyre")
    torch_device.route_accelerator_functions(lambda: torch.spyre, _MEMORY, _DEVICE, _device_index, _is_spyre)
    _patched = True

"""torch.accelerator and printing for spyre (the torch functions torch_patches.py replaces)."""

from __future__ import annotations

import torch

import torch_spyre  # noqa: F401
from torch_spyre.device import torch_patches


def test_every_patched_torch_function_still_exists_in_torch():
    import torch.accelerator.memory as acc_memory

    for attr in torch_patches._MEMORY:
        assert hasattr(acc_memory.__dict__[attr], "__spyre_original__"), attr
    for attr in torch_patches._DEVICE:
        if hasattr(torch.accelerator, attr):
            assert hasattr(getattr(torch.accelerator, attr), "__spyre_original__"), attr
    assert hasattr(torch._tensor_str.tensor_totype, "__spyre_original__")


def test_the_originals_are_still_wrong_for_a_python_backend():
    # If a torch release fixes these, the patches can go: this test will say so.
    import pytest
    import torch.accelerator.memory as acc_memory

    from torch_spyre.runtime import stream as rt

    with pytest.raises(RuntimeError, match="DeviceAllocator"):
        acc_memory.memory_stats.__spyre_original__()
    torch.randn(1 << 16).to("spyre")  # queue work the host has not waited for
    clock = rt.clock(0)
    before = clock.host_frontier
    try:
        torch.accelerator.synchronize.__spyre_original__()
    except RuntimeError:
        pass
    assert clock.host_frontier == before < clock.now  # the original does not wait for the simulated card
    torch.accelerator.synchronize()
    assert clock.host_frontier == clock.now


def test_accelerator_device_functions():
    assert torch.accelerator.current_accelerator() == torch.device("spyre")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.spyre.device_count()
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(0)
    s = torch.accelerator.current_stream()
    assert s == torch.spyre.current_stream()
    torch.ones(10, device="spyre").cpu()
    torch.accelerator.synchronize()
    assert torch_patches._is_spyre()
    with torch.accelerator.device_index(0):
        assert torch.spyre.current_device() == 0


def test_accelerator_memory_functions(settled):
    base = settled()
    t = torch.empty(5, 100, dtype=torch.float16, device="spyre")
    assert torch.accelerator.memory_allocated() == base + 1280
    assert torch.accelerator.memory_allocated(0) == torch.spyre.memory_allocated(0)
    assert torch.accelerator.max_memory_allocated() >= base + 1280
    assert torch.accelerator.memory_reserved() == torch.spyre.memory_reserved()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == base + 1280
    free, total = torch.accelerator.get_memory_info()
    assert (free, total) == torch.spyre.mem_get_info()
    del t
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == settled()
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == torch.spyre.memory_allocated()


def test_printing_does_not_need_float64_on_the_card():
    t = torch.tensor([1e-3, 12345.678, float("nan")]).to("spyre")
    assert "device='spyre:0'" in str(t)

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


# Every torch.accelerator function, called once a spyre tensor exists (the device is initialized: torch's
# C++ side then reaches for allocators a Python backend does not have). Run in a fresh interpreter so
# that a crash (SIGSEGV) fails the test instead of killing pytest. The table must name every function
# of torch.accelerator.__all__, so a function a torch release adds is called here too.
_EVERY_ACCELERATOR_FUNCTION = """
import torch

acc = torch.accelerator
x = torch.ones(4).to("spyre")
calls = {
    "current_accelerator": lambda: acc.current_accelerator() == torch.device("spyre"),
    "is_available": lambda: acc.is_available(),
    "device_count": lambda: acc.device_count() == torch.spyre.device_count(),
    "current_device_index": lambda: acc.current_device_index() == 0,
    "current_device_idx": lambda: acc.current_device_idx() == 0,
    "set_device_index": lambda: acc.set_device_index(0) is None,
    "set_device_idx": lambda: acc.set_device_idx(0) is None,
    "device_index": lambda: acc.device_index(0).__enter__() is None,
    "get_device_capability": lambda: torch.float16 in acc.get_device_capability()["supported_dtypes"],
    "current_stream": lambda: acc.current_stream() == torch.spyre.current_stream(),
    "set_stream": lambda: acc.set_stream(acc.current_stream()) is None,
    "synchronize": lambda: acc.synchronize() is None,
    "memory_allocated": lambda: acc.memory_allocated() == torch.spyre.memory_allocated() > 0,
    "max_memory_allocated": lambda: acc.max_memory_allocated() >= acc.memory_allocated(),
    "memory_reserved": lambda: acc.memory_reserved() >= acc.memory_allocated(),
    "max_memory_reserved": lambda: acc.max_memory_reserved() >= acc.memory_reserved(),
    "memory_stats": lambda: acc.memory_stats()["allocated_bytes.all.current"] == acc.memory_allocated(),
    "get_memory_info": lambda: acc.get_memory_info() == torch.spyre.mem_get_info(),
    "reset_peak_memory_stats": lambda: acc.reset_peak_memory_stats() is None,
    "reset_accumulated_memory_stats": lambda: acc.reset_accumulated_memory_stats() is None,
    "empty_cache": lambda: acc.empty_cache() is None,
    "empty_host_cache": lambda: acc.empty_host_cache() is None and acc.memory.empty_host_cache() is None,
}


def graph_refused():
    try:
        acc.Graph()
    except RuntimeError as e:  # no graph capture on spyre: a clear error, not a crash
        return "not supported on device type: spyre" in str(e)
    return False


calls["Graph"] = graph_refused
assert set(calls) == set(acc.__all__), sorted(set(acc.__all__) ^ set(calls))
for name, call in calls.items():
    assert call() is True, name
assert torch.equal(x.cpu(), torch.ones(4))
print("all", len(calls))
"""


def test_every_accelerator_function_works_once_a_spyre_tensor_exists(run_python):
    r = run_python(_EVERY_ACCELERATOR_FUNCTION)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert f"all {len(torch.accelerator.__all__)}" in r.stdout


def test_the_original_empty_host_cache_still_crashes_a_python_backend(run_python):
    # torch's C++ empty_host_cache calls through the null host allocator of PrivateUse1 (SIGSEGV), once
    # the device is initialized. If a torch release fixes it, the routing of empty_host_cache can go.
    r = run_python("""
        import torch
        torch.ones(4).to("spyre")
        torch.accelerator.memory.empty_host_cache.__spyre_original__()
        print("survived")
    """)
    assert r.returncode == -11 and "survived" not in r.stdout, (r.returncode, r.stderr[-2000:])

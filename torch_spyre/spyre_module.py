"""``torch.spyre``: the device module, mirroring ``torch.cuda``.

Registered as ``torch.spyre`` when the device is registered. Heavy modules (the card model, the
configuration) are imported on first use, so registering the device inside ``import torch`` stays cheap.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Iterable

import torch

from .runtime import stream as _rt
from .runtime.stream import Event, WorkRecord  # noqa: F401 - re-exported
from .runtime.timing_only import NoDataError, timing_only  # noqa: F401 - re-exported

__all__ = [
    "Event", "Stream", "current_device", "current_stream", "default_stream", "device", "device_count",
    "device_of", "empty_cache", "empty_host_cache", "get_device_name", "get_device_properties", "get_rng_state",
    "initial_seed", "is_available", "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_stats",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats", "seed", "seed_all", "set_device",
    "set_rng_state", "set_stream", "stream", "synchronize", "timing_only", "NoDataError",
]


def _cards():
    from .device import cards

    return cards


def _mem():
    from .device import memory_stats

    return memory_stats


# --- devices ---------------------------------------------------------------------------------------
def is_available() -> bool:
    """Always True: the card is simulated."""
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Number of simulated cards (``TORCH_SPYRE_NUM_CARDS``, default 1)."""
    return _cards().device_count()


def current_device() -> int:
    return _rt.current_card()


def set_device(device: Any) -> None:
    _rt.set_current_card(_cards().index_of(device))


def _index(device: Any) -> int:
    return _cards().index_of(device)


class device:
    """Context manager that makes ``device`` the current spyre card (``with torch.spyre.device(1):``)."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = _rt.current_card()
        if self.idx >= 0:
            _rt.set_current_card(self.idx)

    def __exit__(self, *exc: Any) -> None:
        _rt.set_current_card(self.prev_idx)


class device_of(device):
    """Context manager that makes the card of tensor ``obj`` current."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.device.index if obj.device.type == "spyre" else None)


def get_device_name(device: Any = None) -> str:
    _index(device)
    return "IBM Spyre (simulated)"


def get_device_properties(device: Any = None) -> SimpleNamespace:
    idx = _index(device)
    cfg = _cards().config()
    return SimpleNamespace(
        name=get_device_name(idx), index=idx, total_memory=cfg.dram_capacity_bytes, num_cores=cfg.num_cores,
        clock_hz=cfg.clock_hz, peak_fp16_flops=cfg.peak_fp16_flops,
        dram_bandwidth=cfg.dram_peak_bandwidth, scratchpad_bytes=cfg.scratchpad_bytes,
    )


def get_device_capability(device: Any = None) -> dict[str, Any]:
    idx = _index(device)
    from .device.dtypes import DEVICE_DTYPE

    return {"supported_dtypes": list(DEVICE_DTYPE), "index": idx}


def synchronize(device: Any = None) -> None:
    """Make the host wait (in simulated time) for all work queued on the card."""
    _rt.clock(_index(device)).synchronize()


# --- streams ---------------------------------------------------------------------------------------
class Stream(_rt.Stream):
    """A stream on a spyre card (``torch.spyre.Stream(device=None, priority=0)``)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        super().__init__(_index(device), priority, **kwargs)


def current_stream(device: Any = None) -> _rt.Stream:
    return _rt.current_stream(_index(device))


def default_stream(device: Any = None) -> _rt.Stream:
    return _rt.default_stream(_index(device))


def set_stream(stream: _rt.Stream) -> None:
    if stream is not None:
        _rt.set_stream(stream)


def stream(stream: _rt.Stream | None) -> _rt.stream_context:
    """``with torch.spyre.stream(s):`` queues work on ``s`` (and makes its card current)."""
    return _rt.stream_context(stream)


# --- memory ----------------------------------------------------------------------------------------
def memory_allocated(device: Any = None) -> int:
    return _mem().memory_allocated(device)


def max_memory_allocated(device: Any = None) -> int:
    return _mem().max_memory_allocated(device)


def memory_reserved(device: Any = None) -> int:
    return _mem().memory_reserved(device)


def max_memory_reserved(device: Any = None) -> int:
    return _mem().max_memory_reserved(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    _mem().reset_peak_memory_stats(device)


def reset_max_memory_allocated(device: Any = None) -> None:
    _mem().reset_max_memory_allocated(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _mem().reset_accumulated_memory_stats(device)


def memory_stats(device: Any = None):
    return _mem().memory_stats(device)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return _mem().mem_get_info(device)


def empty_cache() -> None:
    _mem().empty_cache()


def empty_host_cache() -> None:
    """Release cached pinned host memory: spyre keeps none (``pin_memory()`` for spyre returns ordinary
    memory, device/kernels.py), so there is nothing to release. ``torch.accelerator.empty_host_cache``
    comes here (torch's own asks C++ for a PrivateUse1 host allocator, which a Python backend cannot
    register, and crashed: device/torch_patches.py)."""


# --- random numbers (random eager ops draw from a per-card generator) -----------------------------
def manual_seed(seed: int) -> None:
    _cards().generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _cards().generator(i).manual_seed(int(seed))


def seed() -> None:
    _cards().generator(None).seed()


def seed_all() -> None:
    for i in range(device_count()):
        _cards().generator(i).seed()


def initial_seed() -> int:
    return _cards().generator(None).initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    return _cards().generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    _cards().generator(_index(device)).set_state(new_state)


def _get_device_index(device: Any, optional: bool = False) -> int:
    if isinstance(device, str) and device.startswith("spyre") or isinstance(device, (torch.device, int)):
        return _index(device)
    if device is None and optional:
        return current_device()
    raise ValueError(f"expected a spyre device, got {device!r}")


# torch.serialization asks torch.<backend>._utils._get_device_index(location, True).
_utils = SimpleNamespace(_get_device_index=_get_device_index)


# Names a higher layer answers (the compiler: Inductor looks up torch.spyre.Scheduling / PythonWrapperCodegen /
# CppWrapperCodegen on the first compile for a PrivateUse1 device, compiler/hooks.py): name -> getter(name),
# called on each lookup. The device module itself never imports the compiler.
_provided: dict[str, Callable[[str], Any]] = {}


def provide(names: Iterable[str], getter: Callable[[str], Any]) -> None:
    """Answer ``torch.spyre.<name>`` for each of ``names`` with ``getter(name)`` (looked up each time)."""
    for name in names:
        _provided[name] = getter


def __getattr__(name: str) -> Any:
    getter = _provided.get(name)
    if getter is not None:
        return getter(name)
    raise AttributeError(f"module 'torch.spyre' has no attribute {name!r}")

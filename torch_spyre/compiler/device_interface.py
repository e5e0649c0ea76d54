"""What Dynamo and Inductor ask about device ``spyre``: the device interface and the wrapper's op overrides.

Registered by ``backend.register``. :func:`device_properties` describes the card (its 32 cores as
``multi_processor_count``, memory, scratchpad, stick size) from the card configuration.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from .._torch import inductor as torch_inductor

DEVICE = "spyre"


def device_properties(device: Any = None) -> SimpleNamespace:
    """What Inductor asks about the card: its 32 cores (``multi_processor_count``), memory, name."""
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
    class SpyreDeviceInterface(torch_inductor.DeviceInterfaceBase):
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
    class SpyreDeviceOpOverrides(torch_inductor.DeviceOpOverridesBase):
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

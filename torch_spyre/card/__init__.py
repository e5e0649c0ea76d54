"""The simulated Spyre card: hardware figures, DLFloat16, stick layouts, device memory, programs' execution.

Nothing here imports PyTorch's device machinery; the card can be driven alone with hand-written programs.
"""

from .card import Card
from .config import CardConfig, ConfigError, load_config
from .layout import StickLayout, default_layout
from .memory import Allocation, DeviceMemory, DeviceOutOfMemoryError

__all__ = [
    "Allocation",
    "Card",
    "CardConfig",
    "ConfigError",
    "DeviceMemory",
    "DeviceOutOfMemoryError",
    "StickLayout",
    "default_layout",
    "load_config",
]

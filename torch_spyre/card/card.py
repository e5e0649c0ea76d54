"""One simulated Spyre card: its configuration and its device memory.

Program execution (functional and timed) attaches here through :mod:`torch_spyre.card.execute` and
:mod:`torch_spyre.card.timing`; the card knows nothing of PyTorch's device machinery.
"""

from __future__ import annotations

from .config import CardConfig
from .memory import DeviceMemory


class Card:
    def __init__(self, index: int, config: CardConfig):
        self.index = index
        self.config = config
        self.memory = DeviceMemory(config.dram_capacity_bytes, card=index)

    def __repr__(self) -> str:
        return f"Card(spyre:{self.index}, {self.config.num_cores} cores, {self.config.clock_hz / 1e9:.2f} GHz)"

"""The simulated system: the configuration, one :class:`~torch_spyre.card.Card` per ``spyre:N``, the current card.

Everything is created lazily on first use, so that registering the device (which runs inside
``import torch`` through the autoload entry point) never reads the configuration: an invalid
configuration is reported when the card is first used, not as a crash of ``import torch``.
"""

from __future__ import annotations

import threading

import torch

from ..errors import SpyreError
from ..card import Card, CardConfig, load_config
from ..runtime import stream as rt

_lock = threading.RLock()
_config: CardConfig | None = None
_cards: dict[int, Card] = {}
_generators: dict[int, torch.Generator] = {}


class InvalidDeviceError(SpyreError, RuntimeError):
    pass


def config() -> CardConfig:
    global _config
    if _config is not None:  # no lock on the path every op takes (assigning a global is atomic)
        return _config
    with _lock:
        if _config is None:
            _config = load_config()
        return _config


def device_count() -> int:
    return config().num_cards


def check_index(index: int | None) -> int:
    """The card index for ``spyre:index`` (``None`` = the current card), or a clear error."""
    if index is None:
        index = rt.current_card()
    index = int(index)
    n = device_count()
    if not 0 <= index < n:
        raise InvalidDeviceError(
            f"spyre:{index} does not exist: the simulated system has {n} card(s) (spyre:0..spyre:{n - 1}). "
            f"Use a smaller index, or simulate more cards with TORCH_SPYRE_NUM_CARDS (up to 8)."
        )
    return index


def index_of(device: torch.device | str | int | None) -> int:
    """Card index of a device spec (``"spyre:1"``, ``torch.device``, int or None for the current card)."""
    if device is None:
        return check_index(None)
    if isinstance(device, int):
        return check_index(device)
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "spyre":
        raise ValueError(f"expected a spyre device, got {device}")
    return check_index(device.index)


def card(index: int | None = None) -> Card:
    index = check_index(index)
    c = _cards.get(index)  # cards are only ever added: no lock once made
    if c is not None:
        return c
    with _lock:
        c = _cards.get(index)
        if c is None:
            c = _cards[index] = Card(index, config())
        return c


def generator(index: int | None = None) -> torch.Generator:
    """The card's random generator (random eager ops draw from it on the host)."""
    index = check_index(index)
    with _lock:
        g = _generators.get(index)
        if g is None:
            g = _generators[index] = torch.Generator()
            g.manual_seed(torch.initial_seed() + index)
        return g

"""The registry of adapters: named rewrites of Hugging Face model code into forms the card runs well.

An adapter says which models it applies to (``applies``), rewrites the model in place (``apply``), and
states the failure or slowdown it fixes with the measured before and after (``fixes``): an adapter is
registered only for a failure or slowdown that was measured (``spyre coverage``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Adapter:
    name: str
    fixes: str  # the failure or slowdown, with the measured before and after
    applies: Callable[[torch.nn.Module], bool]
    apply: Callable[[torch.nn.Module], None]


_REGISTRY: dict[str, Adapter] = {}


def register(adapter: Adapter) -> Adapter:
    if adapter.name in _REGISTRY:
        raise ValueError(f"an adapter named {adapter.name!r} is already registered")
    _REGISTRY[adapter.name] = adapter
    return adapter


def registered() -> dict[str, Adapter]:
    """Name -> adapter, in registration order."""
    return dict(_REGISTRY)


def get(name: str) -> Adapter:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"no adapter named {name!r}; the adapters are: {', '.join(_REGISTRY) or 'none'}") from None

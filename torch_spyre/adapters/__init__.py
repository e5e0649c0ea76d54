"""Adapters: named rewrites of Hugging Face model code into forms the Spyre card runs (``registry.py``).

    torch_spyre.adapters.adapt(model)                    every registered adapter that applies
    torch_spyre.adapters.adapt(model, ["moe_batched_mm"])  exactly these, and no automatic ones later
    torch_spyre.adapters.adapt(model, adapters=[])       none, and none later (opt out)

The applied set is ``model.spyre_adapters`` (a tuple of names). A transformers model is adapted
automatically when it reaches spyre (``auto.py``: its own ``.to``, a container's ``.to`` such as a
SentenceTransformer's, or ``from_pretrained(..., device_map="spyre")``), which covers ``torch.compile`` of a
model on spyre too; adapting is idempotent and cheap (a few attribute checks).
"""

from __future__ import annotations

import torch

from . import moe, rope, fourier  # noqa: F401, I001 - register their adapters, in this order
from .registry import Adapter, get, register, registered

__all__ = ["Adapter", "adapt", "get", "register", "registered"]

_OPTED_OUT = "_spyre_adapters_opted_out"


def adapt(model: torch.nn.Module, adapters: list[str] | None = None) -> torch.nn.Module:
    """Apply ``adapters`` to ``model`` in place and return it. None: every registered adapter that applies;
    a list of names: exactly those (an unknown name raises ValueError listing the known ones), and the
    automatic adaptation will add no others ([] opts out). ``model.spyre_adapters`` lists what was applied."""
    chosen = list(registered().values()) if adapters is None else [get(name) for name in adapters]
    applied = list(getattr(model, "spyre_adapters", ()))
    if adapters is not None:
        setattr(model, _OPTED_OUT, True)
    for adapter in chosen:
        if adapter.name not in applied and adapter.applies(model):
            adapter.apply(model)
            applied.append(adapter.name)
    setattr(model, "spyre_adapters", tuple(applied))
    return model


def auto_adapt(model: torch.nn.Module) -> None:
    """The automatic adaptation (a model moved to spyre), unless the model opted out."""
    if not getattr(model, _OPTED_OUT, False):
        adapt(model)

"""The card as vLLM's serving code sees it: the device, the compiled attention kernel, its scale tensor.

The compiled kernel is process-wide and holds no device memory (its programs are host objects); device
tensors belong to the LLM that made them."""

from __future__ import annotations

import functools

import torch

from .paged_attention import paged_attention

_card = 0  # this process's card: the TP rank's local rank (worker.py), 0 without tensor parallel


def use_card(index: int) -> None:
    """Serve on ``spyre:index`` from now on in this process (each TP worker process owns one card)."""
    global _card
    torch.spyre.set_device(index)  # checks the index against num_cards; ops without an index land here too
    _card = index


def card_device() -> torch.device:
    return torch.device("spyre", _card)


@functools.cache
def compiled_attention():
    """``paged_attention`` compiled for the card with symbolic sizes: one graph, and each bucket shape costs
    one generated program (docs/compiler.md, "Shapes"), kept in the kernel's bounded shape cache."""
    return torch.compile(paged_attention, dynamic=True)


def softmax_scale(scale: float) -> torch.Tensor:
    """The softmax scale as a float32 0-d tensor on this process's card. Callers keep it with the layer that
    owns it (not in a process-wide cache): card memory an LLM made must go when the LLM goes."""
    return torch.tensor(scale, dtype=torch.float32).to(card_device())

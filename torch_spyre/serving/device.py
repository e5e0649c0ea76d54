"""The card as vLLM's serving code sees it: the device, the compiled attention kernel, its scale tensors."""

from __future__ import annotations

import functools

import torch

from .paged_attention import paged_attention

DEVICE = torch.device("spyre", 0)


@functools.cache
def compiled_attention():
    """``paged_attention`` compiled for the card with symbolic sizes: one graph, and each bucket shape costs
    one generated program (docs/compiler.md, "Shapes"), kept in the kernel's bounded shape cache."""
    return torch.compile(paged_attention, dynamic=True)


@functools.cache
def softmax_scale(scale: float) -> torch.Tensor:
    """The softmax scale as a float32 0-d spyre tensor, made once per value."""
    return torch.tensor(scale, dtype=torch.float32).to(DEVICE)

"""The card as vLLM's serving code sees it: the device, the compiled attention kernel, its scale tensor.

The compiled kernel is process-wide and holds no device memory (its programs are host objects); device
tensors belong to the LLM that made them."""

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


def softmax_scale(scale: float) -> torch.Tensor:
    """The softmax scale as a float32 0-d spyre tensor. Callers keep it with the layer that owns it (not in
    a process-wide cache): card memory an LLM made must go when the LLM goes."""
    return torch.tensor(scale, dtype=torch.float32).to(DEVICE)

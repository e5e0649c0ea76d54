"""Memory statistics of the simulated cards, mirroring ``torch.cuda``'s (exact whenever read)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from . import cards, tensor


def _memory(device=None):
    tensor.release_freed()  # storages that died since the last call are freed before reading
    return cards.card(cards.index_of(device)).memory


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by live tensors (whole sticks, padding included)."""
    return _memory(device).allocated


def max_memory_allocated(device=None) -> int:
    return _memory(device).peak_allocated


def memory_reserved(device=None) -> int:
    """Bytes held by the caching allocator: live blocks plus freed blocks kept for reuse."""
    return _memory(device).reserved


def max_memory_reserved(device=None) -> int:
    return _memory(device).peak_reserved


def reset_peak_memory_stats(device=None) -> None:
    _memory(device).reset_peak()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    mem = _memory(device)
    mem.reset_counters()


def memory_stats(device=None) -> "OrderedDict[str, Any]":
    """``torch.cuda.memory_stats``-style counters (the ``all`` pool; the card has one pool)."""
    mem = _memory(device)
    raw = mem.stats()
    stats = {
        **raw,
        "active_bytes.all.current": mem.allocated,
        "active_bytes.all.peak": mem.peak_allocated,
        "allocation.all.current": raw["active.all.current"],
        "num_alloc_calls": mem.num_alloc_calls,
        "num_free_calls": mem.num_free_calls,
        "capacity_bytes": mem.capacity,
    }
    return OrderedDict(sorted(stats.items()))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the card, as the driver would see them (reserved blocks are not free)."""
    mem = _memory(device)
    return mem.capacity - mem.reserved, mem.capacity


on_empty_cache = tensor.on_empty_cache  # the registry lives with the allocator, which drops them on a full card


def empty_cache() -> None:
    """Drop the caches registered with :func:`on_empty_cache` (their tensors are freed), then return every
    card's cached (freed, reusable) blocks: ``memory_reserved`` drops to ``memory_allocated``."""
    tensor.drop_caches()
    for i in range(cards.device_count()):
        cards.card(i).memory.empty_cache()

"""An eager fp32 matmul's weight, split into its DLFloat16 parts once and reused across calls.

At every fp32 matmul precision the PE arrays multiply 16-bit parts of the operands (``fp32_matmul.py``):
an eager ``nn.Linear`` (``aten.addmm.out(bias, x, w.t(), out=)``) split ``w`` into its parts in a
pointwise kernel at every call, though ``w`` had not changed. The eager path (``eager.py``) now splits
the B operand of an fp32 ``addmm``/``mm`` once, into a device tensor of its K-concatenated parts
(:func:`parts_op`, the program of ``fp32_matmul.b_concatenated``), keeps it here, and runs the matmul on
those parts (:func:`matmul_op`: only A is split in the call). The parts are exactly what the call's own
split kernel wrote, so the results are bit for bit the same.

A cached entry is keyed on where B lies (its storage, offset, shape, strides, dtype), the matmul precision,
the card and what else a program depends on (``kernel_runtime.generation_key``), and it holds B's version
counter value: an in-place write to the weight or to any view of it (``w.add_(1)``, ``copy_`` of a
``load_state_dict``) bumps the counter, and the next call splits again. Only tensors with a version counter
are cached: inference tensors (activations under ``torch.inference_mode``) have none. Writes that bypass the
counter (through ``w.data``, or through another tensor made on the same storage with ``set_``) are not
seen; that is PyTorch's own contract for version counters. The cache is an LRU bounded by bytes of device
memory on each card (``TORCH_SPYRE_WEIGHT_PARTS_CACHE_BYTES``: a number of bytes, ``"4GiB"``, or a
percentage of the card's capacity, default 25 %), an entry's bytes being those of its parts' allocation
(whole sticks): not by a number of entries, since a large model's parts at "highest" are three times its fp32
weights. ``TORCH_SPYRE_WEIGHT_PARTS_CACHE=0`` turns it off. An entry's device memory is freed
when it is evicted or replaced, when its next lookup finds B written since, when B's storage dies (a
finalizer on the storage), or at ``torch.spyre.empty_cache()`` (which drops the whole cache, counters kept);
the allocator drops it too before it reports the card out of memory (``device/tensor.py``). Parts split in
timing-only mode hold no values: they serve later timing-only calls, and the first call run for real splits
again. A split or matmul that still runs out of device memory empties this cache and the call goes the
ordinary way (the parts are an optimization, never the reason a call fails). Memory: the parts of "highest"
take 12 bytes per weight element (six 16-bit parts along K), three times the fp32 weight.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from .._torch.device import version_of
from ..device import cards
from ..device.memory_stats import on_empty_cache
from ..device.storage import allocation_of
from ..device.tensor import has_data
from ..runtime import timing_only
from ..util.bounded_cache import BoundedCache
from . import fp32_matmul

ENV = "TORCH_SPYRE_WEIGHT_PARTS_CACHE"  # "0": off; "1" (default): on
BUDGET_ENV = "TORCH_SPYRE_WEIGHT_PARTS_CACHE_BYTES"  # bytes of each card's memory the parts may hold
DEFAULT_BUDGET = "25%"  # of the card's capacity: room for the parts of a model 1/12 of the card at "highest"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
PARTS_OP = "fp32_b_parts"
MATMUL_OP = "fp32_mm_b_parts"


# ---------------------------------------------------------------------------------------------
# The two ops the eager path compiles
# ---------------------------------------------------------------------------------------------
def _concatenated_eager(x: torch.Tensor, side: int) -> torch.Tensor:
    """``fp32_matmul``'s K-concatenated parts of operand ``side`` (0: A, 1: B), in torch ops: the ops'
    eager and CPU reference."""
    passes = fp32_matmul.passes()
    parts, rest = [], x
    for _ in range(1 + max(max(p) for p in passes)):
        parts.append(rest.to(torch.float16))
        rest = rest - parts[-1].float()
    if len(passes) == 1:
        return parts[passes[0][side]]
    k_dim = -1 if side == 0 else -2
    pad = -x.shape[k_dim] % fp32_matmul.STICK_ELEMENTS
    parts = [torch.nn.functional.pad(p, [0, pad] if side == 0 else [0, 0, 0, pad]) for p in parts]
    return torch.cat([parts[p[side]] for p in reversed(passes)], k_dim)


def _parts_eager(b: torch.Tensor) -> torch.Tensor:
    return _concatenated_eager(b, 1)


def _parts_meta(b: torch.Tensor) -> torch.Tensor:
    rows = fp32_matmul.b_parts_rows(b.shape[-2], fp32_matmul.passes())
    return b.new_empty((rows, b.shape[-1]), dtype=torch.float16)


def _matmul_eager(a, b_parts, bias, beta: float, alpha: float) -> torch.Tensor:
    product = alpha * (_concatenated_eager(a, 0).float() @ b_parts.float())
    return product if bias is None else product + beta * bias


def _matmul_meta(a, b_parts, bias, beta: float, alpha: float) -> torch.Tensor:
    return a.new_empty((a.shape[0], b_parts.shape[-1]))


def parts_op() -> Any:
    """``spyre::fp32_b_parts(b)``: fp32 ``b`` ``[K, N]`` as its DLFloat16 parts stacked along K at the current
    matmul precision (``fp32_matmul.b_concatenated``), 16-bit ``[fp32_matmul.b_parts_rows(K), N]``."""
    from .epilogue import define_device_op

    return define_device_op(PARTS_OP, "(Tensor b) -> Tensor", _parts_eager, _parts_meta)


def matmul_op() -> Any:
    """``spyre::fp32_mm_b_parts(a, b_parts, bias, beta, alpha)``: ``beta * bias + alpha * a @ b`` for fp32 ``a``
    ``[M, K]`` and ``b`` given as :func:`parts_op`'s result; one matmul kernel, as ``addmm``/``mm`` is."""
    from .epilogue import define_device_op

    return define_device_op(MATMUL_OP, "(Tensor a, Tensor b_parts, Tensor? bias, float beta, float alpha) -> Tensor",
                            _matmul_eager, _matmul_meta)


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------
def enabled() -> bool:
    """False when ``TORCH_SPYRE_WEIGHT_PARTS_CACHE=0`` (the weight is split in every call)."""
    value = os.environ.get(ENV, "").strip()
    if value in ("", "1"):
        return True
    if value == "0":
        return False
    raise ValueError(f"{ENV}={value!r}: expected 0 (off) or 1 (on); the cache is bounded by bytes of device "
                     f"memory, set with {BUDGET_ENV} (e.g. 4GiB or 25%)")


def budget(card: int) -> int:
    """Bytes of card ``card``'s memory the cached parts may hold (``TORCH_SPYRE_WEIGHT_PARTS_CACHE_BYTES``)."""
    value = os.environ.get(BUDGET_ENV, "").strip() or DEFAULT_BUDGET
    text = value.replace("_", "").replace(" ", "").upper()
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 <= percent <= 100:
                raise ValueError
            return int(cards.card(card).memory.capacity * percent / 100)
        number = text.rstrip("KMGTIB")
        unit = _UNITS[text[len(number):]]
        size = float(number) * unit
        if size < 0 or size != size or size == float("inf"):
            raise ValueError
        return int(size)
    except (ValueError, KeyError):
        raise ValueError(f"{BUDGET_ENV}={value!r} is not a byte budget: expected a number of bytes (1073741824), "
                         f"one with a unit (512MiB, 4GiB, 2GB) or a percentage of the card's memory (0-100%)") from None


def cacheable(b: Any) -> bool:
    """True for a spyre fp32 tensor with a version counter (not an inference tensor)."""
    return (isinstance(b, torch.Tensor) and b.device.type == "spyre" and b.dtype == torch.float32
            and not b.is_inference())


@dataclass
class _Entry:
    version: int
    parts: torch.Tensor
    storage: weakref.ref
    token: int
    card: int
    nbytes: int  # of the parts' allocation (whole sticks), what the entry holds of the card
    finalizer: Any = None  # weakref.finalize on B's storage; detached when the entry goes first


def _drop(key: tuple, entry: _Entry) -> None:
    """An entry leaves the cache: its storage's finalizer is no longer needed (one per live entry, not one per
    store: a weight written every step would pile them up)."""
    if entry.finalizer is not None:
        entry.finalizer.detach()


class _Cache:
    """One LRU per card, each bounded by that card's :func:`budget` (set at each store)."""

    def __init__(self):
        self.cards: dict[int, BoundedCache[tuple, _Entry]] = {}
        self.hits = self.misses = self.invalidations = self.released = self.oversized = 0

    def of(self, card: int) -> BoundedCache[tuple, _Entry]:
        if card not in self.cards:
            self.cards[card] = BoundedCache(0, on_drop=_drop)
        return self.cards[card]

    @property
    def entries(self) -> dict[tuple, _Entry]:
        return {key: entry for cache in self.cards.values() for key, entry in cache.items()}

    @property
    def evictions(self) -> int:
        return sum(cache.evictions for cache in self.cards.values())

    def get(self, key: tuple) -> _Entry | None:
        for cache in self.cards.values():  # a handful of cards
            if key in cache:
                return cache.get(key)
        return None

    def pop(self, key: tuple) -> _Entry | None:
        for cache in self.cards.values():
            if key in cache:
                return cache.pop(key)
        return None


_lock = threading.RLock()
_tokens = itertools.count()
_cache = _Cache()


def key_of(b: torch.Tensor, card: int, context: tuple) -> tuple:
    """Where ``b`` lies, and what the parts depend on besides its values (``context``: precision, program
    generation)."""
    storage = b.untyped_storage()
    return (storage.data_ptr(), b.storage_offset(), tuple(b.shape), b.stride(), b.dtype, card,
            fp32_matmul.precision(), context)


def lookup(b: torch.Tensor, key: tuple) -> torch.Tensor | None:
    """``b``'s cached parts if they were split from its current version and storage."""
    with _lock:
        entry = _cache.get(key)
        if entry is None:
            _cache.misses += 1
            return None
        stale = entry.version != version_of(b) or entry.storage() is not b.untyped_storage()
        # Parts split in timing-only mode hold no values: fine for timing, useless once B is run for real.
        if stale or (not has_data(entry.parts) and not timing_only.enabled()):
            _cache.pop(key)  # written since (or a new storage at the same address): split again
            _cache.invalidations += 1
            _cache.misses += 1
            return None
        _cache.hits += 1
        return entry.parts


def store(b: torch.Tensor, key: tuple, parts: torch.Tensor, version: int) -> None:
    """Keep ``parts`` as ``b``'s at ``version``; dropped when ``b``'s storage dies, or least recently used first
    when the card's entries would hold more than :func:`budget` bytes."""
    if not enabled():
        return
    card = parts.device.index or 0
    limit = budget(card)
    alloc = allocation_of(parts)
    nbytes = alloc.nbytes if alloc is not None else 0
    with _lock:
        _cache.pop(key)
        cache = _cache.of(card)
        cache.bound = limit
        storage = b.untyped_storage()
        token = next(_tokens)
        entry = _Entry(version, parts, weakref.ref(storage), token, card, nbytes)
        if not cache.put(key, entry, nbytes):  # would evict everything and still not fit: not kept
            _cache.oversized += 1
            return
        entry.finalizer = weakref.finalize(storage, _release, key, token)


def _release(key: tuple, token: int) -> None:
    """B's storage died: drop its parts (unless the entry now holds other parts, of a newer storage)."""
    with _lock:
        entry = _cache.get(key)
        if entry is not None and entry.token == token:
            _cache.pop(key)
            _cache.released += 1


def stats() -> dict[str, int]:
    """``hits``, ``misses`` (splits run), ``invalidations`` (entries dropped because the weight was written),
    ``evictions`` (LRU, to stay within the budget), ``released`` (weights that died), ``oversized`` (parts
    larger than the whole budget, not kept), ``entries``, ``bytes`` (device bytes of the parts' allocations
    held, all cards), ``budget`` (card 0's byte bound; each card has its own)."""
    with _lock:
        return {"hits": _cache.hits, "misses": _cache.misses, "invalidations": _cache.invalidations,
                "evictions": _cache.evictions, "released": _cache.released, "oversized": _cache.oversized,
                "entries": sum(map(len, _cache.cards.values())),
                "bytes": sum(cache.weight for cache in _cache.cards.values()), "budget": budget(0)}


def clear() -> None:
    """Drop every cached entry (their device memory is freed) and zero the counters."""
    global _cache
    with _lock:
        _drop_all()
        _cache = _Cache()


@on_empty_cache
def _drop_all() -> None:
    """Drop every cached entry (their device memory is freed); ``torch.spyre.empty_cache()`` calls this."""
    with _lock:
        for cache in _cache.cards.values():
            cache.clear()

"""The card's LPDDR5: a device address space, backed by host memory only for what is allocated.

Allocations are whole 128-byte sticks at 128-byte-aligned device addresses. Freed blocks are kept in a
cache for reuse (like torch.cuda's caching allocator): ``reserved`` counts them, ``allocated`` does
not, and :meth:`DeviceMemory.empty_cache` returns them. Asking for more than the card holds raises
:class:`DeviceOutOfMemoryError` and changes nothing.

Programs see device addresses; PyTorch storages see the host pointer of the backing buffer. Both map
back to an :class:`Allocation` (``find`` / ``find_host``).
"""

from __future__ import annotations

import bisect
import mmap
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import SpyreError
from ..program import STICK_BYTES

DEVICE_BASE_ADDRESS = 0x1_0000_0000  # device virtual addresses start here, so 0 is never valid
CARD_ADDRESS_STRIDE = 1 << 44  # each card's addresses live in their own range: one card's address is never another's


class DeviceOutOfMemoryError(SpyreError, MemoryError):
    def __init__(self, requested: int, free: int, capacity: int, card: int):
        self.requested, self.free, self.capacity, self.card = requested, free, capacity, card
        super().__init__(
            f"spyre:{card} out of memory: tried to allocate {requested} bytes ({_human(requested)}) but only "
            f"{free} bytes ({_human(free)}) of {_human(capacity)} are free. Free tensors you no longer "
            f"need (del x), call torch.spyre.empty_cache(), or raise the simulated capacity with "
            f"TORCH_SPYRE_DRAM_CAPACITY_BYTES."
        )


class InvalidAddressError(SpyreError, ValueError):
    pass


class HostMemoryExhaustedError(SpyreError, MemoryError):
    """The host could not back a simulated allocation (the card itself still had room)."""


# Blocks this large are mapped with MAP_NORESERVE: the host commits pages only when they are touched,
# so a simulated allocation larger than the host's RAM still succeeds (as the card's would) until used.
_MMAP_THRESHOLD = 1 << 20
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python 3.11 does not export it


def _host_buffer(size: int) -> np.ndarray:
    """Zeroed host memory for ``size`` device bytes, committed only when touched."""
    if size < _MMAP_THRESHOLD:
        return np.zeros(size, dtype=np.uint8)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    return np.frombuffer(region, dtype=np.uint8)  # keeps the mapping alive as long as the array


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


def round_to_sticks(nbytes: int) -> int:
    return max(1, -(-int(nbytes) // STICK_BYTES)) * STICK_BYTES


@dataclass(eq=False)
class Allocation:
    """One block of device memory and the host buffer that simulates it."""

    address: int
    nbytes: int
    buffer: np.ndarray  # uint8, nbytes long
    meta: dict[str, Any] = field(default_factory=dict)  # owned by upper layers (e.g. the stick layout)
    live: bool = True  # False once freed: a handle kept after free() is recognisably stale
    # False when the bytes mean nothing: made or written in timing-only mode (runtime/timing_only.py), where
    # nothing is stored; readers refuse such memory instead of returning garbage.
    has_data: bool = True

    @cached_property
    def host_ptr(self) -> int:
        """Where ``buffer`` starts in host memory (the buffer of an allocation never changes; numpy's
        ``ctypes.data`` costs microseconds, and allocating and freeing asks for it several times)."""
        return int(self.buffer.ctypes.data)

    @property
    def end(self) -> int:
        return self.address + self.nbytes

    def view(self, dtype: np.dtype | type, offset: int = 0, count: int = -1) -> np.ndarray:
        """The bytes from ``offset`` as a numpy array of ``dtype`` (zero-copy)."""
        return np.frombuffer(self.buffer, dtype=dtype, count=count, offset=offset)


class DeviceMemory:
    """Device memory of one card."""

    def __init__(self, capacity: int, card: int = 0):
        self.capacity = int(capacity)
        self.card = card
        self._lock = threading.RLock()
        self._live: dict[int, Allocation] = {}  # device address -> allocation
        self._by_address: list[int] = []  # sorted device addresses of live allocations
        # Sorted (host_ptr, device address), built when find_host asks (None: stale). Only lookups by host
        # pointer need it, and keeping it sorted on every allocate and free cost more than they do.
        self._host_index: list[tuple[int, int]] | None = None
        self._cache: dict[int, list[Allocation]] = {}  # nbytes -> freed blocks kept for reuse
        # Free device address ranges, sorted by start; the virtual range is twice the capacity so
        # that fragmentation never refuses an allocation that the capacity allows.
        base = DEVICE_BASE_ADDRESS + card * CARD_ADDRESS_STRIDE
        self._free_ranges: list[list[int]] = [[base, base + 2 * self.capacity]]
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.num_alloc_calls = 0
        self.num_free_calls = 0
        self.num_ooms = 0

    # --- allocation -----------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Allocation:
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes ({nbytes})")
        size = round_to_sticks(nbytes)
        with self._lock:
            cached = self._cache.get(size)
            if cached:
                # A new handle over the cached block, so that the previous owner's handle stays dead.
                old = cached.pop()
                alloc = Allocation(old.address, old.nbytes, old.buffer)
                alloc.__dict__["host_ptr"] = old.host_ptr  # the same buffer: skip numpy's ctypes lookup
            else:
                if self.allocated + size > self.capacity:
                    # Checked before touching the cache, so that a refused request changes nothing.
                    self.num_ooms += 1
                    raise DeviceOutOfMemoryError(size, self.capacity - self.allocated, self.capacity, self.card)
                if self.reserved + size > self.capacity:
                    self.empty_cache()
                address = self._take_range(size)
                try:
                    buffer = _host_buffer(size)
                except (MemoryError, OSError) as e:
                    self._give_range(address, size)
                    raise HostMemoryExhaustedError(
                        f"spyre:{self.card} has {_human(self.capacity - self.allocated)} free, but this host could "
                        f"not reserve {_human(size)} to simulate the allocation ({e}); free host memory or use "
                        f"smaller tensors"
                    ) from None
                alloc = Allocation(address, size, buffer)
                self.reserved += size
                self.peak_reserved = max(self.peak_reserved, self.reserved)
            self._live[alloc.address] = alloc
            bisect.insort(self._by_address, alloc.address)
            self._host_index = None
            self.allocated += size
            self.peak_allocated = max(self.peak_allocated, self.allocated)
            self.num_alloc_calls += 1
            return alloc

    def free(self, alloc: Allocation) -> None:
        with self._lock:
            if self._live.pop(alloc.address, None) is None:
                raise InvalidAddressError(f"double free of device address {alloc.address:#x} on spyre:{self.card}")
            # The list is sorted: find by bisection (list.remove compares entry by entry, and a model keeps
            # hundreds of allocations live).
            del self._by_address[bisect.bisect_left(self._by_address, alloc.address)]
            self._host_index = None
            self.allocated -= alloc.nbytes
            self.num_free_calls += 1
            alloc.live = False
            self._cache.setdefault(alloc.nbytes, []).append(alloc)

    def empty_cache(self) -> None:
        with self._lock:
            for blocks in self._cache.values():
                for a in blocks:
                    self._give_range(a.address, a.nbytes)
                    self.reserved -= a.nbytes
            self._cache.clear()

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_allocated = self.allocated
            self.peak_reserved = self.reserved

    def reset_counters(self) -> None:
        """Zero the accumulated call counters (torch.cuda's reset_accumulated_memory_stats)."""
        with self._lock:
            self.num_alloc_calls = self.num_free_calls = self.num_ooms = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.allocated

    def live_allocations(self) -> list[Allocation]:
        with self._lock:
            return [self._live[a] for a in self._by_address]

    # --- lookup ---------------------------------------------------------------------------------
    def holds(self, alloc: Allocation) -> bool:
        """True if ``alloc`` is a live allocation of this memory (the handle itself, not a stale one over
        the same block): what ``find(alloc.address)`` would return, without the search."""
        return self._live.get(alloc.address) is alloc

    def find(self, address: int) -> tuple[Allocation, int]:
        """The live allocation holding device ``address``, and the offset into it."""
        with self._lock:
            i = bisect.bisect_right(self._by_address, address) - 1
            if i >= 0:
                alloc = self._live[self._by_address[i]]
                if address < alloc.end:
                    return alloc, address - alloc.address
        raise InvalidAddressError(f"device address {address:#x} is not inside any live allocation on spyre:{self.card}")

    def find_host(self, host_ptr: int) -> tuple[Allocation, int]:
        """The live allocation whose host buffer holds ``host_ptr`` (a storage's data pointer)."""
        with self._lock:
            if self._host_index is None:
                self._host_index = sorted((a.host_ptr, a.address) for a in self._live.values())
            i = bisect.bisect_right(self._host_index, (host_ptr, float("inf"))) - 1
            if i >= 0:
                alloc = self._live[self._host_index[i][1]]
                if host_ptr < alloc.host_ptr + alloc.nbytes:
                    return alloc, host_ptr - alloc.host_ptr
        raise InvalidAddressError(f"host pointer {host_ptr:#x} is not spyre:{self.card} memory")

    def read(self, address: int, nbytes: int) -> np.ndarray:
        """A zero-copy view of ``nbytes`` device bytes at ``address`` (must lie in one allocation)."""
        alloc, off = self.find(address)
        if off + nbytes > alloc.nbytes:
            raise InvalidAddressError(
                f"device range [{address:#x}, {address + nbytes:#x}) runs past the end of its allocation "
                f"[{alloc.address:#x}, {alloc.end:#x})"
            )
        return alloc.buffer[off : off + nbytes]

    def write(self, address: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self.read(address, raw.size)[:] = raw

    # --- address ranges -------------------------------------------------------------------------
    def _take_range(self, size: int) -> int:
        for r in self._free_ranges:
            if r[1] - r[0] >= size:
                start = r[0]
                r[0] += size
                if r[0] == r[1]:
                    self._free_ranges.remove(r)
                return start
        raise DeviceOutOfMemoryError(size, self.capacity - self.allocated, self.capacity, self.card)

    def _give_range(self, start: int, size: int) -> None:
        ranges = self._free_ranges
        i = bisect.bisect_left(ranges, [start, start])
        ranges.insert(i, [start, start + size])
        # Coalesce with neighbours.
        if i + 1 < len(ranges) and ranges[i][1] == ranges[i + 1][0]:
            ranges[i][1] = ranges[i + 1][1]
            del ranges[i + 1]
        if i > 0 and ranges[i - 1][1] == ranges[i][0]:
            ranges[i - 1][1] = ranges[i][1]
            del ranges[i]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "allocated_bytes.all.current": self.allocated,
                "allocated_bytes.all.peak": self.peak_allocated,
                "reserved_bytes.all.current": self.reserved,
                "reserved_bytes.all.peak": self.peak_reserved,
                "active.all.current": len(self._live),
                "num_alloc_retries": 0,
                "num_ooms": self.num_ooms,
                "num_device_alloc": self.num_alloc_calls,
                "num_device_free": self.num_free_calls,
            }

"""Device tensors: allocation with a stick layout, and every read/write of device memory through it.

Each allocation carries, in ``Allocation.meta``:

- ``layout``: the :class:`~torch_spyre.card.layout.StickLayout` of the storage's *host element space*
  (the elements every view of the storage indexes with its storage offset and strides);
- ``dtype``: the host dtype the storage was allocated for; ``encoding``: ``dlfloat16`` or ``raw``
  (see ``dtypes.py``).

Device memory always holds the card's bytes (stick layout, DLFloat16). Nothing here interprets them as
host-format data: a view's host linear indices ``storage_offset + sum(i_k * stride_k)`` go through
``layout.device_offsets`` to device elements (fast path: a whole dense storage via ``pack``/``unpack``).
A view whose dtype differs from the storage's (``x.view(torch.int16)``, byte views of a storage used by
``torch.save``) reads and writes the storage's *host-format image*: decoded, reinterpreted, re-encoded.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..card.layout import StickLayout, sorted_unique
from ..program import row_major_strides
from ..card.memory import Allocation, DeviceOutOfMemoryError, round_to_sticks
from ..errors import SpyreError
from ..runtime import timing_only
from ..util.bounded_cache import BoundedCache
from . import cards, dtypes, storage


# --- layouts -----------------------------------------------------------------------------------
def dense_order(size: Sequence[int], stride: Sequence[int]) -> list[int] | None:
    """Dims (of size > 1) by decreasing stride if ``size``/``stride`` is dense and non-overlapping, else None."""
    dims = [d for d in range(len(size)) if size[d] != 1]
    order = sorted(dims, key=lambda d: -stride[d])
    expected = 1
    for d in reversed(order):
        if stride[d] != expected:
            return None
        expected *= size[d]
    return order


def is_dense(size: Sequence[int], stride: Sequence[int]) -> bool:
    """True if the geometry covers a block of memory exactly once (any dim order)."""
    return dense_order(size, stride) is not None


@functools.lru_cache(maxsize=4096)
def stick_layout(host_shape: tuple[int, ...], stick_dim: int, device_dtype: str) -> StickLayout:
    """Layouts are immutable: one object per distinct layout keeps its derived figures computed once."""
    return StickLayout(host_shape, stick_dim, device_dtype)


def layout_for(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> StickLayout:
    """The default layout of a new storage for a tensor of ``size``/``stride``.

    Dense (possibly permuted) strides: the host shape is the sizes by decreasing stride (size-1 dims
    dropped) and the unit-stride dim is sticked (IBM's default: the last host dim). Other strides: a flat
    1-D layout of the storage's required elements.
    """
    return _layout_for(tuple(int(s) for s in size), tuple(int(s) for s in stride), dtype)


@functools.lru_cache(maxsize=4096)
def _layout_for(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> StickLayout:
    """(Memoized: every new tensor asks, and a model allocates the same few geometries over and over.)"""
    ddt = dtypes.device_dtype(dtype)
    order = dense_order(size, stride)
    if order is not None:
        return stick_layout(tuple(size[d] for d in order), -1, ddt)
    needed = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(s > 0 for s in size) else 0
    return stick_layout((int(needed),), 0, ddt)


def contiguous_strides(size: Sequence[int]) -> list[int]:
    return list(row_major_strides(size))


# --- allocation ----------------------------------------------------------------------------------
def release_freed() -> None:
    """Free allocations whose storages died (exact stats whenever they are read)."""
    storage.release_dead(lambda i: cards.card(i).memory)


class SpyreOutOfMemoryError(SpyreError, torch.OutOfMemoryError):
    """The card is full: what ``torch.cuda`` users catch as ``torch.OutOfMemoryError``."""


# Caches above the device layer that hold device tensors only to save work (the compiler's fp32 weight
# parts). They register here, with the allocator, which cannot import them (imports point one way): an
# allocation that would not fit drops them before the card is called full, and empty_cache() drops them too.
_cache_clearers: list[Callable[[], None]] = []


def on_empty_cache(clear: Callable[[], None]) -> Callable[[], None]:
    """Have ``torch.spyre.empty_cache()``, and an allocation that would not fit, call ``clear`` (once per
    registration) to free the device tensors a cache holds only to save work."""
    if clear not in _cache_clearers:
        _cache_clearers.append(clear)
    return clear


def drop_caches() -> None:
    """Call the :func:`on_empty_cache` clearers, then free the storages that died."""
    for clear in list(_cache_clearers):
        clear()
    release_freed()


def _allocate(card: int, nbytes: int) -> Allocation:
    memory = cards.card(card).memory
    if storage.sweep_due() or memory.allocated + nbytes > memory.capacity:
        release_freed()  # dead storages may hold the memory asked for
    if memory.allocated + round_to_sticks(nbytes) > memory.capacity:
        drop_caches()  # memory held only to save work goes before an out-of-memory error (CUDA frees its cache too)
    try:
        return memory.allocate(nbytes)
    except DeviceOutOfMemoryError as e:
        raise SpyreOutOfMemoryError(str(e)) from None


def new_storage_tensor(card: int, dtype: torch.dtype, layout: StickLayout | None,
                       view: tuple[Sequence[int], Sequence[int]] | None = None) -> torch.Tensor:
    """A 1-D tensor over a fresh allocation covering ``layout``'s host element space (``view``: the
    (size, stride) to give it instead, when its storage is exactly that space: ``storage.storage_tensor``)."""
    card = cards.check_index(card)
    if layout is None or layout.numel == 0:
        dtypes.device_dtype(dtype)
        return storage.storage_tensor(card, None, dtype, 0)
    alloc = _allocate(card, layout.nbytes)
    alloc.has_data = not timing_only.enabled()
    alloc.meta.update(layout=layout, dtype=dtype, encoding=dtypes.encoding_for(dtype))
    return storage.storage_tensor(card, alloc, dtype, layout.numel, view)


def empty_strided(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, card: int,
                  layout: StickLayout | None = None) -> torch.Tensor:
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {size}")
    if math.prod(size) == 0:
        layout = None
    elif layout is None:
        layout = layout_for(size, stride, dtype)
    if layout is not None and 1 + sum((s - 1) * st for s, st in zip(size, stride)) == layout.numel \
            and all(st >= 0 for st in stride):
        # The view's storage is the layout's host element space (every default layout, and a chosen stick
        # dim of the same host shape): the import gives the geometry, no set_ after it.
        return new_storage_tensor(card, dtype, layout, (size, stride))
    base = new_storage_tensor(card, dtype, layout)
    return storage.set_view(base, base.untyped_storage(), 0, size, stride)


# --- reading and writing through the layout ----------------------------------------------------
def _host_indices(t: torch.Tensor) -> np.ndarray:
    return _host_indices_of(t.shape, t.stride(), t.storage_offset())


def _host_indices_of(shape: Sequence[int], stride: Sequence[int], offset: int) -> np.ndarray:
    idx = np.array(offset, dtype=np.int64)
    for size, st in zip(shape, stride):
        idx = idx[..., None] + np.arange(size, dtype=np.int64) * st
    return idx.reshape(-1)


def _device_array(alloc: Allocation) -> np.ndarray:
    layout: StickLayout = alloc.meta["layout"]
    return alloc.view(layout.storage_dtype, 0, layout.device_numel)


def _is_whole(t: torch.Tensor, layout: StickLayout) -> bool:
    """True if ``t`` is exactly the storage's host element space in row-major order."""
    return (t.storage_offset() == 0 and t.numel() == layout.numel and t.is_contiguous())


def _covers_storage(t: torch.Tensor, layout: StickLayout) -> bool:
    """True if ``t`` holds every element of the storage's host element space once, in any order (a
    permuted dense view such as a weight's ``.t()``): it touches every stick of the layout."""
    if t.storage_offset() != 0 or t.numel() != layout.numel:
        return False
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _image(alloc: Allocation) -> torch.Tensor:
    """The storage's host-format image: all its elements, decoded, as a flat tensor of its host dtype."""
    layout: StickLayout = alloc.meta["layout"]
    return dtypes.decode(layout.unpack(_device_array(alloc)), alloc.meta["dtype"], alloc.meta["encoding"])


def _store_image(alloc: Allocation, image: torch.Tensor) -> None:
    layout: StickLayout = alloc.meta["layout"]
    _device_array(alloc)[:] = layout.pack(dtypes.encode(image, alloc.meta["encoding"]))


def _reinterpreted(image: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t``'s view of a host-format image whose dtype differs from ``t``'s."""
    raw = image.view(torch.uint8)
    usable = raw.numel() - raw.numel() % t.element_size()
    return raw[:usable].view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


@dataclass
class Transfer:
    """What a read or write moved: device bytes (whole sticks) touched."""

    device_bytes: int


def _touched_bytes(offsets: np.ndarray, layout: StickLayout) -> int:
    return int(sorted_unique(offsets // layout.lanes).size) * 128


def has_data(t: torch.Tensor) -> bool:
    """False if spyre tensor ``t``'s memory holds no values (made or written in timing-only mode)."""
    alloc = storage.allocation_of(t)
    return alloc is None or alloc.has_data


def mark_no_data(t: torch.Tensor) -> None:
    """Record that ``t``'s allocation no longer holds meaningful values (a write that was not stored)."""
    alloc = storage.allocation_of(t)
    if alloc is not None:
        alloc.has_data = False


def transfer_size(t: torch.Tensor) -> Transfer:
    """The device bytes (whole sticks) a read or write of ``t`` moves, without moving them."""
    alloc = storage.allocation_of(t)
    if alloc is None or t.numel() == 0:
        return Transfer(0)
    layout: StickLayout = alloc.meta["layout"]
    # Every stick holds at least one element, so a view of all elements touches all of them (no need to
    # map and sort the indices: for a 49159 x 4096 LM head weight read as ``.t()`` that took minutes).
    if t.dtype != alloc.meta["dtype"] or _covers_storage(t, layout):
        return Transfer(layout.nbytes)
    return Transfer(_touched_bytes(layout.device_offsets(_host_indices(t)), layout))


def read(t: torch.Tensor, as_dtype: torch.dtype | None = None,
         require_data: bool = True) -> tuple[torch.Tensor, Transfer]:
    """The values of spyre tensor ``t`` as a new contiguous CPU tensor (same shape; ``t``'s dtype, or
    ``as_dtype``: DLFloat16 read as float32 keeps values beyond fp16's range finite). A tensor without
    data (timing-only mode) raises :class:`~torch_spyre.runtime.timing_only.NoDataError`, unless
    ``require_data`` is False (the compiler's shape probes, which need shapes, not values)."""
    alloc = storage.allocation_of(t)
    dtype = as_dtype or t.dtype
    if alloc is None or t.numel() == 0:
        return torch.empty(t.shape, dtype=dtype), Transfer(0)
    if require_data and not alloc.has_data:
        raise timing_only.NoDataError(f"this spyre tensor ({list(t.shape)}, {str(t.dtype).replace('torch.', '')})")
    layout: StickLayout = alloc.meta["layout"]
    if t.dtype != alloc.meta["dtype"]:
        return _reinterpreted(_image(alloc), t).to(dtype, copy=True), Transfer(layout.nbytes)
    dev = _device_array(alloc)
    if _is_whole(t, layout):
        elems, moved = layout.unpack(dev), layout.nbytes
    else:
        offsets = layout.device_offsets(_host_indices(t))
        elems, moved = dev[offsets], _touched_bytes(offsets, layout)
    values = dtypes.decode(elems, dtype, alloc.meta["encoding"]).reshape(t.shape)
    return values, Transfer(moved)


def write(t: torch.Tensor, values: torch.Tensor, computed_in_fp32: bool = False) -> Transfer:
    """Store CPU ``values`` (broadcastable to ``t``, any dtype) into spyre tensor ``t`` through its layout.

    Values convert to ``t``'s dtype as CPU ``copy_`` converts them, then to the device encoding. With
    ``computed_in_fp32`` (results the host computed in fp32 for 16-bit tensors, as the card computes),
    fp32 values bound for DLFloat16 are encoded straight from fp32 instead: one rounding, as the card's
    vector unit rounds on write. Through fp16 first, magnitudes between 65504 and DLFloat16's range
    (``finfo(float16).min`` is -65536 on the card) would become inf.

    In timing-only mode nothing is stored: ``t``'s allocation is marked as holding no data and the
    transfer's size is returned (the caller charges its time)."""
    alloc = storage.allocation_of(t)
    if alloc is None or t.numel() == 0:
        return Transfer(0)
    if timing_only.enabled():
        alloc.has_data = False
        return transfer_size(t)
    layout: StickLayout = alloc.meta["layout"]
    if values.shape == t.shape and values.dtype == t.dtype:
        host = values
    else:
        wide = computed_in_fp32 and alloc.meta["encoding"] == dtypes.DLFLOAT16 and values.dtype == torch.float32
        host = torch.empty(t.shape, dtype=torch.float32 if wide else t.dtype)
        host.copy_(values)
    if t.dtype != alloc.meta["dtype"]:
        image = _image(alloc)
        _reinterpreted(image, t).copy_(host)
        _store_image(alloc, image)
        return Transfer(layout.nbytes)
    dev = _device_array(alloc)
    encoded = dtypes.encode(host, alloc.meta["encoding"])
    if _is_whole(t, layout):
        dev[:] = layout.pack(encoded)
        alloc.has_data = True  # every byte is written: whatever it held before no longer matters
        return Transfer(layout.nbytes)
    offsets = layout.device_offsets(_host_indices(t))
    dev[offsets] = encoded
    return Transfer(_touched_bytes(offsets, layout))


def copy_within(src: torch.Tensor, dst: torch.Tensor) -> tuple[Transfer, Transfer] | None:
    """Device-to-device ``dst.copy_(src)`` as one gather of device elements, or None where it does not
    apply (the caller then goes through :func:`read` and :func:`write`).

    It applies where that round trip only moves bits: the same dtype on both sides and in both
    storages, raw encodings (DLFloat16 and 16-bit floats convert through fp32), the same shape (no
    broadcast), ``dst`` its storage's whole host element space (a whole write) and ``src`` holding data.
    Then ``dst``'s device array is ``dst_layout.pack(src_device[src_layout.device_offsets(src's host
    indices)])``, padding zero: which source element lands where depends only on the two layouts and
    ``src``'s geometry, so the map is computed once per geometry (:func:`_copy_map`) instead of
    unpacking, decoding, encoding and packing every call (a Linear's 3-d input copied to 2-d, and
    attention's permuted views, do this dozens of times per forward). Returns the read and written
    transfers, as :func:`read` and :func:`write` would."""
    if src.dtype != dst.dtype or src.dtype in (torch.float16, torch.bfloat16) or src.shape != dst.shape:
        return None
    s_alloc, d_alloc = storage.allocation_of(src), storage.allocation_of(dst)
    if s_alloc is None or d_alloc is None or src.numel() == 0 or not s_alloc.has_data:
        return None
    if any(a.meta["dtype"] != src.dtype or a.meta["encoding"] != dtypes.RAW
           or a.meta["layout"].storage_dtype != dtypes.np_view_dtype(src.dtype) for a in (s_alloc, d_alloc)):
        return None  # e.g. float64 kept as float32: the round trip converts
    d_layout: StickLayout = d_alloc.meta["layout"]
    if not _is_whole(dst, d_layout):
        return None
    index, padding, read_bytes, lanes = _copy_map(s_alloc.meta["layout"], tuple(src.shape), tuple(src.stride()),
                                                  src.storage_offset(), d_layout)
    dev = _device_array(d_alloc)
    if lanes:  # whole sticks: a gather of 128-byte rows ('clip': into dev without a buffer; no index is out of range)
        _device_array(s_alloc).reshape(-1, lanes).take(index, axis=0, out=dev.reshape(-1, lanes), mode="clip")
    else:
        dev[:] = _device_array(s_alloc).take(index)
    if padding is not None:
        dev[padding] = 0
    d_alloc.has_data = True
    return Transfer(read_bytes), Transfer(d_layout.nbytes)


# Each map is as large as its destination (an index per device element), and a shape that changes every step
# (a growing KV cache's permuted view made contiguous) makes a new one: bounded by bytes, not entries.
_COPY_MAP_BUDGET = 64 << 20
_copy_maps: BoundedCache[tuple, tuple[np.ndarray, np.ndarray | None, int, int]] = BoundedCache(_COPY_MAP_BUDGET)


def _copy_map(s_layout: StickLayout, shape: tuple[int, ...], stride: tuple[int, ...], offset: int,
              d_layout: StickLayout) -> tuple[np.ndarray, np.ndarray | None, int, int]:
    """For :func:`copy_within`: the source device element of each destination device element, the
    destination's padding positions (None if none), the device bytes the read touches and 0; or, where every
    destination stick is one whole source stick (the elements of a stick stay together, as in most reshapes
    and permutes that keep the sticked dim), the source stick of each destination stick, the padding, the
    bytes and the lanes of a stick. The most recently used maps are kept, up to ``_COPY_MAP_BUDGET`` bytes."""
    key = (s_layout, shape, stride, offset, d_layout)
    found = _copy_maps.get(key)
    if found is None:
        found = _make_copy_map(*key)
        _copy_maps.put(key, found, found[0].nbytes + (0 if found[1] is None else found[1].nbytes))
    return found


def _make_copy_map(s_layout: StickLayout, shape: tuple[int, ...], stride: tuple[int, ...], offset: int,
                   d_layout: StickLayout) -> tuple[np.ndarray, np.ndarray | None, int, int]:
    host = _host_indices_of(shape, stride, offset)
    offsets = s_layout.device_offsets(host)
    contiguous = all(st == want for size, st, want in zip(shape, stride, row_major_strides(shape)) if size != 1)
    if offset == 0 and len(host) == s_layout.numel and contiguous:
        read_bytes = s_layout.nbytes  # as read() counts a whole storage
    else:
        read_bytes = _touched_bytes(offsets, s_layout)
    index = d_layout.pack(offsets, fill=-1)
    padding = np.flatnonzero(index < 0) if d_layout.padding else None
    small = np.int32 if s_layout.device_numel < 2**31 else np.int64
    sticks = _whole_sticks(index, d_layout.lanes, s_layout.device_numel)
    if sticks is not None:
        sticks = sticks.astype(small)
        sticks.flags.writeable = False
        return sticks, padding, read_bytes, d_layout.lanes
    if padding is not None:
        index[padding] = 0
    index = index.astype(small)
    index.flags.writeable = False
    return index, padding, read_bytes, 0


def _whole_sticks(index: np.ndarray, lanes: int, source_numel: int) -> np.ndarray | None:
    """The source stick of each destination stick when ``index`` (the source element of each destination
    element, -1 at padding) maps every destination stick onto one source stick lane for lane (padding lanes
    may take anything: they are zeroed after the copy), else None."""
    if index.size % lanes or source_numel % lanes:
        return None
    rows = index.reshape(-1, lanes)
    starts = rows - np.arange(lanes)  # where each used lane says its row's source stick starts
    used = rows >= 0
    first = np.where(used, starts, np.iinfo(starts.dtype).max).min(axis=1)
    last = np.where(used, starts, -1).max(axis=1)
    padding_only = ~used.any(axis=1)
    if not np.all((first == last) | padding_only):
        return None
    first[padding_only] = 0
    if np.any(first % lanes):
        return None  # the rows start inside a source stick
    return first // lanes


# --- public layout API -------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorLayout:
    """A device tensor's layout: its storage's stick layout plus how the tensor views that storage."""

    stick_layout: StickLayout | None  # None for a tensor of no elements (nothing allocated)
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype

    @property
    def device_size(self) -> tuple[int, ...]:
        return self.stick_layout.device_size if self.stick_layout else ()

    @property
    def stride_map(self) -> tuple[int, ...]:
        return self.stick_layout.stride_map if self.stick_layout else ()

    @property
    def padding(self) -> int:
        return self.stick_layout.padding if self.stick_layout else 0

    @property
    def device_dtype(self) -> str:
        return dtypes.device_dtype(self.dtype) if self.stick_layout is None else self.stick_layout.device_dtype

    @property
    def nbytes(self) -> int:
        return self.stick_layout.nbytes if self.stick_layout else 0

    @property
    def is_whole(self) -> bool:
        """True if the tensor is its whole storage in the layout's host order."""
        if self.stick_layout is None:
            return True
        return (self.storage_offset == 0 and math.prod(self.size) == self.stick_layout.numel
                and dense_order(self.size, self.stride) is not None)

    def __str__(self) -> str:
        base = self.stick_layout.describe() if self.stick_layout else "no allocation"
        return f"{base}; view size={list(self.size)} stride={list(self.stride)} offset={self.storage_offset}"


def get_layout(t: torch.Tensor) -> TensorLayout:
    """The stick layout of spyre tensor ``t``'s storage and ``t``'s view of it."""
    if not isinstance(t, torch.Tensor) or t.device.type != "spyre":
        raise TypeError(f"get_layout expects a tensor on a spyre device, got {type(t).__name__} on "
                        f"{getattr(t, 'device', 'no device')}")
    alloc = storage.allocation_of(t)
    return TensorLayout(alloc.meta["layout"] if alloc else None, tuple(t.shape), tuple(t.stride()),
                        t.storage_offset(), t.dtype)


def to_spyre(t: torch.Tensor, device: torch.device | str | int | None = None, stick_dim: int = -1) -> torch.Tensor:
    """Copy ``t`` to a spyre device with the host dimension ``stick_dim`` sticked (``x.to("spyre")`` sticks the last).

    The result is contiguous on the host side; its storage's layout has host shape ``t.shape``.
    """
    card = cards.index_of(device if device is not None else
                          (t.device if t.device.type == "spyre" else None))
    ddt = dtypes.device_dtype(t.dtype)
    shape = tuple(t.shape)
    if t.numel() == 0:
        layout = None
    else:
        layout = StickLayout(shape, stick_dim, ddt)
    out = empty_strided(shape, contiguous_strides(shape), t.dtype, card, layout=layout)
    out.copy_(t)
    return out


def replace_layout(alloc: Allocation, layout: StickLayout, source: Allocation) -> None:
    """Make ``alloc`` hold ``source``'s device bytes, which store ``alloc``'s host elements under ``layout``
    (the last step of an in-place relayout). Every tensor viewing the storage then reads and writes through
    ``layout``; values, sizes, strides and storage offsets are unchanged."""
    old: StickLayout = alloc.meta["layout"]
    if tuple(layout.host_shape) != tuple(old.host_shape) or layout.device_dtype != old.device_dtype:
        raise ValueError(f"an in-place relayout keeps the host shape and device dtype: {old.describe()} -> "
                         f"{layout.describe()}")
    if layout.nbytes > alloc.nbytes:
        raise ValueError(f"{layout.describe()} needs {layout.nbytes} device bytes but the allocation has "
                         f"{alloc.nbytes}: relayout into a new tensor instead (compiler.relayout.relayout)")
    if source.nbytes < layout.nbytes:
        raise ValueError(f"the source allocation holds {source.nbytes} bytes, {layout.nbytes} are needed")
    if source.has_data:
        alloc.buffer[:layout.nbytes] = source.buffer[:layout.nbytes]
    else:  # timing-only: the relayout program was not executed, there are no bytes to move
        alloc.has_data = False
    alloc.meta["layout"] = layout


# --- storages restored by torch.load -------------------------------------------------------------
def mark_untyped(base: torch.Tensor) -> None:
    """Mark a byte storage whose dtype is not known yet (see ``serialization.py``)."""
    storage.allocation_of(base).meta["untyped"] = True


def restored_storage(source: torch.UntypedStorage) -> torch.UntypedStorage:
    """The storage that replaced ``source`` when a restored byte storage was re-encoded (else ``source``).

    Tensors that torch.load attaches to the same file storage after the first one are redirected to
    its replacement, so that views saved together still share one storage.
    """
    if source.device.type != "spyre":
        return source
    replacement = storage.redirected(source)
    return replacement if replacement is not None else source


def adopt_dtype(t: torch.Tensor) -> None:
    """If ``t``'s storage holds untyped bytes restored by torch.load, re-encode it once for ``t``.

    The first tensor attached to the storage decides: if its geometry is dense and covers the whole
    storage (the usual case: a saved tensor that owned its storage), the bytes move to a new allocation
    in that geometry's default layout (``layout_for``, IBM's: the last dimension sticked and padded, so
    a reloaded ``(5, 100)`` fp16 tensor has the layout and the 1,280 bytes of ``x.to("spyre")``), ``t``
    is attached to it, the byte storage is redirected to it (``restored_storage``: tensors torch.load
    attaches later share it) and the byte storage's allocation is freed at once. Otherwise (a saved view
    of part of a storage) the bytes are re-encoded in place with a flat 1-D layout of the storage's
    elements.
    """
    alloc = storage.allocation_of(t)
    if alloc is None or not alloc.meta.get("untyped"):
        return
    ddt = dtypes.device_dtype(t.dtype)
    nbytes = t.untyped_storage().nbytes()
    if nbytes % t.element_size():
        return
    numel = nbytes // t.element_size()
    raw = _image(alloc).view(t.dtype)
    size, stride = list(t.shape), list(t.stride())
    if t.storage_offset() == 0 and math.prod(size) == numel and is_dense(size, stride):
        card = t.device.index or 0
        old = t.untyped_storage()
        base = new_storage_tensor(card, t.dtype, layout_for(size, stride, t.dtype))
        _store_image(storage.allocation_of(base), raw)
        new = base.untyped_storage()
        storage.set_view(t, new, 0, size, stride)
        storage.redirect(old, new)
        # Freed at once, not when torch.load drops the byte storage at its end: otherwise loading a
        # checkpoint would hold every tensor twice (file bytes + re-encoded) and need twice the memory.
        # Every later use of the byte storage goes through set_, which is redirected.
        alloc.meta["untyped"] = False
        storage.forget(card, alloc)
        cards.card(card).memory.free(alloc)
        return
    layout = stick_layout((numel,), 0, ddt)
    alloc.meta.update(layout=layout, dtype=t.dtype, encoding=dtypes.encoding_for(t.dtype), untyped=False)
    _store_image(alloc, raw)

"""Device storages: PrivateUse1 tensors over the host buffers of the card's allocations.

The torch internals it needs (redispatch to the CPU kernel, a storage's identity) come through the
seam, ``torch_spyre/_torch/device.py``. The mechanisms, tested in tests/device/test_storage.py:

- **Creating** a tensor on ``spyre:N`` over an allocation: the DLPack import (``torch.from_dlpack``
  of a capsule with device type ``kDLExtDev`` and id ``N``) gives a plain PrivateUse1 tensor on
  ``spyre:N`` whose storage points at the allocation's host buffer. (``_construct_storage_from_data_pointer``
  gives a storage, but ``aten::set_`` refuses to move a tensor made by ``torch._C._acc.create_empty_tensor``,
  which is always on ``spyre:0``, onto a storage of another card; DLPack has no such limit.) The capsule's
  struct is allocated with libc ``malloc`` and its deleter is libc ``free``: no Python code runs when a
  storage dies (a Python callback there can be entered with a Python error pending, which ctypes turns
  into a ``SystemError``).
- **Freeing**: a ``StorageWeakRef`` per allocation. :func:`release_dead` frees the allocations whose
  storage died; it runs before every stats query (exact stats), before an allocation is refused for lack
  of memory, and every time the number of new allocations reaches half the number of live ones (so its
  cost is amortized O(1) per allocation).
- **Views**: sizes, strides and storage offsets are attached with ``aten::set_`` redispatched to the CPU
  kernel, which only edits metadata.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Sequence

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .._torch.device import redispatch_to_cpu, storage_key
from ..card.memory import Allocation

_SET = torch.ops.aten.set_.source_Storage_storage_offset


# --- DLPack structures (dlpack.h, v0.x "dltensor" capsules) ---------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

_kDLExtDev = 12
_DL_CODES = {
    torch.float16: (2, 16), torch.bfloat16: (4, 16), torch.float32: (2, 32),
    torch.int64: (0, 64), torch.int32: (0, 32), torch.int16: (0, 16), torch.int8: (0, 8),
    torch.uint8: (1, 8), torch.bool: (6, 8),
}

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = b"dltensor"  # a capsule keeps a pointer to its name: the bytes must outlive it (module constant)


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value  # the capsule's deleter: frees the struct itself

_lock = threading.Lock()
_live: dict[tuple[int, int], tuple[Allocation, StorageWeakRef]] = {}  # (card, host pointer) -> allocation
_allocs_since_sweep = 0
_EMPTY = np.zeros(128, dtype=np.uint8)  # data pointer of storages with no bytes (no allocation)
_EMPTY_PTR = int(_EMPTY.ctypes.data)  # (read once: ``.ctypes`` builds an object per access)
# A descriptor's bytes in one pack (building the ctypes structures field by field costs more than the rest
# of the import): the _DLManagedTensor, then its shape entries and, for a view's geometry, its stride
# entries. Native alignment, as ctypes lays it out.
_HEAD = "@P2i iBBH PPQ PP"
_DESCRIPTOR = struct.Struct(_HEAD + " q")
assert _DESCRIPTOR.size == ctypes.sizeof(_DLManagedTensor) + 8
assert struct.calcsize("@P2i iBBH") == _DLTensor.shape.offset and struct.calcsize("@P2i iBBH PPQ") == ctypes.sizeof(_DLTensor)
_HEAD_SIZE = ctypes.sizeof(_DLManagedTensor)
_strided: dict[int, struct.Struct] = {}  # ndim -> the descriptor with ndim shape and ndim stride entries
_devices: dict[int, torch.device] = {}  # card -> torch.device("spyre", card), to check each import against


def _strided_descriptor(ndim: int) -> struct.Struct:
    found = _strided.get(ndim)
    if found is None:
        found = _strided[ndim] = struct.Struct(f"{_HEAD} {ndim}q {ndim}q")
        assert found.size == _HEAD_SIZE + 16 * ndim
    return found


def storage_tensor(card: int, alloc: Allocation | None, dtype: torch.dtype, numel: int,
                   view: tuple[Sequence[int], Sequence[int]] | None = None) -> torch.Tensor:
    """A 1-D ``dtype`` tensor of ``numel`` elements on ``spyre:card`` over ``alloc``'s host buffer.

    ``view``: (size, stride) of the tensor to return instead, at storage offset 0, when its storage (the
    elements up to its last one) is exactly the ``numel`` elements (the caller checks): the DLPack import
    then gives that geometry at once, without a ``set_`` after it."""
    global _allocs_since_sweep
    if dtype not in _DL_CODES:
        from .dtypes import device_dtype

        device_dtype(dtype)  # raises the error that names the dtype and what to do
    code, bits = _DL_CODES[dtype]
    if view is None:
        descriptor, ndim, entries = _DESCRIPTOR, 1, (numel,)
    else:
        ndim = len(view[0])
        descriptor, entries = _strided_descriptor(ndim), (*view[0], *view[1])
    block = _libc.malloc(descriptor.size)
    if not block:
        raise MemoryError("malloc failed for a DLPack descriptor")
    ptr = alloc.host_ptr if alloc is not None else _EMPTY_PTR
    shape = block + _HEAD_SIZE
    # data, device (type, id), ndim, dtype (code, bits, lanes), shape (the entries after the struct), strides
    # (NULL: contiguous; else the entries after the shape's), byte_offset; manager_ctx (NULL), deleter; the
    # entries.
    ctypes.memmove(block, descriptor.pack(ptr, _kDLExtDev, card, ndim, code, bits, 1, shape,
                                          0 if view is None else shape + 8 * ndim, 0, 0, _FREE, *entries),
                   descriptor.size)
    capsule = _PyCapsule_New(block, _CAPSULE_NAME, None)
    try:
        t = torch.from_dlpack(capsule)
    except BaseException:
        _libc.free(ctypes.c_void_p(block))  # torch did not take ownership
        raise
    device = _devices.get(card)
    if device is None:
        device = _devices.setdefault(card, torch.device("spyre", card))
    if t.device != device or (numel and t.data_ptr() != ptr):  # pragma: no cover
        raise RuntimeError(f"DLPack import gave a tensor on {t.device}, expected spyre:{card}")
    if alloc is not None:
        with _lock:
            _live[(card, alloc.host_ptr)] = (alloc, StorageWeakRef(t.untyped_storage()))
            _allocs_since_sweep += 1
    return t


def sweep_due() -> bool:
    """True when enough allocations were made since the last sweep (amortized O(1) sweeping)."""
    return _allocs_since_sweep >= max(16, len(_live) // 2)


def release_dead(memory_of) -> int:
    """Free the allocations whose storages died. ``memory_of(card)`` gives that card's DeviceMemory.

    Redirects whose byte storage died are dropped first (see :func:`redirect`): that can kill the
    storage they pointed to, which this same sweep then frees.
    """
    global _allocs_since_sweep
    with _lock:
        for key in [k for k, (ref, _) in _redirects.items() if ref.expired()]:
            del _redirects[key]
        dead = [(key, alloc) for key, (alloc, ref) in _live.items() if ref.expired()]
        for key, _ in dead:
            del _live[key]
        _allocs_since_sweep = 0
    for (card, _), alloc in dead:
        memory_of(card).free(alloc)
    return len(dead)


def forget(card: int, alloc: Allocation) -> None:
    """Stop tracking ``alloc`` (the caller frees it now, although a storage still points at it)."""
    with _lock:
        _live.pop((card, alloc.host_ptr), None)


# Byte storages restored by torch.load whose bytes moved to a new storage in another layout: StorageImpl
# address -> (weak ref to the old storage, the new storage). The weak ref keeps the address from being
# reused while the entry exists; the strong ref keeps the new storage alive for tensors torch.load
# attaches later (views saved with the first tensor), until the old storage dies.
_redirects: dict[int, tuple[StorageWeakRef, torch.UntypedStorage]] = {}


def redirect(old: torch.UntypedStorage, new: torch.UntypedStorage) -> None:
    """Send every later ``set_`` onto ``old`` to ``new`` (see ``tensor.adopt_dtype``)."""
    with _lock:
        _redirects[storage_key(old)] = (StorageWeakRef(old), new)


def redirected(source: torch.UntypedStorage) -> torch.UntypedStorage | None:
    """The storage that replaced ``source``, or None."""
    entry = _redirects.get(storage_key(source))
    if entry is None or entry[0].expired():
        return None
    return entry[1]


def allocation_of(t: torch.Tensor | torch.UntypedStorage) -> Allocation | None:
    """The allocation under a spyre tensor or storage; None for a storage of no bytes."""
    storage = t.untyped_storage() if isinstance(t, torch.Tensor) else t
    ptr = storage.data_ptr()
    if ptr == _EMPTY_PTR or storage.nbytes() == 0:
        return None
    card = storage.device.index or 0
    entry = _live.get((card, ptr))
    if entry is None:
        raise RuntimeError(
            f"spyre:{card} storage at {ptr:#x} is not a live allocation made by torch_spyre "
            "(was it created by another library?)"
        )
    return entry[0]


def set_view(t: torch.Tensor, storage: torch.UntypedStorage, offset: int, size: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
    """``t.set_(storage, offset, size, stride)`` as pure metadata (the CPU kernel), in place."""
    return redispatch_to_cpu(_SET, t, storage, int(offset), list(size), list(stride))


def view_of(base: torch.Tensor, dtype: torch.dtype, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    """A new tensor of ``dtype`` viewing ``base``'s storage with the given geometry."""
    if dtype == base.dtype:
        shell = redispatch_to_cpu(torch.ops.aten.alias.default, base)
    else:
        # A fresh tensor of the new dtype on the same card, then moved onto base's storage.
        shell = storage_tensor(base.device.index or 0, None, dtype, 0)
    return set_view(shell, base.untyped_storage(), offset, size, stride)

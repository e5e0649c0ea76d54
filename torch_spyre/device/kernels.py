"""The spyre kernels that are not the host fallback: factories, copies, resize and metadata-only views."""

from __future__ import annotations

import math

import torch

from . import cards, copy, storage, tensor


def _card(device) -> int:
    """Card index of a factory's ``device`` argument (``spyre`` without an index: the current card)."""
    return cards.index_of(device)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        strides = torch.empty(size, device="meta", memory_format=memory_format).stride()
    else:
        strides = tensor.contiguous_strides(size)
    return tensor.empty_strided(size, strides, dtype, _card(device))


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return tensor.empty_strided(size, stride, dtype or torch.get_default_dtype(), _card(device))


def to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """``aten::_to_copy`` from a spyre tensor.

    torch's composite kernel allocates the CPU destination of a ``non_blocking`` device-to-host copy in
    pinned memory, which a Python backend cannot provide; the card's host buffers need no pinning.
    """
    dtype = dtype or self.dtype
    device = torch.device(device) if device is not None else self.device
    memory_format = memory_format or torch.preserve_format
    if memory_format == torch.preserve_format and tensor.is_dense(self.shape, self.stride()):
        out = torch.empty_strided(self.shape, self.stride(), dtype=dtype, device=device)
    else:
        fmt = torch.contiguous_format if memory_format == torch.preserve_format else memory_format
        out = torch.empty(self.shape, dtype=dtype, device=device, memory_format=fmt)
    out.copy_(self, non_blocking=non_blocking)
    return out


def pin_memory(self, device=None):
    """``aten::_pin_memory`` of a CPU tensor for spyre (registered for the CPU key).

    The simulated card DMAs from any host memory, and a Python backend cannot provide torch's pinned
    allocator: ``x.pin_memory()`` returns a copy in ordinary memory (``is_pinned()`` stays False), so
    ``x.pin_memory().to("spyre", non_blocking=True)`` and ``DataLoader(pin_memory=True)`` work.
    """
    if device is not None and torch.device(device).type != "spyre":
        raise RuntimeError(f"cannot pin memory for {device}: the accelerator is spyre")
    return self.clone(memory_format=torch.contiguous_format)


def copy_from(self, dst, non_blocking=False):
    return copy.copy_from(self, dst, non_blocking)


def copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return copy.copy_from(self, dst, False)


def resize_(self, size, memory_format=None):
    size = [int(s) for s in size]
    stride = tensor.contiguous_strides(size)
    needed = self.storage_offset() + (1 + sum((s - 1) * st for s, st in zip(size, stride)) if math.prod(size) else 0)
    have = self.untyped_storage().nbytes() // self.element_size()
    if needed <= have:
        return storage.set_view(self, self.untyped_storage(), self.storage_offset(), size, stride)
    # Grow: a new allocation in the default layout for the new shape, keeping the old elements.
    kept = tensor.has_data(self)
    old = tensor.read(self.as_strided((have - self.storage_offset(),), (1,), self.storage_offset()))[0] \
        if kept and have > self.storage_offset() else torch.empty(0, dtype=self.dtype)
    base = tensor.new_storage_tensor(self.device.index or 0, self.dtype, tensor.layout_for(size, stride, self.dtype))
    storage.set_view(self, base.untyped_storage(), 0, size, stride)
    if not kept:  # timing-only: no elements to keep, and the grown storage holds none either
        tensor.mark_no_data(self)
    if old.numel():
        flat = self.as_strided((old.numel(),), (1,), 0)
        tensor.write(flat, old)
    return self


def set_source_storage(self, source):
    source = tensor.restored_storage(source)
    storage.set_view(self, source, 0, [source.nbytes() // self.element_size()], [1])
    tensor.adopt_dtype(self)
    return self


def set_source_storage_offset(self, source, storage_offset, size, stride=()):
    if not stride:
        stride = tensor.contiguous_strides(size)
    source = tensor.restored_storage(source)
    storage.set_view(self, source, storage_offset, size, stride)
    tensor.adopt_dtype(self)
    return self


def set_source_tensor(self, source):
    return storage.set_view(self, source.untyped_storage(), source.storage_offset(), source.shape, source.stride())


def set_empty(self):
    empty = storage.storage_tensor(self.device.index or 0, None, self.dtype, 0)
    return storage.set_view(self, empty.untyped_storage(), 0, [0], [1])


def view_dtype(self, dtype):
    if dtype == self.dtype:
        return storage.view_of(self, dtype, self.shape, self.stride(), self.storage_offset())
    whole = torch.empty(self.untyped_storage().nbytes() // self.element_size(), dtype=self.dtype, device="meta")
    meta = whole.as_strided(self.shape, self.stride(), self.storage_offset()).view(dtype)
    return storage.view_of(self, dtype, meta.shape, meta.stride(), meta.storage_offset())


KERNELS: dict[str, object] = {
    "empty.memory_format": empty_memory_format,
    "empty_strided": empty_strided,
    "_to_copy": to_copy,
    "_copy_from": copy_from,
    "_pin_memory": pin_memory,
    "_copy_from_and_resize": copy_from_and_resize,
    "resize_": resize_,
    "set_.source_Storage": set_source_storage,
    "set_.source_Storage_storage_offset": set_source_storage_offset,
    "set_.source_Tensor": set_source_tensor,
    "set_": set_empty,
    "view.dtype": view_dtype,
}

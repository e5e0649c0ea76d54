"""``torch.save`` / ``torch.load`` of spyre tensors.

- **save** writes host-format bytes: ``torch.save`` copies each storage to the CPU with a byte view of
  the storage, which reads the storage's host-format image through its layout (``tensor.py``), so the
  file is the same as for a CPU tensor and ``torch.load(f, map_location="cpu")`` gives the right values.
- **load without map_location** restores a storage tagged ``spyre:N``. torch's own path for a
  PrivateUse1 location calls ``torch.UntypedStorage(n, device="spyre")``, which segfaults (no C++
  allocator is registered), so a deserializer registered ahead of it (``register_package`` priority 19)
  puts the bytes on the card first as untyped bytes (a flat ``uint8`` layout); when torch then attaches the
  tensor (``set_`` with the tensor's dtype), the allocation is re-encoded once for that dtype with a flat
  1-D layout (DLFloat16 for fp16/bf16). A location naming a card that does not exist gives a clear error.
"""

from __future__ import annotations

import re

import torch

_LOCATION = re.compile(r"^spyre(?::(\d+))?$")
_registered = False


def _tag(obj) -> str | None:
    if obj.device.type == "spyre":
        return f"spyre:{obj.device.index or 0}"
    return None


def _deserialize(obj, location: str):
    m = _LOCATION.match(location)
    if m is None:
        return None
    from . import cards, tensor
    from ..card.layout import StickLayout

    index = int(m.group(1) or 0)
    n = cards.device_count()
    if index >= n:
        raise RuntimeError(
            f"the file holds a tensor saved on spyre:{index} but the simulated system has {n} card(s); "
            f"pass map_location='spyre:0' (or 'cpu') to torch.load, or set TORCH_SPYRE_NUM_CARDS"
        )
    nbytes = obj.nbytes()
    layout = StickLayout((nbytes,), 0, "uint8") if nbytes else None
    base = tensor.new_storage_tensor(index, torch.uint8, layout)
    if nbytes:
        tensor.mark_untyped(base)
        host = torch.empty(0, dtype=torch.uint8).set_(obj if isinstance(obj, torch.UntypedStorage) else obj.untyped())
        base.copy_(host)
    return base.untyped_storage()


def register() -> None:
    global _registered
    if not _registered:
        torch.serialization.register_package(19, _tag, _deserialize)
        _registered = True

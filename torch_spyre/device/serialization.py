"""``torch.save`` / ``torch.load`` of spyre tensors.

- **save** writes host-format bytes: ``torch.save`` copies each storage to the CPU with a byte view of
  the storage, which reads the storage's host-format image through its layout (``tensor.py``), so the
  file is the same as for a CPU tensor and ``torch.load(f, map_location="cpu")`` gives the right values.
- **load without map_location** restores a storage tagged ``spyre:N``. torch's own path for a
  PrivateUse1 location calls ``torch.UntypedStorage(n, device="spyre")``, which segfaults (no C++
  allocator is registered), so a deserializer registered ahead of it (``register_package`` priority 19)
  puts the bytes on the card first as untyped bytes (a flat ``uint8`` layout); when torch then attaches the
  tensor (``set_`` with the tensor's dtype), the allocation is re-encoded once for that dtype, in the
  layout the tensor's geometry would get on a fresh allocation (``tensor.adopt_dtype``; DLFloat16 for
  fp16/bf16). A location naming a card that does not exist gives a clear error that says whether the
  file or map_location named it.
"""

from __future__ import annotations

import re
import sys

import torch

_LOCATION = re.compile(r"^spyre(?::(\d+))?$")
_registered = False


def _tag(obj) -> str | None:
    if obj.device.type == "spyre":
        return f"spyre:{obj.device.index or 0}"
    return None


def _origin(location: str) -> str:
    """Where ``location`` came from, for error messages: the file's tag, or torch.load's map_location.

    torch passes the deserializer only the final location; its ``restore_location`` closure (present
    when a map_location was given, torch/serialization.py ``_get_restore_location``) tells the two apart.
    Any surprise in torch's frames gives no origin rather than a wrong one.
    """
    try:
        frame = sys._getframe(2)
        for _ in range(4):
            if frame is None:
                break
            code = frame.f_code
            if code.co_name == "restore_location" and code.co_filename.endswith(("torch/serialization.py",
                                                                                  "torch\\serialization.py")):
                saved_on = frame.f_locals.get("location")
                if isinstance(saved_on, str) and saved_on != location:
                    return f" (asked by map_location; the file's tensor was saved on {saved_on})"
                return " (asked by map_location)"
            frame = frame.f_back
        return f" (the file's tensor was saved on {location})"
    except Exception:  # noqa: BLE001 - only a nicer message is at stake
        return ""


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
            f"cannot restore onto spyre:{index}{_origin(location)}: the simulated system has {n} "
            f"card{'s' if n != 1 else ''} (set TORCH_SPYRE_NUM_CARDS={index + 1} or more to simulate "
            f"spyre:{index}) or pass map_location='spyre:0' (or 'cpu') to torch.load"
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

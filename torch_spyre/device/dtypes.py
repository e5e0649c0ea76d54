"""Which host dtypes the card can hold, how they are encoded in device memory, and the DLFloat16 switch.

fp16 and bf16 live on the card as DLFloat16 (``card/dlfloat16.py``); the other supported dtypes are
stored as their own bits. The emulation can be turned off with ``TORCH_SPYRE_DLFLOAT16=0`` or
:func:`set_dlfloat16_emulation` (fp16/bf16 are then stored as their own IEEE bits). The choice is
recorded per allocation when it is made, so switching never reinterprets memory already written.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch

from ..errors import SpyreError
from ..card import dlfloat16

DLFLOAT16_ENV = "TORCH_SPYRE_DLFLOAT16"

# host dtype -> device dtype name (card/layout.py DEVICE_DTYPES)
DEVICE_DTYPE: dict[torch.dtype, str] = {
    torch.float16: "dlfloat16",
    torch.bfloat16: "dlfloat16",
    torch.float32: "float32",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}

# Encodings of an allocation's elements.
DLFLOAT16 = "dlfloat16"  # fp16/bf16 values as DLFloat16 bits
RAW = "raw"  # the host dtype's own bits


class UnsupportedDtypeError(SpyreError, RuntimeError):
    """A dtype or layout the card cannot hold. A RuntimeError, as CUDA's "not implemented for 'Double'" is, not
    a TypeError: torch's Tensor operators (``x * s``) turn a TypeError raised inside the op into
    ``NotImplemented``, and Python's generic "unsupported operand type(s)" would replace this message."""


def device_dtype(dtype: torch.dtype) -> str:
    """The device dtype for ``dtype``; a clear :class:`UnsupportedDtypeError` for dtypes the card cannot hold."""
    try:
        return DEVICE_DTYPE[dtype]
    except KeyError:
        suggestion = "torch.float32"
        if dtype.is_complex:
            hint = "store real and imaginary parts as two float32 tensors (torch.view_as_real(x).float())"
        elif dtype.is_floating_point:
            hint = (f"convert it first, e.g. x.to({suggestion}).to('spyre'); for an op's result, convert the "
                    f"operand that promotes it to {str(dtype).replace('torch.', '')} (a 0-dim CPU tensor, a Python "
                    f"float under that default dtype) to float32 first, e.g. s.to({suggestion})")
        else:
            hint = "convert it first, e.g. x.to(torch.int64).to('spyre')"
        supported = ", ".join(str(d).replace("torch.", "") for d in DEVICE_DTYPE)
        raise UnsupportedDtypeError(
            f"the Spyre card cannot hold {str(dtype).replace('torch.', '')} tensors (supported: {supported}); "
            f"{hint}"
        ) from None


def check_layout(layout: torch.layout, what: str) -> None:
    """A clear :class:`UnsupportedDtypeError` for layouts the card cannot hold (sparse, mkldnn): only dense, strided tensors.
    ``what`` names where the tensor came from (``the result of aten::_to_sparse``)."""
    if layout != torch.strided:
        name = str(layout).replace("torch.", "")
        raise UnsupportedDtypeError(
            f"the Spyre card cannot hold {name} tensors ({what}): only dense, strided tensors live on the card; "
            f"keep the dense tensor on spyre, or make the sparse one on the host: x.cpu().to_sparse()"
        )


def _env_default() -> bool:
    value = os.environ.get(DLFLOAT16_ENV, "1").strip().lower()
    if value in ("1", "true", "yes", "on", ""):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{DLFLOAT16_ENV}={value!r}: expected 1 (emulate DLFloat16, the default) or 0 (store IEEE bits)")


_emulate: bool | None = None


def dlfloat16_emulation() -> bool:
    """True if fp16/bf16 tensors allocated from now on are stored as DLFloat16."""
    global _emulate
    if _emulate is None:
        _emulate = _env_default()
    return _emulate


def set_dlfloat16_emulation(enabled: bool) -> None:
    """Turn DLFloat16 emulation on or off for allocations made from now on."""
    global _emulate
    _emulate = bool(enabled)


def encoding_for(dtype: torch.dtype) -> str:
    if dtype in (torch.float16, torch.bfloat16) and dlfloat16_emulation():
        return DLFLOAT16
    return RAW


@functools.cache
def np_view_dtype(dtype: torch.dtype) -> np.dtype:
    """A numpy dtype with the same bits as ``dtype`` (bf16/fp16 as uint16)."""
    if dtype in (torch.float16, torch.bfloat16):
        return np.dtype(np.uint16)
    return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)


def encode(host: torch.Tensor, encoding: str) -> np.ndarray:
    """Flat device-encoded elements of a CPU tensor (any shape, read in row-major order)."""
    flat = host.detach().reshape(-1)
    if encoding == DLFLOAT16:
        # fp16/bf16 have 65,536 bit patterns: one table gather instead of the fp32 arithmetic.
        if flat.dtype == torch.float16:
            return dlfloat16.from_float16_bits(flat.contiguous().view(torch.int16).numpy().view(np.uint16))
        if flat.dtype == torch.bfloat16:
            return dlfloat16.from_bfloat16_bits(flat.contiguous().view(torch.int16).numpy().view(np.uint16))
        return dlfloat16.from_float32(flat.to(torch.float32).numpy())
    if flat.dtype in (torch.float16, torch.bfloat16):
        return flat.contiguous().view(torch.int16).numpy().view(np.uint16)
    return flat.contiguous().numpy()


def decode(device: np.ndarray, dtype: torch.dtype, encoding: str) -> torch.Tensor:
    """A flat CPU tensor of ``dtype`` from device-encoded elements.

    DLFloat16 goes back through fp32: to fp16 with IEEE round-to-nearest-even (magnitudes above 65504
    become inf), to bf16 with torch's round-to-nearest-even conversion; the NaN/Inf code becomes NaN.
    """
    if encoding == DLFLOAT16:
        if dtype == torch.float16:
            return torch.from_numpy(dlfloat16.to_float16_bits(device).view(np.int16)).view(torch.float16)
        if dtype == torch.bfloat16:
            return torch.from_numpy(dlfloat16.to_bfloat16_bits(device).view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(dlfloat16.to_float32(device)).to(dtype)
    arr = np.ascontiguousarray(device)
    if dtype in (torch.float16, torch.bfloat16):
        return torch.from_numpy(arr.view(np.int16).copy()).view(dtype)
    return torch.from_numpy(arr.astype(np_view_dtype(dtype), copy=True))

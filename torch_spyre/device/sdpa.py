"""Scaled dot-product attention on spyre: ``spyre::flash_attention`` and the routing of SDPA to it.

``F.scaled_dot_product_attention`` is CompositeImplicitAutograd: its C++ kernel picks a backend through
``_fused_sdp_choice_stub``, a C++ DispatchStub that a Python backend cannot fill (the
``aten::_fused_sdp_choice`` *operator* is not what the C++ kernel asks for a PrivateUse1 tensor, so a
PrivateUse1 kernel registered for it is never called), so on spyre SDPA always takes the math path
(bmm + masked softmax + bmm).

What this module does instead:

- defines ``spyre::flash_attention(q, k, v, attn_mask, is_causal, scale, enable_gqa) -> Tensor``, a
  functional op with torch's SDPA semantics (4-d q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv],
  output contiguous [B, Hq, Lq, Dv]). Its CPU kernel is torch's math decomposition; on spyre, eager
  calls go through the device's fallback (``fallback.run``); its Meta kernel gives the shape for
  tracing. Inductor lowers it to one kernel of the ``attention`` generator (``compiler/lowerings.py``);
- registers a Python kernel for SDPA's CompositeImplicitAutograd key. The Python dispatcher, on during
  tracing (torch.compile / AOTAutograd / export), calls it: for spyre tensors of a
  case the generator supports (see :func:`supported`) and with no gradient to compute, it emits
  ``spyre::flash_attention`` (symbolic shapes included: the kernel's spec is specialized per concrete
  shape at run time); everything else (other devices, training graphs, dropout, 3-d inputs, masks
  broadcast over keys, ...) takes torch's own decomposition, unchanged.

- registers the same Python kernel for SDPA's ``AutogradPrivateUse1`` and ``PrivateUse1`` keys (the
  latter is what ``torch.inference_mode()`` reaches), so eager calls on spyre route the same way: a
  supported call runs ``spyre::flash_attention`` (a single-op program, or its math on the host in fp32
  with ``TORCH_SPYRE_EAGER=host``), so a bool mask never becomes fp16 -inf scores, which DLFloat16 holds
  as NaN.

Training graphs and eager calls that need gradients keep the math path: its backward is the decomposed
ops, which all run on the card.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .._torch.device import call_composite_implicit, set_composite_python_kernel

_lib: torch.library.Library | None = None
_libs: list[torch.library.Library] = []  # kept alive: a Library's registrations end with it
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 1024  # largest head dim the generator was checked to tile (scratchpad)


def _math(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    op = torch.ops.aten.scaled_dot_product_attention.default
    return call_composite_implicit(op, q, k, v, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)


# Asked before laying the output out interleaved: the compiler installs its ``attention_heads_interleaved``
# switch here (compiler/hooks.py; the device imports nothing above it). Without a compiler: always.
_interleave_allowed: Callable[[], bool] = lambda: True  # noqa: E731


def set_interleave_policy(allowed: Callable[[], bool]) -> None:
    global _interleave_allowed
    _interleave_allowed = allowed


def heads_interleaved_out(views, itemsize: int) -> bool:
    """Does ``spyre::flash_attention`` return its [B, Hq, Lq, Dv] output as a view of a [B, Lq, Hq, Dv]
    buffer (the layout torch's CPU attention returns)? Then the usual ``out.transpose(1, 2).reshape(B, L,
    H * Dv)`` that merges the heads back is a view, not a copy kernel. ``views`` are q, k, v as
    (shape, strides, storage offset) in elements, all plain ints (anything else: False, the contiguous
    output). Stores move whole sticks of 128 bytes, so the layout is taken only where the attention
    generator can store it: each head's row is whole sticks, or heads of Dv dividing a stick (one head
    per K/V head, a multiple of a stick's heads) whose q/k/v rows are unit-stride and start on stick
    boundaries as seen here; one tile then computes and stores all heads of a stick. Whether q, k and v
    hold those heads side by side is decided later (the layout plan and the run-time placements): the
    generator loads the roles that do not member by member (``codegen/attention/plan.py``, GPT-2's
    16-wide heads after its KV cache), so this rule needs no layout. The meta kernel, the eager kernels
    and the lowering all ask this, so traced strides and the compiled kernel's agree. With the compiler's
    ``attention_heads_interleaved`` optimization switched off: never."""
    if not _interleave_allowed():
        return False
    numbers = [n for shape, strides, offset in views for n in (*shape, *strides, offset)]
    if any(type(n) is not int for n in numbers) or any(len(shape) != 4 for shape, _, _ in views):
        return False  # symbolic sizes (asking would add guards) or not attention's 4-d operands: contiguous
    (q_shape, _, _), (k_shape, _, _), (v_shape, _, _) = views
    _, Hq, _, D = q_shape
    Hkv, Dv = k_shape[1], v_shape[-1]
    lanes = 128 // itemsize
    if Dv % lanes == 0:
        return True
    if lanes % Dv or D != Dv or Hq != Hkv or Hq % (lanes // Dv):
        return False
    return all(strides[3] == 1 and strides[1] == D and strides[2] % lanes == 0 and offset % lanes == 0
               for _, strides, offset in views)


def _views(*ts):
    return [(tuple(t.shape), tuple(t.stride()), t.storage_offset()) for t in ts]


def _flash_eager(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    out = _math(q, k, v, attn_mask, is_causal, scale, enable_gqa)
    if heads_interleaved_out(_views(q, k, v), q.element_size()):
        return out.transpose(1, 2).contiguous().transpose(1, 2)
    return out.contiguous()


def _flash_device(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """Eager on spyre: through the device's fallback (``fallback.run``: a single-op program when eager
    ops are compiled, else the math decomposition on the host in the input dtype, timed on the card).
    Not the device's own math ops: a bool mask becomes -inf scores, which DLFloat16 holds as NaN."""
    from . import fallback

    return fallback.run(torch.ops.spyre.flash_attention.default, q, k, v, attn_mask, is_causal, scale, enable_gqa)


def _flash_meta(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    out = q.new_empty(q.shape[:3] + v.shape[-1:])
    if heads_interleaved_out(_views(q, k, v), q.element_size()):
        B, Hq, Lq, Dv = out.shape
        return q.new_empty((B, Lq, Hq, Dv)).transpose(1, 2)
    return out


def supported(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> str | None:
    """None when ``spyre::flash_attention`` can take this call, else why not (it keeps the math path)."""
    ts = [t for t in (q, k, v, attn_mask) if t is not None]
    if any(not isinstance(t, torch.Tensor) for t in ts):
        return "non-tensor operand"
    if q.device.type != "spyre" or any(t.device != q.device for t in ts):
        return "not all operands on one spyre device"
    if dropout_p:
        return "dropout"
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return "gradient needed (training graphs keep the math path)"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not 4-d"
    if q.dtype not in FLOAT_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return "dtype"
    (B, Hq, Lq, D), (Bk, Hkv, Lk, Dk), (Bv, Hv, Lv, _) = q.shape, k.shape, v.shape
    if not (B == Bk == Bv) or Hkv != Hv or Lk != Lv or D != Dk or min(q.numel(), k.numel(), v.numel()) == 0:
        return "shapes"
    if Hq % Hkv or (Hq != Hkv and not enable_gqa):
        return "heads"
    if max(D, v.shape[-1]) > MAX_HEAD_DIM:
        return "head dim"
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and attn_mask.dtype not in FLOAT_DTYPES:
            return "mask dtype"
        shape = attn_mask.shape
        if len(shape) > 4 or len(shape) < 1 or shape[-1] != Lk:
            return "mask shape"
        target = (B, Hq, Lq, Lk)[4 - len(shape):]
        if any(s not in (1, t) for s, t in zip(shape, target)):
            return "mask shape"
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        return "scale"
    return None


def _sdpa_py_impl(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if isinstance(q, torch.Tensor) and q.device.type == "spyre":
        if supported(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) is None:
            return torch.ops.spyre.flash_attention(q, k, v, attn_mask, bool(is_causal),
                                                   None if scale is None else float(scale), bool(enable_gqa))
    return call_composite_implicit(torch.ops.aten.scaled_dot_product_attention.default, q, k, v, attn_mask,
                                   dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def register() -> list[torch.library.Library]:
    """Define ``spyre::flash_attention`` and route traced spyre SDPA to it (idempotent)."""
    global _lib
    if _lib is not None:
        return [_lib, *_libs]
    lib = torch.library.Library("spyre", "DEF")
    lib.define("flash_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
               "bool is_causal=False, float? scale=None, bool enable_gqa=False) -> Tensor")
    lib.impl("flash_attention", _flash_eager, "CompositeExplicitAutograd")
    lib.impl("flash_attention", _flash_meta, "Meta")
    lib.impl("flash_attention", _flash_device, "PrivateUse1")
    # (a patch of torch's global state: docs/architecture.md)
    set_composite_python_kernel(torch.ops.aten.scaled_dot_product_attention.default, _sdpa_py_impl)
    # Eager: the dispatcher reaches SDPA's autograd key for spyre tensors before its composite kernel,
    # so a kernel there routes eager calls the same way (gradients keep the decomposition). Under
    # ``torch.inference_mode()`` the autograd keys are skipped: the same kernel on the backend key routes
    # those calls (else a bool-masked fp16 SDPA took the decomposition and gave NaN).
    aten_lib = torch.library.Library("aten", "IMPL")
    aten_lib.impl("scaled_dot_product_attention", _sdpa_py_impl, "AutogradPrivateUse1")
    aten_lib.impl("scaled_dot_product_attention", _sdpa_py_impl, "PrivateUse1")
    _lib = lib
    _libs.append(aten_lib)
    return [lib, aten_lib]

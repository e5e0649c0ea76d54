"""The attention spec and its checks: shapes, dtypes and layouts the generator supports (with a clear
error for anything else), the mask broadcast to [B, Hq, Lq, Lk], and the constants of the softmax."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torch_spyre.compiler.access import CodegenError, TensorView

NEG_INF = float("-inf")
# Running maxima never go below the lowest finite fp32: a row whose keys are all -inf in a block stays
# finite (exp(-inf - m) = 0, not NaN), while masks of finfo.min (finite, as Hugging Face writes them)
# keep torch's meaning: a row masked everywhere by finite values averages V uniformly.
MAX_CLAMP = float(np.finfo(np.float32).max)
L_FLOOR = 1e-30  # the row sum of a fully masked row is 0: divide by this instead
COMPUTE_DTYPES = ("dlfloat16", "float32")
MASK_DTYPES = ("bool", "dlfloat16", "float32")


@dataclass(frozen=True)
class AttentionSpec:
    """One SDPA call with static shapes. Each operand is a :class:`TensorView` (buffer name, layout and
    view); q/k/v/out share one dtype (fp16/bf16 -> DLFloat16 on the card, or fp32). ``block_q``,
    ``block_k``, ``heads_per_tile``, ``batches_per_tile`` and ``lane_heads_per_tile`` force the tiling (None:
    chosen by the cost model)."""

    query: TensorView
    key: TensorView
    value: TensorView
    out: TensorView
    attn_mask: TensorView | None = None
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    name: str = "sdpa"
    block_q: int | None = None
    block_k: int | None = None
    heads_per_tile: int | None = None
    batches_per_tile: int | None = None
    lane_heads_per_tile: int | None = None
    defer_stores: bool | None = None  # hold outputs in scratchpad and store them at the end (None: by estimate)
    exp_precision: str = "auto"  # "float32": exp of fp32 scores; "input": of scores rounded to the input dtype
    source_ops: tuple[str, ...] = ("aten._scaled_dot_product_flash_attention_for_cpu",)

    @staticmethod
    def build(batch: int, heads: int, seq_q: int, head_dim: int, *, kv_heads: int | None = None,
              seq_k: int | None = None, value_dim: int | None = None, dtype: Any = torch.float16,
              is_causal: bool = False, mask_shape: tuple[int, ...] | None = None, mask_dtype: Any = torch.bool,
              scale: float | None = None, enable_gqa: bool | None = None, **kw: Any) -> "AttentionSpec":
        """A spec over fresh buffers q, k, v, out (and mask) in the default layout."""
        hkv, lk = kv_heads or heads, seq_k or seq_q
        dv = value_dim or head_dim
        mask = TensorView.contiguous("mask", mask_shape, mask_dtype) if mask_shape is not None else None
        return AttentionSpec(
            TensorView.contiguous("q", (batch, heads, seq_q, head_dim), dtype),
            TensorView.contiguous("k", (batch, hkv, lk, head_dim), dtype),
            TensorView.contiguous("v", (batch, hkv, lk, dv), dtype),
            TensorView.contiguous("out", (batch, heads, seq_q, dv), dtype),
            mask, is_causal, scale, hkv != heads if enable_gqa is None else enable_gqa, **kw)


@dataclass(frozen=True)
class _Dims:
    B: int
    Hq: int
    Hkv: int
    Lq: int
    Lk: int
    D: int
    Dv: int
    dtype: str
    scale: float

    @property
    def group(self) -> int:
        return self.Hq // self.Hkv

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "dlfloat16" else 4


def _check_spec(spec: AttentionSpec) -> _Dims:
    """Shapes, dtypes and layouts the generator supports, with a clear error for anything else."""
    q, k, v, o = spec.query, spec.key, spec.value, spec.out
    for role, t in (("query", q), ("key", k), ("value", v), ("out", o)):
        if len(t.shape) != 4:
            raise CodegenError(f"sdpa {role} %{t.name} must be 4-d [batch, heads, seq, dim], got shape {list(t.shape)}")
    (B, Hq, Lq, D), (Bk, Hkv, Lk, Dk), (Bv, Hv, Lv, Dv) = q.shape, k.shape, v.shape
    if not (B == Bk == Bv) or Hkv != Hv or Lk != Lv or D != Dk:
        raise CodegenError(f"sdpa shapes do not agree: query {list(q.shape)}, key {list(k.shape)}, value "
                           f"{list(v.shape)}; need query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv]")
    if o.shape != (B, Hq, Lq, Dv):
        raise CodegenError(f"sdpa out %{o.name} has shape {list(o.shape)}, expected {[B, Hq, Lq, Dv]}")
    if min(B, Hq, Hkv, Lq, Lk, D, Dv) < 1:
        raise CodegenError(f"sdpa needs non-empty tensors: query {list(q.shape)}, key {list(k.shape)}")
    if Hq % Hkv:
        raise CodegenError(f"sdpa: query heads ({Hq}) must be a multiple of key/value heads ({Hkv}) for GQA")
    if Hq != Hkv and not spec.enable_gqa:
        raise CodegenError(f"sdpa: query has {Hq} heads but key/value {Hkv}; pass enable_gqa=True for GQA "
                           "(as torch requires)")
    dtypes = {t.dtype for t in (q, k, v, o)}
    if len(dtypes) != 1 or next(iter(dtypes)) not in COMPUTE_DTYPES:
        raise CodegenError(f"sdpa supports float16/bfloat16 (DLFloat16 on the card) or float32 operands of one "
                           f"dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}, out {o.dtype}")
    for role, t in (("query", q), ("key", k), ("value", v), ("out", o)):
        t.check_last_dim_sticked(role)
    if spec.attn_mask is not None:
        if spec.attn_mask.dtype not in MASK_DTYPES:
            raise CodegenError(f"sdpa attn_mask must be bool or float (fp16/bf16/fp32), got {spec.attn_mask.dtype}")
        spec.attn_mask.check_last_dim_sticked("attn_mask")
    scale = 1.0 / math.sqrt(D) if spec.scale is None else float(spec.scale)
    return _Dims(B, Hq, Hkv, Lq, Lk, D, Dv, next(iter(dtypes)), scale)


def _exp_in_input_dtype(spec: AttentionSpec, dims: _Dims) -> bool:
    """Whether the exp reads S*scale - m rounded to the input dtype (auto: yes for DLFloat16 inputs)."""
    if spec.exp_precision not in ("auto", "float32", "input"):
        raise CodegenError(f"sdpa exp_precision must be auto, float32 or input, got {spec.exp_precision!r}")
    return dims.dtype != "float32" and spec.exp_precision in ("auto", "input")


def _broadcast_mask(mask: TensorView, dims: _Dims) -> TensorView:
    """The mask as a 4-d view [B, Hq, Lq, Lk], broadcast dims with stride 0 (right-aligned, like torch)."""
    target = (dims.B, dims.Hq, dims.Lq, dims.Lk)
    if len(mask.shape) > 4:
        raise CodegenError(f"sdpa attn_mask %{mask.name} has {len(mask.shape)} dims; at most 4")
    pad = 4 - len(mask.shape)
    shape, strides = (1,) * pad + mask.shape, (0,) * pad + mask.strides
    new_strides = []
    for d, (s, st, t) in enumerate(zip(shape, strides, target)):
        if s != t and s != 1:
            raise CodegenError(f"sdpa attn_mask shape {list(mask.shape)} does not broadcast to {list(target)}")
        new_strides.append(0 if s == 1 else st)
    if target[3] > 1 and new_strides[3] == 0:
        raise CodegenError(f"sdpa attn_mask shape {list(mask.shape)} broadcasts over keys; expand it over keys "
                           "first (a mask constant over keys does not change the softmax anyway)")
    return TensorView(mask.name, mask.layout, target, tuple(new_strides), mask.storage_offset)

"""Scaled dot-product attention as a Spyre program: tiled flash attention with an online softmax.

    out = softmax(Q K^T * scale + mask) V        Q [B, Hq, Lq, D], K [B, Hkv, Lk, D], V [B, Hkv, Lk, Dv]

Semantics follow ``torch.nn.functional.scaled_dot_product_attention``: ``is_causal`` keeps key j for
query i when j <= i (top-left aligned, also when Lq != Lk); a bool ``attn_mask`` keeps True positions, a
float one is added to the scaled scores; both broadcast to [B, Hq, Lq, Lk]; a query with every key
masked gives 0; ``scale`` defaults to 1/sqrt(D); GQA (Hq a multiple of Hkv) needs ``enable_gqa``.

The program
-----------
*Work division.* A work item is one query block of ``block_q`` rows for ``heads_per_tile`` query heads
that share one K/V head (GQA): their Q rows are stacked into one [M, D] tile, so every K/V block loaded
serves all of them and the PE arrays see M rows per weight tile. Items are dealt to the cores
longest-first (causal items differ in cost), so cores finish together.

*Per item.* Load the Q tile, then stream K/V blocks of ``block_k`` rows (double-buffered: block j+1's DMA
overlaps block j's compute, and S/P alternate so the next QK^T runs on the PE arrays while the vector
unit finishes this block's softmax). For each block, in fp32:

    S = Q K^T                                   (MatMul, K^T a transposed view of the K tile)
    S = S + causal bias | where(mask, S, -inf)  (only where needed; a float mask: S = S*scale + mask)
    -m_new = min(-m_old, -rowmax(S)*scale)      (kept negated, so one fma forms S*scale - m_new)
    P = exp(S*scale - m_new)                    (rounded to the input dtype for the PE arrays)
    l = l*alpha + rowsum(P),  acc = acc*alpha + P V,   alpha = exp(m_old - m_new)

and at the end out = acc / l. The first block of an item skips the rescaling (it initialises m, l, acc).
Blocks entirely above the causal diagonal are never emitted. The causal bias of a diagonal block costs
no memory traffic: it is a strided view (strides [-1, 1]) of one vector [0 ... 0, -inf ... -inf] written
once per core, so element (i, j) reads entry c + j - i.

*Masked rows.* Running maxima are clamped at -1e30 so that a block where a row sees no key gives
exp(-inf) = 0 rather than NaN, and l is clamped at 1e-30 before the division, so a row that sees no key
at all comes out 0, as torch gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from torch_spyre.card.config import CardConfig
from torch_spyre.compiler.codegen_gather import (
    CodegenError,
    TensorArg,
    check_owns_sticks,
    device_dtype_of,
    dma_tile,
    sp_bytes,
)
from torch_spyre.compiler.decisions import BufferDecision, KernelDecisions
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, SpBuffer, plan
from torch_spyre.program import (
    STICK_BYTES,
    Elementwise,
    Instruction,
    MatMul,
    Program,
    Reduce,
    Scalar,
    SpTensor,
)

NEG_INF = float("-inf")
MAX_CLAMP = 1e30  # running maxima never go below -MAX_CLAMP (a fully masked row stays finite)
L_FLOOR = 1e-30  # the row sum of a fully masked row is 0: divide by this instead
COMPUTE_DTYPES = ("dlfloat16", "float32")
MASK_DTYPES = ("bool", "dlfloat16", "float32")

BLOCK_Q_CHOICES = (32, 64, 128, 256)
BLOCK_K_CHOICES = (64, 128, 256, 512)
MAX_TILE_ROWS = 512  # rows of a stacked Q tile (heads_per_tile * block_q)


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionSpec:
    """One SDPA call with static shapes. Each operand is a :class:`TensorArg` (buffer name, layout and
    view); q/k/v/out share one dtype (fp16/bf16 -> DLFloat16 on the card, or fp32). ``block_q``,
    ``block_k`` and ``heads_per_tile`` force the tiling (None: chosen by the cost model)."""

    query: TensorArg
    key: TensorArg
    value: TensorArg
    out: TensorArg
    attn_mask: TensorArg | None = None
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False
    name: str = "sdpa"
    block_q: int | None = None
    block_k: int | None = None
    heads_per_tile: int | None = None
    source_ops: tuple[str, ...] = ("aten._scaled_dot_product_flash_attention_for_cpu",)

    @staticmethod
    def build(batch: int, heads: int, seq_q: int, head_dim: int, *, kv_heads: int | None = None,
              seq_k: int | None = None, value_dim: int | None = None, dtype: Any = torch.float16,
              is_causal: bool = False, mask_shape: tuple[int, ...] | None = None, mask_dtype: Any = torch.bool,
              scale: float | None = None, enable_gqa: bool | None = None, **kw: Any) -> "AttentionSpec":
        """A spec over fresh buffers q, k, v, out (and mask) in the default layout."""
        hkv, lk = kv_heads or heads, seq_k or seq_q
        dv = value_dim or head_dim
        mask = TensorArg.contiguous("mask", mask_shape, mask_dtype) if mask_shape is not None else None
        return AttentionSpec(
            TensorArg.contiguous("q", (batch, heads, seq_q, head_dim), dtype),
            TensorArg.contiguous("k", (batch, hkv, lk, head_dim), dtype),
            TensorArg.contiguous("v", (batch, hkv, lk, dv), dtype),
            TensorArg.contiguous("out", (batch, heads, seq_q, dv), dtype),
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


def _broadcast_mask(mask: TensorArg, dims: _Dims) -> TensorArg:
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
    return TensorArg(mask.name, mask.layout, target, tuple(new_strides), mask.storage_offset)


# ---------------------------------------------------------------------------------------------
# Tiling and work division
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tiling:
    block_q: int
    block_k: int
    heads_per_tile: int

    def rows(self) -> int:
        return self.block_q * self.heads_per_tile


@dataclass
class WorkItem:
    b: int
    kv_head: int
    heads: tuple[int, ...]  # query heads stacked in this tile
    q0: int
    nq: int
    k_blocks: list[tuple[int, int]]  # (k0, nk) streamed for this item
    skipped: int  # key blocks above the causal diagonal

    @property
    def rows(self) -> int:
        return self.nq * len(self.heads)


def _work_items(dims: _Dims, t: Tiling, causal: bool) -> list[WorkItem]:
    items = []
    all_blocks = [(k0, min(t.block_k, dims.Lk - k0)) for k0 in range(0, dims.Lk, t.block_k)]
    for b in range(dims.B):
        for hk in range(dims.Hkv):
            for g0 in range(0, dims.group, t.heads_per_tile):
                heads = tuple(hk * dims.group + g0 + i for i in range(t.heads_per_tile))
                for q0 in range(0, dims.Lq, t.block_q):
                    nq = min(t.block_q, dims.Lq - q0)
                    # Causal: query i sees keys j <= i, so nothing at or past q0 + nq.
                    blocks = [kb for kb in all_blocks if not causal or kb[0] < q0 + nq]
                    items.append(WorkItem(b, hk, heads, q0, nq, blocks, len(all_blocks) - len(blocks)))
    return items


def _matmul_cycles(cfg: CardConfig, m: int, k: int, n: int, dtype: str) -> int:
    """The card's weight-stationary PE cost (same arithmetic as card/timing.py, which stays the judge)."""
    simd = cfg.pe_simd_fp16 // 2 if dtype == "float32" else cfg.pe_simd_fp16
    tiles = -(-k // cfg.pe_rows) * -(-n // (cfg.pe_cols * simd))
    return -(-tiles // cfg.corelets_in_use) * (m + cfg.pe_rows + cfg.pe_cols + cfg.mac_latency_cycles) + cfg.pe_rows


def _vector_cycles(cfg: CardConfig, elements: int, itemsize: int, transcendental: bool = False) -> int:
    c = -(-elements * itemsize // (2 * cfg.vector_fp16_per_cycle * cfg.corelets_in_use))
    return c * (1 + cfg.vector_transcendental_cycles) if transcendental else c


def _item_cost(cfg: CardConfig, dims: _Dims, it: WorkItem, has_mask: bool) -> dict[str, float]:
    """Estimated cycles of one work item on each engine, and its DRAM bytes."""
    isz, m = dims.itemsize, it.rows
    pe = vec = 0
    dram = m * dims.D * isz + m * dims.Dv * isz
    for k0, nk in it.k_blocks:
        pe += _matmul_cycles(cfg, m, dims.D, nk, dims.dtype) + _matmul_cycles(cfg, m, nk, dims.Dv, dims.dtype)
        s = m * nk
        vec += _vector_cycles(cfg, s, 4) * 3 + _vector_cycles(cfg, s, 4, True)  # (mask) max, fma, exp
        vec += _vector_cycles(cfg, s, isz) + _vector_cycles(cfg, m * dims.Dv, 4)  # rowsum, rescale
        if has_mask:
            vec += _vector_cycles(cfg, s, 4)
        dram += nk * (dims.D + dims.Dv) * isz
    return {"pe": pe, "vector": vec, "dram_bytes": dram}


def _assign(costs: list[float], cores: int) -> list[list[int]]:
    """Longest processing time first: each item to the least loaded core."""
    loads = [0.0] * cores
    out: list[list[int]] = [[] for _ in range(cores)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        c = min(range(cores), key=lambda c: loads[c])
        loads[c] += costs[i]
        out[c].append(i)
    return [sorted(x) for x in out]


def _estimate(cfg: CardConfig, dims: _Dims, t: Tiling, causal: bool, has_mask: bool) -> dict[str, Any]:
    """Kernel time estimate of a tiling: per core max(PE, vector, DRAM share), cores balanced by LPT."""
    items = _work_items(dims, t, causal)
    costs = [_item_cost(cfg, dims, it, has_mask) for it in items]
    n_cores = min(cfg.num_cores, len(items))
    dram_bw = min(cfg.dma_bytes_per_cycle * cfg.clock_hz, cfg.dram_read_bandwidth / n_cores)
    cycles = [max(c["pe"], c["vector"], c["dram_bytes"] / dram_bw * cfg.clock_hz) for c in costs]
    per_core = _assign(cycles, n_cores)
    makespan = max(sum(cycles[i] for i in core) for core in per_core)
    return {"block_q": t.block_q, "block_k": t.block_k, "heads_per_tile": t.heads_per_tile, "items": len(items),
            "cores": n_cores, "est_us": round((makespan / cfg.clock_hz + cfg.kernel_fixed_cost_s) * 1e6, 2)}


def _candidates(dims: _Dims, spec: AttentionSpec, uniform_groups: list[int]) -> list[Tiling]:
    bq = [spec.block_q] if spec.block_q else [b for b in BLOCK_Q_CHOICES if b < 2 * dims.Lq] or [BLOCK_Q_CHOICES[0]]
    bk = [spec.block_k] if spec.block_k else [b for b in BLOCK_K_CHOICES if b < 2 * dims.Lk] or [BLOCK_K_CHOICES[0]]
    gs = [spec.heads_per_tile] if spec.heads_per_tile else uniform_groups
    out = [Tiling(q, k, g) for q in bq for k in bk for g in gs]
    return [t for t in out if t.rows() <= MAX_TILE_ROWS] or out


def _uniform_groups(spec: AttentionSpec, dims: _Dims) -> list[int]:
    """Heads per tile that divide the GQA group and keep the stacked Q rows at one lane offset (a Q view
    whose heads start mid-stick, e.g. heads of 32 in a fused qkv buffer, cannot be stacked)."""
    lane0 = [spec.query.row_sticks(np.array([[0, h, 0]]), 0, dims.D)[1] for h in range(dims.Hq)]
    out = []
    for g in range(1, dims.group + 1):
        if dims.group % g == 0 and all(len({lane0[h0 + i] for i in range(g)}) == 1 for h0 in range(0, dims.Hq, g)):
            out.append(g)
    return out


# ---------------------------------------------------------------------------------------------
# Scratchpad
# ---------------------------------------------------------------------------------------------
def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _row_lanes(arg: TensorArg, ncols: int, lane0s: list[int] | None = None) -> int:
    """Lanes per scratchpad row for rows of ``ncols`` elements of ``arg``: the sticks covering them at
    the worst lane offset (``lane0s`` when known, else any)."""
    lanes = arg.lanes
    worst = max(lane0s) if lane0s is not None else lanes - 1
    return -(-(worst + ncols) // lanes) * lanes


def _row_widths(spec: AttentionSpec, dims: _Dims, mask: TensorArg | None, block_k: int) -> dict[str, int]:
    def lane0s(arg: TensorArg, heads: int, ncols: int) -> list[int]:
        return [arg.row_sticks(np.array([[b, h, 0]]), 0, ncols)[1] for b in range(dims.B) for h in range(heads)]

    w = {"q": _row_lanes(spec.query, dims.D, lane0s(spec.query, dims.Hq, dims.D)),
         "k": _row_lanes(spec.key, dims.D, lane0s(spec.key, dims.Hkv, dims.D)),
         "v": _row_lanes(spec.value, dims.Dv, lane0s(spec.value, dims.Hkv, dims.Dv)),
         "o": _ceil_to(dims.Dv, spec.out.lanes)}
    if mask is not None:
        w["mask"] = _row_lanes(mask, block_k)
    return w


def _buffers(dims: _Dims, t: Tiling, mask: TensorArg | None, causal: bool, w: dict[str, int]) -> list[SpBuffer]:
    """Every scratchpad buffer of one core, two of each that alternates (per item or per block). All are
    live for the whole kernel, since items and blocks reuse them in turn."""
    M, Bc, isz = t.rows(), t.block_k, dims.itemsize
    b: list[SpBuffer] = []
    for p in range(2):
        b += [SpBuffer(f"q{p}", sp_bytes(isz, M, w["q"])), SpBuffer(f"acc{p}", sp_bytes(4, M, dims.Dv)),
              SpBuffer(f"o{p}", sp_bytes(isz, M, w["o"])), SpBuffer(f"l{p}", sp_bytes(4, M)),
              SpBuffer(f"k{p}", sp_bytes(isz, Bc, w["k"])), SpBuffer(f"v{p}", sp_bytes(isz, Bc, w["v"])),
              SpBuffer(f"s{p}", sp_bytes(4, M, Bc)), SpBuffer(f"p{p}", sp_bytes(isz, M, Bc)),
              SpBuffer(f"nm{p}", sp_bytes(4, M)), SpBuffer(f"alpha{p}", sp_bytes(4, M)),
              SpBuffer(f"mcur{p}", sp_bytes(4, M)), SpBuffer(f"lcur{p}", sp_bytes(4, M))]
        if mask is not None:
            mh = t.heads_per_tile if mask.strides[1] else 1
            mq = t.block_q if mask.strides[2] else 1
            b.append(SpBuffer(f"mask{p}", sp_bytes(mask.layout.itemsize, mh, mq, w["mask"])))
    if causal:
        b.append(SpBuffer("causal", sp_bytes(4, 2 * (t.block_q + Bc))))
    return b


# ---------------------------------------------------------------------------------------------
# Emission
# ---------------------------------------------------------------------------------------------
def _sp(buf: dict[str, int], name: str, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
        elem_offset: int = 0) -> SpTensor:
    from torch_spyre.program import SP_DTYPES

    return SpTensor(buf[name] + elem_offset * SP_DTYPES[dtype], dtype, shape, strides)


def _ew(op: str, out: SpTensor, *inputs: SpTensor | float) -> Elementwise:
    return Elementwise(op, out, tuple(x if isinstance(x, SpTensor) else Scalar(x) for x in inputs))


def _bcast_rows(col: SpTensor, cols: int) -> SpTensor:
    """A [R, 1] column broadcast across ``cols`` columns."""
    return SpTensor(col.offset, col.dtype, (col.shape[0], cols), (col.strides[0], 0))


class _CoreEmitter:
    """Emits one core's instructions for its work items."""

    def __init__(self, spec: AttentionSpec, dims: _Dims, t: Tiling, mask: TensorArg | None, buf: dict[str, int]):
        self.spec, self.dims, self.t, self.mask, self.buf = spec, dims, t, mask, buf
        self.ins: list[Instruction] = []
        self.block = 0  # global block counter: parity picks the K/V/S/P buffer set
        self.cdt = dims.dtype  # the dtype P is rounded to for the PE arrays
        self.stats = {"blocks": 0, "causal_bias_blocks": 0, "skipped_blocks": 0}
        self.prev_nm: SpTensor | None = None

    # --- set-up ----------------------------------------------------------------------------------
    def prologue(self) -> None:
        d, t = self.dims, self.t
        if self.spec.is_causal:
            z = t.block_q + t.block_k
            self.ins += [_ew("copy", _sp(self.buf, "causal", "float32", (z,)), 0.0),
                         _ew("copy", _sp(self.buf, "causal", "float32", (z,), elem_offset=z), NEG_INF)]
        wo = _ceil_to(d.Dv, self.spec.out.lanes)
        if wo > d.Dv:  # output padding lanes are stored with the row: give them a value once
            for p in range(2):
                self.ins.append(_ew("copy", _sp(self.buf, f"o{p}", d.dtype, (t.rows(), wo - d.Dv), (wo, 1), d.Dv), 0.0))

    # --- one item --------------------------------------------------------------------------------
    def item(self, it: WorkItem, parity: int) -> None:
        d = self.dims
        q_view = self._load_rows(self.spec.query, f"q{parity}", it.b, it.heads, it.q0, it.nq, d.D)
        self.stats["skipped_blocks"] += it.skipped
        for j, (k0, nk) in enumerate(it.k_blocks):
            self._block(it, parity, q_view, k0, nk, first=(j == 0))
        self._finish(it, parity)

    def _load_rows(self, arg: TensorArg, bufname: str, b: int, heads: tuple[int, ...], r0: int, n: int,
                   ncols: int) -> SpTensor:
        """Load rows [r0, r0+n) of each head in ``heads`` stacked in a tile; return the [len*n, ncols] view."""
        devs, lane0 = [], None
        for h in heads:
            lead = np.stack([np.full(n, b), np.full(n, h), np.arange(r0, r0 + n)], axis=1)
            dev, l0 = arg.row_sticks(lead, 0, ncols)
            if lane0 is not None and l0 != lane0:
                raise CodegenError(f"%{arg.name}: stacked heads start at different lanes")  # _uniform_groups prevents it
            devs.append(dev)
            lane0 = l0
        dev = np.stack(devs)
        self.ins += dma_tile(arg, dev, self.buf[bufname], store=False)
        width = dev.shape[-1] * arg.lanes
        return _sp(self.buf, bufname, arg.dtype, (len(heads) * n, ncols), (width, 1), lane0)

    def _block(self, it: WorkItem, ip: int, q: SpTensor, k0: int, nk: int, first: bool) -> None:
        d, t, spec = self.dims, self.t, self.spec
        bp = self.block % 2
        self.block += 1
        self.stats["blocks"] += 1
        M = it.rows
        kt = self._load_rows(spec.key, f"k{bp}", it.b, (it.kv_head,), k0, nk, d.D)
        kt = SpTensor(kt.offset, kt.dtype, (d.D, nk), (1, kt.strides[0]))  # K^T through strides
        v = self._load_rows(spec.value, f"v{bp}", it.b, (it.kv_head,), k0, nk, d.Dv)
        s2 = _sp(self.buf, f"s{bp}", "float32", (M, nk), (t.block_k, 1))
        s3 = _sp(self.buf, f"s{bp}", "float32", (len(it.heads), it.nq, nk), (it.nq * t.block_k, t.block_k, 1))
        p2 = _sp(self.buf, f"p{bp}", self.cdt, (M, nk), (nk, 1))
        col = lambda name: _sp(self.buf, name, "float32", (M, 1))  # noqa: E731
        nm, alpha = col(f"nm{bp}"), col(f"alpha{bp}")
        mcur, lcur, l, acc = col(f"mcur{bp}"), col(f"lcur{bp}"), col(f"l{ip}"), _sp(self.buf, f"acc{ip}", "float32", (M, d.Dv))

        self.ins.append(MatMul(s2, q, kt))
        nm_old = self.prev_nm
        scaled, masked = self._bias(it, s3, k0, nk)
        # -m_cur: the block's row maxima in scaled units, negated; clamped so masked rows stay finite.
        self.ins.append(Reduce("max", mcur, s2, axis=1))
        self.ins.append(_ew("mul", mcur, mcur, -1.0 if scaled else -d.scale))
        if masked:
            self.ins.append(_ew("minimum", mcur, mcur, MAX_CLAMP))
        if first:
            nm = mcur
        else:
            self.ins += [_ew("minimum", nm, nm_old, mcur), _ew("sub", alpha, nm, nm_old), _ew("exp", alpha, alpha)]
        # P = exp(S * scale - m): one fma (or add) and the exp, rounded for the PE arrays.
        if scaled:
            self.ins.append(_ew("add", s2, s2, _bcast_rows(nm, nk)))
        else:
            self.ins.append(_ew("fma", s2, s2, d.scale, _bcast_rows(nm, nk)))
        self.ins.append(_ew("exp", p2, s2))
        if first:
            self.ins += [Reduce("sum", l, p2, axis=1), MatMul(acc, p2, v)]
        else:
            self.ins += [Reduce("sum", lcur, p2, axis=1), _ew("fma", l, l, alpha, lcur),
                         _ew("mul", acc, acc, _bcast_rows(alpha, d.Dv)), MatMul(acc, p2, v, accumulate=True)]
        self.prev_nm = nm  # the running -max lives in this block's buffer set (mcur or nm)

    def _bias(self, it: WorkItem, s3: SpTensor, k0: int, nk: int) -> tuple[bool, bool]:
        """Apply the mask and the causal bias to S; return (S is now scaled, some entry may be -inf)."""
        d, spec = self.dims, self.spec
        scaled = masked = False
        if self.mask is not None:
            mview = self._load_mask(it, k0, nk)
            if self.mask.dtype == "bool":
                self.ins.append(_ew("where", s3, mview, s3, NEG_INF))
            else:
                self.ins.append(_ew("fma", s3, s3, d.scale, mview))
                scaled = True
            masked = True
        elif d.scale <= 0:  # the row max only commutes with a positive scale
            self.ins.append(_ew("mul", s3, s3, d.scale))
            scaled = True
        if spec.is_causal and k0 + nk - 1 > it.q0:  # the block crosses the diagonal
            self.ins.append(_ew("add", s3, s3, self._causal_view(it, k0, nk)))
            self.stats["causal_bias_blocks"] += 1
            masked = True
        return scaled, masked

    def _causal_view(self, it: WorkItem, k0: int, nk: int) -> SpTensor:
        """Element (h, i, j) of the view reads causal[c + j - i], 0 where key k0+j <= query q0+i, else -inf."""
        z = self.t.block_q + self.t.block_k
        c = z - 1 - (it.q0 - k0)
        return _sp(self.buf, "causal", "float32", (len(it.heads), it.nq, nk), (0, -1, 1), c)

    def _load_mask(self, it: WorkItem, k0: int, nk: int) -> SpTensor:
        m = self.mask
        bp = (self.block - 1) % 2
        heads = it.heads if m.strides[1] else it.heads[:1]
        rows = it.nq if m.strides[2] else 1
        devs, lane0 = [], 0
        for h in heads:
            lead = np.stack([np.full(rows, it.b), np.full(rows, h), np.arange(it.q0, it.q0 + rows)], axis=1)
            dev, lane0 = m.row_sticks(lead, k0, nk)
            devs.append(dev)
        dev = np.stack(devs)
        self.ins += dma_tile(m, dev, self.buf[f"mask{bp}"], store=False)
        w = dev.shape[-1] * m.lanes
        strides = (rows * w if len(heads) > 1 else 0, w if rows > 1 else 0, 1)
        return _sp(self.buf, f"mask{bp}", m.dtype, (len(it.heads), it.nq, nk), strides, lane0)

    def _finish(self, it: WorkItem, ip: int) -> None:
        d, spec = self.dims, self.spec
        M = it.rows
        l = _sp(self.buf, f"l{ip}", "float32", (M, 1))
        acc = _sp(self.buf, f"acc{ip}", "float32", (M, d.Dv))
        if self.mask is not None:  # a row that saw no key has l = 0 (and acc = 0): out 0, not NaN
            self.ins.append(_ew("maximum", l, l, L_FLOOR))
        self.ins.append(_ew("reciprocal", l, l))
        wo = _ceil_to(d.Dv, spec.out.lanes)
        self.ins.append(_ew("mul", _sp(self.buf, f"o{ip}", d.dtype, (M, d.Dv), (wo, 1)), acc, _bcast_rows(l, d.Dv)))
        devs = []
        for h in it.heads:
            lead = np.stack([np.full(it.nq, it.b), np.full(it.nq, h), np.arange(it.q0, it.q0 + it.nq)], axis=1)
            dev, lane0 = spec.out.row_sticks(lead, 0, d.Dv)
            check_owns_sticks(spec.out, lane0, d.Dv, "sdpa out")
            devs.append(dev)
        self.ins += dma_tile(spec.out, np.stack(devs), self.buf[f"o{ip}"], store=True)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def _choose_tiling(spec: AttentionSpec, dims: _Dims, mask: TensorArg | None, cfg: CardConfig
                   ) -> tuple[Tiling, Any, list[dict[str, Any]]]:
    """The cheapest tiling by the estimate whose scratchpad plan fits; every candidate is recorded."""
    considered = []
    best = None
    for t in _candidates(dims, spec, _uniform_groups(spec, dims)):
        est = _estimate(cfg, dims, t, spec.is_causal, mask is not None)
        widths = _row_widths(spec, dims, mask, t.block_k)
        try:
            sp_plan = plan(_buffers(dims, t, mask, spec.is_causal, widths), cfg.scratchpad_plannable_bytes)
        except ScratchpadOverflowError as e:
            considered.append({**est, "rejected": f"scratchpad: needs {e.needed} B"})
            continue
        est["scratchpad_bytes"] = sp_plan.peak_bytes
        considered.append(est)
        # Near-ties (0.1 us) go to bigger tiles: fewer instructions and DMA latencies than the estimate sees.
        key = (round(est["est_us"], 1), -t.rows() * t.block_k)
        if best is None or key < best[0]:
            best = (key, t, sp_plan)
    if best is None:
        raise CodegenError(f"sdpa {spec.name}: no tiling fits the scratchpad; tried {considered}")
    considered.sort(key=lambda c: c.get("est_us", 1e30))
    return best[1], best[2], considered


def build_attention(spec: AttentionSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """Scaled dot-product attention -> (Program, KernelDecisions). Raises CodegenError for specs it
    cannot compile (the message says why)."""
    dims = _check_spec(spec)
    mask = _broadcast_mask(spec.attn_mask, dims) if spec.attn_mask is not None else None
    tiling, sp_plan, considered = _choose_tiling(spec, dims, mask, config)
    items = _work_items(dims, tiling, spec.is_causal)
    costs = [_item_cost(config, dims, it, mask is not None) for it in items]
    cycles = [max(c["pe"], c["vector"]) for c in costs]
    per_core = _assign(cycles, min(config.num_cores, len(items)))
    buf = {b.name: b.offset for b in sp_plan.buffers}

    cores: dict[int, list[Instruction]] = {}
    totals = {"blocks": 0, "causal_bias_blocks": 0, "skipped_blocks": 0}
    for core, idxs in enumerate(per_core):
        if not idxs:
            continue
        em = _CoreEmitter(spec, dims, tiling, mask, buf)
        em.prologue()
        for n, i in enumerate(idxs):
            em.item(items[i], n % 2)
        cores[core] = em.ins
        for k in totals:
            totals[k] += em.stats[k]

    decisions = _decisions(spec, dims, tiling, sp_plan, per_core, items, cycles, totals, considered, mask)
    program = Program(spec.name, _operands(spec), cores,
                      {"kind": "attention", "decisions": decisions.to_dict()})
    return program, decisions


def _operands(spec: AttentionSpec) -> list:
    ins = [spec.query, spec.key, spec.value] + ([spec.attn_mask] if spec.attn_mask is not None else [])
    seen: dict[str, TensorArg] = {}
    for t in ins:
        if t.name in seen and seen[t.name].layout != t.layout:
            raise CodegenError(f"sdpa operands named %{t.name} disagree on the buffer's layout")
        seen.setdefault(t.name, t)
    if spec.out.name in seen:
        raise CodegenError(f"sdpa out %{spec.out.name} is also an input; write to a separate buffer")
    return [t.operand("in") for t in seen.values()] + [spec.out.operand("out")]


def _decisions(spec: AttentionSpec, dims: _Dims, t: Tiling, sp_plan: Any, per_core: list[list[int]],
               items: list[WorkItem], cycles: list[float], totals: dict[str, int], considered: list[dict[str, Any]],
               mask: TensorArg | None) -> KernelDecisions:
    dec = KernelDecisions(spec.name, "attention", source_ops=list(spec.source_ops))
    roles = [("input", spec.query), ("input", spec.key), ("input", spec.value), ("output", spec.out)]
    if spec.attn_mask is not None:
        roles.append(("input", spec.attn_mask))
    dec.buffers = [BufferDecision(t.name, role, t.describe()) for role, t in roles]
    loads = [sum(cycles[i] for i in c) for c in per_core]
    dec.work_division = {
        "unit": "(batch, kv head, query heads stacked per tile, query block)", "items": len(items),
        "cores": sum(1 for c in per_core if c), "items_per_core": [len(c) for c in per_core if c],
        "assignment": "longest first to the least loaded core",
        "est_load_imbalance": round(max(loads) / (sum(loads) / len(loads)), 3) if loads and sum(loads) else 1.0,
    }
    dec.tiling = {"block_q": t.block_q, "block_k": t.block_k, "heads_per_tile": t.heads_per_tile,
                  "tile_rows": t.rows(), "kv_blocks_streamed": totals["blocks"],
                  "causal_blocks_skipped": totals["skipped_blocks"],
                  "causal_bias_blocks": totals["causal_bias_blocks"], "scale": dims.scale,
                  "gqa_group": dims.group, "is_causal": spec.is_causal,
                  "mask": None if mask is None else f"{mask.dtype} strides {list(mask.strides)}"}
    dec.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                      "buffers": {b.name: [b.offset, b.aligned_bytes] for b in sp_plan.buffers}}
    dec.overlap = {"double_buffered": ["k", "v", "s", "p", "mask (per block)", "q", "acc", "o (per item)"]}
    dec.alternatives = considered[:8]
    dec.notes = [
        "S, running max and sum, and the accumulator are fp32; P is rounded to the input dtype for the PE arrays",
        "alternative not taken: S in DLFloat16 halves the exp's vector time but rounds scores to 9 fraction bits",
        "causal bias is a strided view of one [0.., -inf..] vector per core: no mask traffic for is_causal",
    ]
    if dims.dtype == "dlfloat16" and mask is not None and mask.dtype == "dlfloat16":
        dec.notes.append("a float16 mask holding -inf reads as NaN on the card (DLFloat16 has one NaN/Inf code); "
                         "use torch.finfo(torch.float16).min for masked positions, as Hugging Face does")
    return dec

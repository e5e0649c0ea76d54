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
serves all of them and the PE arrays see M rows per weight tile. ``batches_per_tile`` batches are
stacked too (IBM's layout interleaves the batch stick by stick: neighbouring batches make one DRAM
burst), each with its own QK^T and PV. Heads that sit side by side in the same sticks (heads of 32 in
a fused qkv buffer) share a tile as ``lane_heads``: each stick is loaded once and every head reads its
lanes through a view. Items are dealt to the cores longest-first (causal items differ in cost), and
the cores used are placed outwards from the memory interface's ring stop, alternating sides.

*Per item.* Load the Q tile, then stream K/V blocks of ``block_k`` rows (double-buffered: block j+1's DMA
overlaps block j's compute, and S/P alternate so the next QK^T runs on the PE arrays while the vector
unit finishes this block's softmax). For each block, in fp32:

    S = Q K^T                                   (MatMul, K^T a transposed view of the K tile)
    S = S + causal bias | where(mask, S, -inf)  (only where needed; a float mask: S = S*scale + mask)
    -m_new = min(-m_old, -rowmax(S)*scale)      (kept negated, so one fma forms S*scale - m_new)
    P = exp(S*scale - m_new)                    (rounded to the input dtype for the PE arrays; for
                                                 DLFloat16 inputs the exp's argument too, in blocks
                                                 without -inf: half the vector bytes)
    l = l*alpha + rowsum(P),  acc = acc*alpha + P V,   alpha = exp(m_old - m_new)

and at the end out = acc / l. The first block of an item skips the rescaling (it initialises m, l, acc).
Blocks entirely above the causal diagonal are never emitted. The causal bias of a diagonal block costs
no memory traffic: it is a strided view (strides [-1, 1]) of one vector [0 ... 0, -inf ... -inf] written
once per core, so element (i, j) reads entry c + j - i.

*Masked rows.* Running maxima are clamped at the lowest finite fp32 so that a block where a row sees no
key gives exp(-inf) = 0 rather than NaN, and l is clamped at 1e-30 before the division, so a row that
sees no key at all comes out 0, as torch gives (a row masked by finite finfo.min values averages V, as
in torch).
"""

from __future__ import annotations

import math
import dataclasses
import heapq
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from torch_spyre.card import costs
from torch_spyre.card.config import CardConfig
from torch_spyre.compiler.codegen_gather import (
    CodegenError,
    TensorArg,
    check_owns_sticks,
    core_ids,
    dma_tile,
    dram_runs,
    sp_bytes,
)
from torch_spyre.compiler.decisions import BufferDecision, KernelDecisions
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, SpBuffer, plan
from torch_spyre.program import (
    SP_DTYPES,
    Barrier,
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
# Running maxima never go below the lowest finite fp32: a row whose keys are all -inf in a block stays
# finite (exp(-inf - m) = 0, not NaN), while masks of finfo.min (finite, as Hugging Face writes them)
# keep torch's meaning: a row masked everywhere by finite values averages V uniformly.
MAX_CLAMP = float(np.finfo(np.float32).max)
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
    ``block_k``, ``heads_per_tile``, ``batches_per_tile`` and ``lane_heads_per_tile`` force the tiling (None:
    chosen by the cost model)."""

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


def _exp_in_input_dtype(spec: AttentionSpec, dims: _Dims) -> bool:
    """Whether the exp reads S*scale - m rounded to the input dtype (auto: yes for DLFloat16 inputs)."""
    if spec.exp_precision not in ("auto", "float32", "input"):
        raise CodegenError(f"sdpa exp_precision must be auto, float32 or input, got {spec.exp_precision!r}")
    return dims.dtype != "float32" and spec.exp_precision in ("auto", "input")


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
    heads_per_tile: int  # query heads of one GQA group stacked in a tile
    batches_per_tile: int = 1  # batches stacked too: IBM's layout interleaves batch stick by stick
    lane_heads: int = 1  # heads side by side in the same sticks (e.g. heads of 32 in a fused qkv buffer)
    pack_out: bool = False  # the lane heads' outputs share sticks too: stored together, one row per stick row
    out_slots: int = 2  # output tiles per core: 2 alternate; more hold every item's output to store at the end

    def rows(self) -> int:
        return self.block_q * self.heads_per_tile * self.batches_per_tile * self.lane_heads


@dataclass
class WorkItem:
    """A tile's work. Its query heads are ``members`` groups (one unless heads sit side by side in the
    same sticks) of stacked heads sharing a K/V head; S rows are ordered (batch, member, head, row)."""

    batches: tuple[int, ...]
    kv_heads: tuple[int, ...]  # K/V head of each member
    heads: tuple[int, ...]  # query heads, member-major
    q0: int
    nq: int
    k_blocks: list[tuple[int, int]]  # (k0, nk) streamed for this item
    skipped: int  # key blocks above the causal diagonal

    @property
    def members(self) -> int:
        return len(self.kv_heads)

    @property
    def stacked(self) -> tuple[int, ...]:
        """The heads of the first member (the rows loaded; other members share their sticks)."""
        return self.heads[: len(self.heads) // self.members]

    @property
    def rows(self) -> int:
        return self.nq * len(self.heads) * len(self.batches)

    @property
    def sub_rows(self) -> int:
        """Rows of one (batch, member) sub-tile: its stacked heads."""
        return self.nq * len(self.stacked)


def _work_items(dims: _Dims, t: Tiling, causal: bool) -> list[WorkItem]:
    items = []
    all_blocks = [(k0, min(t.block_k, dims.Lk - k0)) for k0 in range(0, dims.Lk, t.block_k)]
    for b0 in range(0, dims.B, t.batches_per_tile):
        batches = tuple(range(b0, min(dims.B, b0 + t.batches_per_tile)))
        for heads, kv_heads in _head_sets(dims, t):
            for q0 in range(0, dims.Lq, t.block_q):
                nq = min(t.block_q, dims.Lq - q0)
                # Causal: query i sees keys j <= i, so nothing at or past q0 + nq.
                blocks = [kb for kb in all_blocks if not causal or kb[0] < q0 + nq]
                items.append(WorkItem(batches, kv_heads, heads, q0, nq, blocks, len(all_blocks) - len(blocks)))
    return items


def _head_sets(dims: _Dims, t: Tiling) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(query heads, K/V head per member) of each tile: ``heads_per_tile`` heads of one GQA group, or
    ``lane_heads`` consecutive heads that share sticks (then one head per member)."""
    if t.lane_heads > 1:
        return [(tuple(range(h0, h0 + t.lane_heads)), tuple(h // dims.group for h in range(h0, h0 + t.lane_heads)))
                for h0 in range(0, dims.Hq, t.lane_heads)]
    return [(tuple(hk * dims.group + g0 + i for i in range(t.heads_per_tile)), (hk,))
            for hk in range(dims.Hkv) for g0 in range(0, dims.group, t.heads_per_tile)]


def _matmul_cycles(cfg: CardConfig, m: int, k: int, n: int, dtype: str) -> int:
    return costs.pe_matmul_cycles(cfg, m, k, n, dtype)


def _vector_cycles(cfg: CardConfig, elements: int, itemsize: int, transcendental: bool = False) -> int:
    return costs.vector_cycles(cfg, elements, itemsize, transcendental)


def _block_cycles(cfg: CardConfig, dims: _Dims, it: WorkItem, nk: int, has_mask: bool) -> tuple[int, int]:
    """(PE, vector) cycles of one K/V block of an item."""
    return _block_cycles_of(cfg, dims, it.rows, it.sub_rows, len(it.batches) * it.members, nk, has_mask)


@lru_cache(maxsize=4096)
def _block_cycles_of(cfg: CardConfig, dims: _Dims, m: int, sub: int, n_sub: int, nk: int,
                     has_mask: bool) -> tuple[int, int]:
    """(PE, vector) cycles of a block of ``m`` rows in ``n_sub`` sub-tiles of ``sub`` rows (cached: the
    tiling search asks for the same few shapes many times)."""
    isz = dims.itemsize
    pe = n_sub * (_matmul_cycles(cfg, sub, dims.D, nk, dims.dtype) + _matmul_cycles(cfg, sub, nk, dims.Dv, dims.dtype))
    s = m * nk
    exp_width = 4 if has_mask or dims.dtype == "float32" else isz  # see _exp_in_input_dtype
    vec = _vector_cycles(cfg, s, 4) * (2 + has_mask) + _vector_cycles(cfg, s, exp_width, True)  # mask, max, fma, exp
    vec += _vector_cycles(cfg, s, isz) + _vector_cycles(cfg, m * dims.Dv, 4)  # rowsum, rescale
    return pe, vec


def _item_cycles(cfg: CardConfig, dims: _Dims, it: WorkItem, has_mask: bool) -> float:
    """Estimated cycles of one work item: the PE arrays and the vector unit overlap across blocks (the
    program is software-pipelined), so the busier of the two sets the pace."""
    pe = vec = 0
    m, sub, n_sub = it.rows, it.sub_rows, len(it.batches) * it.members
    for nk, count in Counter(nk for _k0, nk in it.k_blocks).items():  # blocks come in one or two sizes
        p, v = _block_cycles_of(cfg, dims, m, sub, n_sub, nk, has_mask)
        pe, vec = pe + count * p, vec + count * v
    return max(pe, vec) + _vector_cycles(cfg, it.rows * dims.Dv, 4)


def _dram_seconds(cfg: CardConfig, spec: AttentionSpec, dims: _Dims, t: Tiling, items: list[WorkItem],
                  mask: TensorArg | None) -> tuple[float, float, float]:
    """DRAM time of all items (shared by every core) as (reads, writes, turnaround): bytes at the read and
    write bandwidths, each contiguous burst paying the configured overhead (measured on the first item's
    actual stick sets), and what LPDDR5 loses turning around while reads and writes are both in flight
    (the configured mixed efficiency, charged on the smaller direction's bytes)."""
    it = items[0]
    k0, nk = it.k_blocks[0]
    over = cfg.dram_run_overhead_bytes

    def cost(arg: TensorArg, heads: tuple[int, ...], r0: int, n: int, ncols: int) -> float:
        dev = _tile_sticks(arg, it.batches, heads, r0, n, 0, ncols)[0]
        return dev.size * STICK_BYTES + dram_runs(dev) * over

    cols = _member_cols(spec, dims, it)
    q = cost(spec.query, it.stacked, it.q0, it.nq, cols["q"])
    o = (cost(spec.out, it.stacked, it.q0, it.nq, dims.Dv * it.members) if t.pack_out
         else cost(spec.out, it.heads, it.q0, it.nq, dims.Dv))
    kv = (cost(spec.key, it.kv_heads[:1], k0, nk, cols["k"]) + cost(spec.value, it.kv_heads[:1], k0, nk, cols["v"])) / nk
    m = 0.0
    if mask is not None:
        dev = _mask_sticks(mask, it, k0, nk)[0]
        m = (dev.size * STICK_BYTES + dram_runs(dev) * over) / nk
    scale_rows = lambda x: x / it.nq  # noqa: E731  (per query row of the first item)
    reads = sum(scale_rows(q) * i.nq + (kv + m) * sum(n for _, n in i.k_blocks) for i in items)
    writes = sum(scale_rows(o) * i.nq for i in items)
    mixed = cfg.dram_peak_bandwidth * cfg.dram_mixed_efficiency
    turn_per_byte = max(0.0, 2 / mixed - 1 / cfg.dram_read_bandwidth - 1 / cfg.dram_write_bandwidth)
    return reads / cfg.dram_read_bandwidth, writes / cfg.dram_write_bandwidth, turn_per_byte * min(reads, writes)


def _assign(costs: list[float], cores: int) -> list[list[int]]:
    """Longest processing time first: each item to the least loaded core."""
    heap = [(0.0, c) for c in range(cores)]  # (load, core): the least loaded core on top
    out: list[list[int]] = [[] for _ in range(cores)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        load, c = heapq.heappop(heap)
        out[c].append(i)
        heapq.heappush(heap, (load + costs[i], c))
    return [sorted(x) for x in out]


# PE/vector work and DRAM traffic overlap imperfectly (they contend for the same blocks' buffers): the
# estimate charges the smaller of the two at this weight on top of the larger. Calibrated against
# card/timing.py on the benchmark shapes (benchmarks/attention.py), where it ranks tilings correctly.
OVERLAP_PENALTY = 0.5


def _estimate(cfg: CardConfig, spec: AttentionSpec, dims: _Dims, t: Tiling, mask: TensorArg | None) -> dict[str, Any]:
    """Kernel time estimate of a tiling: max(slowest core's compute and pipeline fill, DRAM time of all
    cores), plus part of the other, plus the fixed cost."""
    items = _work_items(dims, t, spec.is_causal)
    cycles = [_item_cycles(cfg, dims, it, mask is not None) for it in items]
    n_cores = min(cfg.num_cores, len(items))
    compute_s = max(sum(cycles[i] for i in core) for core in _assign(cycles, n_cores)) / cfg.clock_hz
    reads_s, writes_s, turn_s = _dram_seconds(cfg, spec, dims, t, items, mask)
    longest = max(items, key=lambda it: len(it.k_blocks))
    # The pipeline fills once per core: first loads, then one block's QK^T and softmax with nothing beside.
    compute_s += 2 * cfg.dram_latency_s + sum(_block_cycles(cfg, dims, longest, longest.k_blocks[0][1],
                                                            mask is not None)) / cfg.clock_hz
    if t.out_slots > 2:  # stores held to the end: reads alone, then a tail of writes alone
        dram_s = reads_s
        total = max(compute_s, dram_s) + OVERLAP_PENALTY * min(compute_s, dram_s) + writes_s
    else:
        dram_s = reads_s + writes_s + turn_s
        total = max(compute_s, dram_s) + OVERLAP_PENALTY * min(compute_s, dram_s)
    return {"block_q": t.block_q, "block_k": t.block_k, "heads_per_tile": t.heads_per_tile,
            "batches_per_tile": t.batches_per_tile, "lane_heads": t.lane_heads, "defer_stores": t.out_slots > 2,
            "items": len(items), "cores": n_cores, "est_compute_us": round(compute_s * 1e6, 2),
            "est_dram_us": round(dram_s * 1e6, 2), "est_us": round((total + cfg.kernel_fixed_cost_s) * 1e6, 2)}


def _max_items_per_core(cfg: CardConfig, dims: _Dims, t: Tiling, causal: bool, has_mask: bool) -> int:
    items = _work_items(dims, t, causal)
    cycles = [_item_cycles(cfg, dims, it, has_mask) for it in items]
    return max(len(c) for c in _assign(cycles, min(cfg.num_cores, len(items))))


@lru_cache(maxsize=64)
def _row0(arg: TensorArg, batches: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """[B, H] device stick and lane where each (batch, head)'s row 0 starts."""
    lead = np.array([[b, h, 0, 0] for b in range(batches) for h in range(heads)])
    dev = arg.layout.device_offsets(arg.host_index(lead))
    return (dev // arg.lanes).reshape(batches, heads), (dev % arg.lanes).reshape(batches, heads)


def _lane_table(arg: TensorArg, batches: int, heads: int) -> np.ndarray:
    """[B, H] lane offset of each (batch, head)'s rows; rows stacked in one tile must share it."""
    return _row0(arg, batches, heads)[1]


def _kv_lane_deltas(arg: TensorArg, dims: _Dims, it: WorkItem) -> list[int]:
    """Lane of each member's K (or V) rows relative to the first member's, in the shared sticks."""
    lanes = _row0(arg, dims.B, dims.Hkv)[1][it.batches[0]]
    return [int(lanes[h] - lanes[it.kv_heads[0]]) for h in it.kv_heads]


def _member_cols(spec: AttentionSpec, dims: _Dims, it: WorkItem) -> dict[str, int]:
    """Columns loaded per row of Q, K and V: one head's, or the span of all members side by side."""
    return {"q": dims.D * it.members, "k": dims.D + max(_kv_lane_deltas(spec.key, dims, it)),
            "v": dims.Dv + max(_kv_lane_deltas(spec.value, dims, it))}


def _lane_packable(spec: AttentionSpec, dims: _Dims, P: int) -> bool:
    """Can ``P`` consecutive query heads share one tile side by side? Their Q rows must start in the same
    stick at lanes D apart, and their K and V rows in the same sticks (at any fixed lane offsets)."""
    if P < 2 or dims.Hq % P:
        return False
    qs, ql = _row0(spec.query, dims.B, dims.Hq)
    for h0 in range(0, dims.Hq, P):
        hs, kvs = list(range(h0, h0 + P)), [h // dims.group for h in range(h0, h0 + P)]
        if (qs[:, hs] != qs[:, [h0]]).any() or (ql[:, hs] != ql[:, [h0]] + dims.D * np.arange(P)).any():
            return False
        for arg in (spec.key, spec.value):
            st, ln = _row0(arg, dims.B, dims.Hkv)
            delta = ln[:, kvs] - ln[:, [kvs[0]]]
            if (st[:, kvs] != st[:, [kvs[0]]]).any() or (delta < 0).any() or (delta != delta[:1]).any():
                return False
    return True


def _out_rows_shared(spec: AttentionSpec, dims: _Dims) -> bool:
    """Do heads' output rows share sticks (e.g. out a [B, H, L, 32] view of a [B, L, H * 32] buffer, the
    layout torch's own CPU attention returns)? Then only a tile holding all of a stick's heads may store it."""
    lay = spec.out.layout
    lanes = _row0(spec.out, dims.B, dims.Hq)[1]
    extent = lay.host_shape[lay.stick_dim]
    ends_at_padding = (spec.out.storage_offset // lay.host_strides[lay.stick_dim]) % extent + dims.Dv == extent
    return bool((lanes != 0).any() or (dims.Dv % spec.out.lanes and not ends_at_padding))


def _out_packable(spec: AttentionSpec, dims: _Dims, P: int) -> bool:
    """Output rows of ``P`` consecutive heads start in one stick at lanes 0, Dv, 2 Dv, ... ."""
    if dims.Hq % P:
        return False
    st, ln = _row0(spec.out, dims.B, dims.Hq)
    return all((st[:, h0:h0 + P] == st[:, [h0]]).all() and (ln[:, h0:h0 + P] == dims.Dv * np.arange(P)).all()
               for h0 in range(0, dims.Hq, P))


def _candidates(dims: _Dims, spec: AttentionSpec) -> list[Tiling]:
    """Tilings to consider: block sizes no bigger than the lengths need, heads of one GQA group and
    batches stacked only when their Q rows share a lane offset (e.g. heads of 32 elements in a fused qkv
    buffer start at lanes 0 and 32: those cannot share a tile)."""
    lanes = _lane_table(spec.query, dims.B, dims.Hq)

    def uniform(nb: int, g: int) -> bool:
        return all(np.unique(lanes[b:b + nb, h:h + g]).size == 1
                   for b in range(0, dims.B, nb) for h in range(0, dims.Hq, g))

    bq = [spec.block_q] if spec.block_q else [b for b in BLOCK_Q_CHOICES if b < 2 * dims.Lq] or [BLOCK_Q_CHOICES[0]]
    bk = [spec.block_k] if spec.block_k else [b for b in BLOCK_K_CHOICES if b < 2 * dims.Lk] or [BLOCK_K_CHOICES[0]]
    gs = [spec.heads_per_tile] if spec.heads_per_tile else [g for g in range(1, dims.group + 1) if dims.group % g == 0]
    nbs = [spec.batches_per_tile] if spec.batches_per_tile else [n for n in range(1, dims.B + 1) if dims.B % n == 0]
    lane_p = spec.query.lanes // dims.D if dims.D < spec.query.lanes else 1
    ps = [spec.lane_heads_per_tile] if spec.lane_heads_per_tile else [1, lane_p] if lane_p > 1 else [1]
    shared_out = _out_rows_shared(spec, dims)
    out = [Tiling(q, k, g, n, p, p > 1 and _out_packable(spec, dims, p))
           for q in bq for k in bk for g in gs for n in nbs for p in ps
           if dims.group % g == 0 and uniform(n, g) and (p == 1 or (g == 1 and _lane_packable(spec, dims, p)))]
    if shared_out:  # heads' outputs share sticks: only tiles holding all of a stick's heads can store them
        out = [t for t in out if t.pack_out]
        if not out:
            raise CodegenError(
                f"sdpa out %{spec.out.name}: each head's output rows share their sticks with other heads, and "
                "q/k/v do not let those heads share a tile (they would need q, k, v with the same heads side "
                "by side in sticks); stores move whole sticks, so write into a fresh buffer in the default "
                "layout and copy (relayout) into this view")
    if not out:
        raise CodegenError(f"sdpa {spec.name}: heads_per_tile={spec.heads_per_tile}, batches_per_tile="
                           f"{spec.batches_per_tile}, lane_heads_per_tile={spec.lane_heads_per_tile} do not divide the "
                           "GQA group / batch, or stack rows at different lanes, or heads do not share sticks")
    return [t for t in out if t.rows() <= MAX_TILE_ROWS] or out[:1]


# ---------------------------------------------------------------------------------------------
# Scratchpad
# ---------------------------------------------------------------------------------------------
def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _row_lanes(arg: TensorArg, ncols: int, lane0s: np.ndarray | None = None) -> int:
    """Lanes per scratchpad row for rows of ``ncols`` elements of ``arg``: the sticks covering them at
    the worst lane offset (``lane0s`` when known, else any)."""
    worst = int(np.max(lane0s)) if lane0s is not None else arg.lanes - 1
    return _ceil_to(worst + ncols, arg.lanes)


def _row_widths(spec: AttentionSpec, dims: _Dims, t: Tiling) -> dict[str, int]:
    """Lanes per scratchpad row of each tile (members side by side widen Q, K and V rows)."""
    p = t.lane_heads
    return {"q": _row_lanes(spec.query, dims.D * p, _lane_table(spec.query, dims.B, dims.Hq)),
            "k": _row_lanes(spec.key, dims.D * p, _lane_table(spec.key, dims.B, dims.Hkv)),
            "v": _row_lanes(spec.value, dims.Dv * p, _lane_table(spec.value, dims.B, dims.Hkv)),
            "o": _ceil_to(dims.Dv * (p if t.pack_out else 1), spec.out.lanes)}


def _mask_tile_dims(mask: TensorArg, t: Tiling) -> tuple[int, int, int]:
    """(batches, heads, rows) of a mask tile: 1 where the mask broadcasts."""
    return (t.batches_per_tile if mask.strides[0] else 1, t.heads_per_tile * t.lane_heads if mask.strides[1] else 1,
            t.block_q if mask.strides[2] else 1)


def _buffers(dims: _Dims, t: Tiling, mask: TensorArg | None, causal: bool, w: dict[str, int]) -> list[SpBuffer]:
    """Every scratchpad buffer of one core, two of each that alternates (per item or per block). All are
    live for the whole kernel, since items and blocks reuse them in turn."""
    M, Bc, isz, nb = t.rows(), t.block_k, dims.itemsize, t.batches_per_tile
    b: list[SpBuffer] = []
    for p in range(2):
        b += [SpBuffer(f"q{p}", sp_bytes(isz, M, w["q"])), SpBuffer(f"acc{p}", sp_bytes(4, M, dims.Dv)),
              SpBuffer(f"l{p}", sp_bytes(4, M)),
              SpBuffer(f"k{p}", sp_bytes(isz, nb * Bc, w["k"])), SpBuffer(f"v{p}", sp_bytes(isz, nb * Bc, w["v"])),
              SpBuffer(f"s{p}", sp_bytes(4, M, Bc)), SpBuffer(f"p{p}", sp_bytes(isz, M, Bc)),
              SpBuffer(f"nm{p}", sp_bytes(4, M)), SpBuffer(f"alpha{p}", sp_bytes(4, M)),
              SpBuffer(f"mcur{p}", sp_bytes(4, M)), SpBuffer(f"lcur{p}", sp_bytes(4, M))]
        if mask is not None:
            mb, mh, mq = _mask_tile_dims(mask, t)
            # A block's key columns may start at any lane of the mask's sticks.
            b.append(SpBuffer(f"mask{p}", sp_bytes(mask.layout.itemsize, mb, mh, mq, _row_lanes(mask, Bc))))
    b += [SpBuffer(f"o{p}", sp_bytes(isz, M, w["o"])) for p in range(t.out_slots)]
    if causal:
        b.append(SpBuffer("causal", sp_bytes(4, 2 * (t.block_q + Bc))))
    return b


# ---------------------------------------------------------------------------------------------
# Tiles of device sticks
# ---------------------------------------------------------------------------------------------
def _tile_sticks(arg: TensorArg, batches: tuple[int, ...], heads: tuple[int, ...], r0: int, n: int, c0: int,
                 ncols: int) -> tuple[np.ndarray, int]:
    """Device sticks [len(batches), len(heads), n, k] of rows [r0, r0+n) x columns [c0, c0+ncols) of a 4-d
    view, in scratchpad order (batch, head, row, stick), and the rows' common lane offset."""
    bb, hh, rr = np.meshgrid(np.asarray(batches), np.asarray(heads), np.arange(r0, r0 + n), indexing="ij")
    lead = np.stack([bb.reshape(-1), hh.reshape(-1), rr.reshape(-1)], axis=1)
    dev, lane0 = arg.row_sticks(lead, c0, ncols)
    return dev.reshape(len(batches), len(heads), n, -1), lane0


def _mask_sticks(mask: TensorArg, it: WorkItem, k0: int, nk: int) -> tuple[np.ndarray, int]:
    batches = it.batches if mask.strides[0] else it.batches[:1]
    heads = it.heads if mask.strides[1] else it.heads[:1]
    rows = it.nq if mask.strides[2] else 1
    return _tile_sticks(mask, batches, heads, it.q0, rows, k0, nk)


# ---------------------------------------------------------------------------------------------
# Emission
# ---------------------------------------------------------------------------------------------
def _ew(op: str, out: SpTensor, *inputs: SpTensor | float) -> Elementwise:
    return Elementwise(op, out, tuple(x if isinstance(x, SpTensor) else Scalar(x) for x in inputs))


def _bcast_rows(col: SpTensor, cols: int) -> SpTensor:
    """A [R, 1] column broadcast across ``cols`` columns."""
    return SpTensor(col.offset, col.dtype, (col.shape[0], cols), (col.strides[0], 0))


@dataclass
class _Step:
    """One K/V block of one item, with the views its two halves share."""

    item: WorkItem
    parity: int  # item parity: q, acc, l buffers
    slot: int  # output tile: alternating, or one per item when stores are deferred
    bp: int  # block parity: k, v, s, p, mask and the small per-block columns
    k0: int
    nk: int
    first: bool
    last: bool
    kt: list[SpTensor] = field(default_factory=list)  # per batch: K^T [D, nk]
    v: list[SpTensor] = field(default_factory=list)  # per batch: V [nk, Dv]
    mask: SpTensor | None = None


class _CoreEmitter:
    """Emits one core's instructions. The core's (item, block) steps form one software pipeline: the
    QK^T of step n+1 (and its loads) is issued before the softmax and PV of step n, so the PE arrays
    work on the next block while the vector unit does this one's softmax."""

    def __init__(self, spec: AttentionSpec, dims: _Dims, t: Tiling, mask: TensorArg | None, buf: dict[str, int]):
        self.spec, self.dims, self.t, self.mask, self.buf = spec, dims, t, mask, buf
        self.ins: list[Instruction] = []
        self.pdt = dims.dtype  # the dtype P is rounded to for the PE arrays
        self.exp_in_p = _exp_in_input_dtype(spec, dims)
        self.stats = {"blocks": 0, "causal_bias_blocks": 0, "skipped_blocks": 0}
        self.prev_nm: SpTensor | None = None
        self.q: SpTensor | None = None
        self.deferred: list[Instruction] = []  # output stores held to the end (out_slots > 2)

    def sp(self, name: str, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
           elem_offset: int = 0) -> SpTensor:
        return SpTensor(self.buf[name] + elem_offset * SP_DTYPES[dtype], dtype, shape, strides)

    def run(self, core: int, items: list[WorkItem]) -> list[Instruction]:
        self.core = core
        self._prologue()
        steps: list[_Step] = []
        for n, it in enumerate(items):
            self.stats["skipped_blocks"] += it.skipped
            for j, (k0, nk) in enumerate(it.k_blocks):
                steps.append(_Step(it, n % 2, n % self.t.out_slots, len(steps) % 2, k0, nk, j == 0,
                                   j == len(it.k_blocks) - 1))
        if steps:
            self._scores(steps[0])
        for n, st in enumerate(steps):
            if n + 1 < len(steps):
                self._scores(steps[n + 1])
            self._softmax_pv(st)
            if st.last:
                self._finish(st)
        if self.deferred:
            # A fence (a barrier of this core alone): the held stores start once every load is done.
            self.ins.append(Barrier(tag=self.core, cores=(self.core,)))
        return self.ins + self.deferred

    # --- set-up ----------------------------------------------------------------------------------
    def _prologue(self) -> None:
        d, t = self.dims, self.t
        if self.spec.is_causal:
            z = t.block_q + t.block_k
            self.ins += [_ew("copy", self.sp("causal", "float32", (z,)), 0.0),
                         _ew("copy", self.sp("causal", "float32", (z,), elem_offset=z), NEG_INF)]
        cols, rows = (d.Dv * t.lane_heads, t.rows() // t.lane_heads) if t.pack_out else (d.Dv, t.rows())
        wo = _ceil_to(cols, self.spec.out.lanes)
        if wo > cols:  # output padding lanes are stored with the row: give them a value once
            for p in range(t.out_slots):
                self.ins.append(_ew("copy", self.sp(f"o{p}", d.dtype, (rows, wo - cols), (wo, 1), cols), 0.0))

    def _load(self, arg: TensorArg, bufname: str, batches: tuple[int, ...], heads: tuple[int, ...], r0: int, n: int,
              ncols: int) -> tuple[int, int]:
        """Load rows [r0, r0+n) of (batch, head) pairs stacked in a tile; return (row width, lane offset)."""
        dev, lane0 = _tile_sticks(arg, batches, heads, r0, n, 0, ncols)
        self.ins += dma_tile(arg, dev, self.buf[bufname], store=False)
        return dev.shape[-1] * arg.lanes, lane0

    # --- stage 1: loads and S = Q K^T -----------------------------------------------------------
    def _scores(self, st: _Step) -> None:
        d, t, spec, it = self.dims, self.t, self.spec, st.item
        sub, P = it.sub_rows, it.members
        cols = _member_cols(spec, d, it)
        if st.first:
            w, lane0 = self._load(spec.query, f"q{st.parity}", it.batches, it.stacked, it.q0, it.nq, cols["q"])
            self.q = self.sp(f"q{st.parity}", d.dtype, (len(it.batches) * sub, d.D), (w, 1), lane0)
        wk, lk = self._load(spec.key, f"k{st.bp}", it.batches, it.kv_heads[:1], st.k0, st.nk, cols["k"])
        wv, lv = self._load(spec.value, f"v{st.bp}", it.batches, it.kv_heads[:1], st.k0, st.nk, cols["v"])
        dk, dv = _kv_lane_deltas(spec.key, d, it), _kv_lane_deltas(spec.value, d, it)
        if self.mask is not None:
            st.mask = self._load_mask(st)
        q = self.q
        # One QK^T per (batch, member): a member's Q, K and V are lane offsets into the shared sticks.
        for i in range(len(it.batches)):
            for m in range(P):
                kt = self.sp(f"k{st.bp}", d.dtype, (d.D, st.nk), (1, wk), i * st.nk * wk + lk + dk[m])  # K^T by strides
                st.kt.append(kt)
                st.v.append(self.sp(f"v{st.bp}", d.dtype, (st.nk, d.Dv), (wv, 1), i * st.nk * wv + lv + dv[m]))
                qi = SpTensor(q.offset + (i * sub * q.strides[0] + m * d.D) * q.itemsize, q.dtype, (sub, d.D), q.strides)
                si = self.sp(f"s{st.bp}", "float32", (sub, st.nk), (t.block_k, 1), (i * P + m) * sub * t.block_k)
                self.ins.append(MatMul(si, qi, kt))
        self.stats["blocks"] += 1

    def _load_mask(self, st: _Step) -> SpTensor:
        m, it = self.mask, st.item
        dev, lane0 = _mask_sticks(m, it, st.k0, st.nk)
        self.ins += dma_tile(m, dev, self.buf[f"mask{st.bp}"], store=False)
        mb, mh, mq, k = dev.shape
        w = k * m.lanes
        strides = (mh * mq * w if mb > 1 else 0, mq * w if mh > 1 else 0, w if mq > 1 else 0, 1)
        return self.sp(f"mask{st.bp}", m.dtype, (len(it.batches), len(it.heads), it.nq, st.nk), strides, lane0)

    # --- stage 2: online softmax and acc += P V -------------------------------------------------
    def _softmax_pv(self, st: _Step) -> None:
        d, t, it, bp, nk = self.dims, self.t, st.item, st.bp, st.nk
        M, nb, sub = it.rows, len(it.batches), it.sub_rows
        s2 = self.sp(f"s{bp}", "float32", (M, nk), (t.block_k, 1))
        s4 = self.sp(f"s{bp}", "float32", (nb, len(it.heads), it.nq, nk),
                     (len(it.heads) * it.nq * t.block_k, it.nq * t.block_k, t.block_k, 1))
        p2 = self.sp(f"p{bp}", self.pdt, (M, nk), (nk, 1))
        col = lambda name: self.sp(name, "float32", (M, 1))  # noqa: E731
        nm, alpha, mcur, lcur = col(f"nm{bp}"), col(f"alpha{bp}"), col(f"mcur{bp}"), col(f"lcur{bp}")
        l, acc = col(f"l{st.parity}"), self.sp(f"acc{st.parity}", "float32", (M, d.Dv))

        scaled, masked = self._bias(st, s4)
        # -m_cur: the block's row maxima in scaled units, negated; clamped so masked rows stay finite.
        self.ins.append(Reduce("max", mcur, s2, axis=1))
        self.ins.append(_ew("mul", mcur, mcur, -1.0 if scaled else -d.scale))
        if masked:
            self.ins.append(_ew("minimum", mcur, mcur, MAX_CLAMP))
        if st.first:
            nm = mcur
        else:
            self.ins += [_ew("minimum", nm, self.prev_nm, mcur), _ew("sub", alpha, nm, self.prev_nm),
                         _ew("exp", alpha, alpha)]
        self.prev_nm = nm  # the running -max lives in this block's buffer set (mcur or nm)
        # P = exp(S * scale - m): one fma (or add) and the exp, rounded for the PE arrays.
        # With exp_precision "input", S*scale - m (<= 0) is rounded to P's dtype and the exp runs in place
        # on P: half the vector unit's bytes for the costliest op of the block. Not in masked blocks:
        # DLFloat16 has one code for NaN and Inf, so -inf would come back as NaN.
        x = p2 if self.exp_in_p and not masked else s2
        if scaled:
            self.ins.append(_ew("add", x, s2, _bcast_rows(nm, nk)))
        else:
            self.ins.append(_ew("fma", x, s2, d.scale, _bcast_rows(nm, nk)))
        self.ins.append(_ew("exp", p2, x))
        if st.first:
            self.ins.append(Reduce("sum", l, p2, axis=1))
        else:
            self.ins += [Reduce("sum", lcur, p2, axis=1), _ew("fma", l, l, alpha, lcur),
                         _ew("mul", acc, acc, _bcast_rows(alpha, d.Dv))]
        for i, v in enumerate(st.v):  # one PV per (batch, member) sub-tile, in S's row order
            pi = SpTensor(p2.offset + i * sub * nk * p2.itemsize, p2.dtype, (sub, nk), (nk, 1))
            ai = SpTensor(acc.offset + i * sub * d.Dv * 4, "float32", (sub, d.Dv))
            self.ins.append(MatMul(ai, pi, v, accumulate=not st.first))

    def _bias(self, st: _Step, s4: SpTensor) -> tuple[bool, bool]:
        """Apply the mask and the causal bias to S; return (S is now scaled, some entry may be -inf)."""
        d, spec, it = self.dims, self.spec, st.item
        scaled = masked = False
        if st.mask is not None:
            if self.mask.dtype == "bool":
                self.ins.append(_ew("where", s4, st.mask, s4, NEG_INF))
            else:
                self.ins.append(_ew("fma", s4, s4, d.scale, st.mask))
                scaled = True
            masked = True
        elif d.scale <= 0:  # the row max only commutes with a positive scale
            self.ins.append(_ew("mul", s4, s4, d.scale))
            scaled = True
        if spec.is_causal and st.k0 + st.nk - 1 > it.q0:  # the block crosses the diagonal
            self.ins.append(_ew("add", s4, s4, self._causal_view(st)))
            self.stats["causal_bias_blocks"] += 1
            masked = True
        return scaled, masked

    def _causal_view(self, st: _Step) -> SpTensor:
        """Element (b, h, i, j) reads causal[c + j - i]: 0 where key k0+j <= query q0+i, else -inf."""
        it = st.item
        z = self.t.block_q + self.t.block_k
        c = z - 1 - (it.q0 - st.k0)
        return self.sp("causal", "float32", (len(it.batches), len(it.heads), it.nq, st.nk), (0, 0, -1, 1), c)

    # --- stage 3: out = acc / l -----------------------------------------------------------------
    def _finish(self, st: _Step) -> None:
        d, spec, it = self.dims, self.spec, st.item
        l = self.sp(f"l{st.parity}", "float32", (it.rows, 1))
        acc = self.sp(f"acc{st.parity}", "float32", (it.rows, d.Dv))
        if self.mask is not None:  # a row that saw no key has l = 0 (and acc = 0): out 0, not NaN
            self.ins.append(_ew("maximum", l, l, L_FLOOR))
        self.ins.append(_ew("reciprocal", l, l))
        if self.t.pack_out:
            self._store_packed(st, acc, l)
            return
        wo = _ceil_to(d.Dv, spec.out.lanes)
        self.ins.append(_ew("mul", self.sp(f"o{st.slot}", d.dtype, (it.rows, d.Dv), (wo, 1)), acc,
                            _bcast_rows(l, d.Dv)))
        dev, lane0 = _tile_sticks(spec.out, it.batches, it.heads, it.q0, it.nq, 0, d.Dv)
        check_owns_sticks(spec.out, lane0, d.Dv, "sdpa out")
        self._store(dma_tile(spec.out, dev, self.buf[f"o{st.slot}"], store=True))

    def _store(self, stores: list[Instruction]) -> None:
        """Store now, or, with one output tile per item, at the end: the kernel then reads only, then
        writes only, and LPDDR5 pays no read/write turnaround while both would be in flight."""
        (self.deferred if self.t.out_slots > 2 else self.ins).extend(stores)

    def _store_packed(self, st: _Step, acc: SpTensor, l: SpTensor) -> None:
        """Lane heads whose outputs share sticks: each head's result goes to its lanes of one row of
        sticks, and the pack's rows are stored whole."""
        d, spec, it = self.dims, self.spec, st.item
        P, sub, cols = it.members, it.sub_rows, d.Dv * it.members
        wo = _ceil_to(cols, spec.out.lanes)
        for i in range(len(it.batches)):
            for m in range(P):
                r0 = (i * P + m) * sub
                o = self.sp(f"o{st.slot}", d.dtype, (sub, d.Dv), (wo, 1), i * sub * wo + m * d.Dv)
                a = SpTensor(acc.offset + r0 * d.Dv * 4, "float32", (sub, d.Dv))
                self.ins.append(_ew("mul", o, a, _bcast_rows(SpTensor(l.offset + r0 * 4, "float32", (sub, 1)), d.Dv)))
        dev, lane0 = _tile_sticks(spec.out, it.batches, it.stacked, it.q0, it.nq, 0, cols)
        check_owns_sticks(spec.out, lane0, cols, "sdpa out")
        self._store(dma_tile(spec.out, dev, self.buf[f"o{st.slot}"], store=True))


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def _with_deferred_stores(tilings: list[Tiling], spec: AttentionSpec, dims: _Dims, mask: TensorArg | None,
                          cfg: CardConfig) -> list[Tiling]:
    """Each tiling as is and, unless told otherwise, with one output tile per item of the busiest core, so
    that every store waits for the end (spec.defer_stores: None both, True only deferred, False never)."""
    out = []
    for t in tilings:
        if spec.defer_stores is not True:
            out.append(t)
        if spec.defer_stores is not False:
            n = _max_items_per_core(cfg, dims, t, spec.is_causal, mask is not None)
            if n > 2 or spec.defer_stores:
                out.append(dataclasses.replace(t, out_slots=max(n, 3)))
    return out


def _choose_tiling(spec: AttentionSpec, dims: _Dims, mask: TensorArg | None, cfg: CardConfig
                   ) -> tuple[Tiling, Any, list[dict[str, Any]]]:
    """The cheapest tiling by the estimate whose scratchpad plan fits; every candidate is recorded."""
    considered = []
    best = None
    for t in _with_deferred_stores(_candidates(dims, spec), spec, dims, mask, cfg):
        est = _estimate(cfg, spec, dims, t, mask)
        try:
            sp_plan = plan(_buffers(dims, t, mask, spec.is_causal, _row_widths(spec, dims, t)),
                           cfg.scratchpad_plannable_bytes)
        except ScratchpadOverflowError as e:
            considered.append({**est, "rejected": f"scratchpad: needs {e.needed} B"})
            continue
        est["scratchpad_bytes"] = sp_plan.peak_bytes
        considered.append(est)
        # Near-ties (1 %) go to bigger tiles: fewer instructions and DMA latencies than the estimate sees.
        key = (round(math.log(est["est_us"]) / 0.01), -t.rows() * t.block_k)
        if best is None or key < best[0]:
            best = (key, t, sp_plan)
    if best is None:
        raise CodegenError(f"sdpa {spec.name}: no tiling fits the scratchpad; tried {considered}")
    considered.sort(key=lambda c: (c.get("rejected") is not None, c["est_us"]))
    return best[1], best[2], considered


def build_attention(spec: AttentionSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """Scaled dot-product attention -> (Program, KernelDecisions). Raises CodegenError for specs it
    cannot compile (the message says why)."""
    dims = _check_spec(spec)
    mask = _broadcast_mask(spec.attn_mask, dims) if spec.attn_mask is not None else None
    tiling, sp_plan, considered = _choose_tiling(spec, dims, mask, config)
    items = _work_items(dims, tiling, spec.is_causal)
    cycles = [_item_cycles(config, dims, it, mask is not None) for it in items]
    per_core = _assign(cycles, min(config.num_cores, len(items)))
    buf = {b.name: b.offset for b in sp_plan.buffers}

    cores: dict[int, list[Instruction]] = {}
    totals = {"blocks": 0, "causal_bias_blocks": 0, "skipped_blocks": 0}
    used = [idxs for idxs in per_core if idxs]
    for core, idxs in zip(core_ids(len(used), config), used):
        if idxs:
            em = _CoreEmitter(spec, dims, tiling, mask, buf)
            cores[core] = em.run(core, [items[i] for i in idxs])
            for k in totals:
                totals[k] += em.stats[k]

    decisions = _decisions(spec, dims, tiling, sp_plan, per_core, items, cycles, totals, considered, mask)
    program = Program(spec.name, _operands(spec), cores, {"kind": "attention", "decisions": decisions.to_dict()})
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
        "unit": "(batches, kv head, query heads, query block) per tile", "items": len(items),
        "cores": sum(1 for c in per_core if c), "items_per_core": [len(c) for c in per_core if c],
        "assignment": "longest first to the least loaded core",
        "est_load_imbalance": round(max(loads) / (sum(loads) / len(loads)), 3) if loads and sum(loads) else 1.0,
    }
    dec.tiling = {"block_q": t.block_q, "block_k": t.block_k, "heads_per_tile": t.heads_per_tile,
                  "batches_per_tile": t.batches_per_tile, "lane_heads": t.lane_heads, "tile_rows": t.rows(),
                  "defer_stores": t.out_slots > 2, "output_tiles": t.out_slots,
                  "kv_blocks_streamed": totals["blocks"], "causal_blocks_skipped": totals["skipped_blocks"],
                  "causal_bias_blocks": totals["causal_bias_blocks"], "scale": dims.scale,
                  "gqa_group": dims.group, "is_causal": spec.is_causal,
                  "mask": None if mask is None else f"{mask.dtype} strides {list(mask.strides)}"}
    dec.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                      "buffers": {b.name: [b.offset, b.aligned_bytes] for b in sp_plan.buffers}}
    dec.overlap = {"double_buffered": ["k", "v", "s", "p", "mask (per block)", "q", "acc", "l"]
                   + ([] if t.out_slots > 2 else ["o (per item)"]),
                   "pipeline": "QK^T of block n+1 issued before softmax/PV of block n",
                   "stores": (f"held: {t.out_slots} output tiles per core, stored after a fence" if t.out_slots > 2
                              else "as each item finishes")}
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


# ---------------------------------------------------------------------------------------------
# The wrapper's generator interface (compiler/wrapper.py: fn(KernelSpec, places, config) -> Program)
# ---------------------------------------------------------------------------------------------
GENERATOR = "attention"


def tensor_arg(kspec: Any, name: str, places: dict[str, Any]) -> TensorArg:
    """A kernel buffer (sizes and strides from the KernelSpec, layout and storage offset from where the
    tensor was placed at launch) as a TensorArg."""
    b = kspec.buffer(name)
    place = places[name]
    return TensorArg(name, place.layout, tuple(b.size), tuple(b.stride), int(place.storage_offset))


def spec_from_kernel(kspec: Any, places: dict[str, Any]) -> AttentionSpec:
    """``kspec.params``: query, key, value, out, attn_mask (buffer names; attn_mask may be None),
    is_causal, scale (None: 1/sqrt(D)), enable_gqa."""
    p = kspec.params
    mask = p.get("attn_mask")
    return AttentionSpec(
        tensor_arg(kspec, p["query"], places), tensor_arg(kspec, p["key"], places),
        tensor_arg(kspec, p["value"], places), tensor_arg(kspec, p["out"], places),
        tensor_arg(kspec, mask, places) if mask else None, bool(p.get("is_causal", False)), p.get("scale"),
        bool(p.get("enable_gqa", False)), kspec.name, source_ops=tuple(kspec.source_ops) or AttentionSpec.source_ops)


def generate(kspec: Any, places: dict[str, Any], config: CardConfig) -> Program:
    """Register with ``wrapper.register_generator(GENERATOR, generate)``."""
    program, decisions = build_attention(spec_from_kernel(kspec, places), config)
    decisions.source_lines = list(getattr(kspec, "source_lines", []))
    program.metadata["decisions"] = decisions.to_dict()
    return program

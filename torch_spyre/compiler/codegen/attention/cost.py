"""The estimate of an attention tiling: PE and vector cycles per K/V block (the formulas of
``card/costs.py``, shared with the card's timing model), DRAM time of all items measured on the first
item's actual stick sets, and how the two overlap."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Any

from torch_spyre.card import costs
from torch_spyre.card.config import CardConfig
from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.attention.plan import Tiling, WorkItem, _assign, _member_cols, _work_items
from torch_spyre.compiler.codegen.attention.spec import AttentionSpec, _Dims
from torch_spyre.compiler.codegen.attention.tiles import _mask_sticks, _tile_sticks
from torch_spyre.compiler.codegen.sticks import dram_runs
from torch_spyre.compiler.core_count import CoreCount, cores_for
from torch_spyre.program import STICK_BYTES


def _block_cycles(cfg: CardConfig, dims: _Dims, it: WorkItem, nk: int, has_mask: bool) -> tuple[int, int]:
    """(PE, vector) cycles of one K/V block of an item."""
    return _block_cycles_of(cfg, dims, it.rows, it.sub_rows, len(it.batches) * it.members, nk, has_mask)


@lru_cache(maxsize=4096)
def _block_cycles_of(cfg: CardConfig, dims: _Dims, m: int, sub: int, n_sub: int, nk: int,
                     has_mask: bool) -> tuple[int, int]:
    """(PE, vector) cycles of a block of ``m`` rows in ``n_sub`` sub-tiles of ``sub`` rows (cached: the
    tiling search asks for the same few shapes many times)."""
    isz = dims.itemsize
    pe = n_sub * (costs.pe_matmul_cycles(cfg, sub, dims.D, nk, dims.dtype) + costs.pe_matmul_cycles(cfg, sub, nk, dims.Dv, dims.dtype))
    s = m * nk
    exp_width = 4 if has_mask or dims.dtype == "float32" else isz  # see _exp_in_input_dtype
    vec = costs.vector_cycles(cfg, s, 4) * (2 + has_mask) + costs.vector_cycles(cfg, s, exp_width, True)  # mask, max, fma, exp
    vec += costs.vector_cycles(cfg, s, isz) + costs.vector_cycles(cfg, m * dims.Dv, 4)  # rowsum, rescale
    return pe, vec


def _item_cycles(cfg: CardConfig, dims: _Dims, it: WorkItem, has_mask: bool) -> float:
    """Estimated cycles of one work item: the PE arrays and the vector unit overlap across blocks (the
    program is software-pipelined), so the busier of the two sets the pace."""
    pe = vec = 0
    m, sub, n_sub = it.rows, it.sub_rows, len(it.batches) * it.members
    for nk, count in Counter(nk for _k0, nk in it.k_blocks).items():  # blocks come in one or two sizes
        p, v = _block_cycles_of(cfg, dims, m, sub, n_sub, nk, has_mask)
        pe, vec = pe + count * p, vec + count * v
    return max(pe, vec) + costs.vector_cycles(cfg, it.rows * dims.Dv, 4)


def _dram_seconds(cfg: CardConfig, spec: AttentionSpec, dims: _Dims, t: Tiling, items: list[WorkItem],
                  mask: TensorView | None) -> tuple[float, float, float]:
    """DRAM time of all items (shared by every core) as (reads, writes, turnaround): bytes at the read and
    write bandwidths, each contiguous burst paying the configured overhead (measured on the first item's
    actual stick sets), and what LPDDR5 loses turning around while reads and writes are both in flight
    (the configured mixed efficiency, charged on the smaller direction's bytes)."""
    it = items[0]
    k0, nk = it.k_blocks[0]
    over = cfg.dram_run_overhead_bytes

    def cost(arg: TensorView, heads: tuple[int, ...], r0: int, n: int, ncols: int) -> float:
        dev = _tile_sticks(arg, it.batches, heads, r0, n, 0, ncols)[0]
        return dev.size * STICK_BYTES + dram_runs(dev) * over

    cols = _member_cols(spec, dims, it)
    # A role loaded member by member reads every member's rows; else the first member's, wider.
    rows_of = lambda role, heads: heads if role in it.apart else heads[:len(heads) // it.members]  # noqa: E731
    q = cost(spec.query, rows_of("query", it.heads), it.q0, it.nq, cols["q"])
    o = (cost(spec.out, it.stacked, it.q0, it.nq, dims.Dv * it.members) if t.pack_out
         else cost(spec.out, it.heads, it.q0, it.nq, dims.Dv))
    kv = (cost(spec.key, rows_of("key", it.kv_heads), k0, nk, cols["k"])
          + cost(spec.value, rows_of("value", it.kv_heads), k0, nk, cols["v"])) / nk
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


# PE/vector work and DRAM traffic overlap imperfectly (they contend for the same blocks' buffers): the
# estimate charges the smaller of the two at this weight on top of the larger. Calibrated against
# card/timing/ on the benchmark shapes (benchmarks/attention.py), where it ranks tilings correctly.
OVERLAP_PENALTY = 0.5


def _estimate(cfg: CardConfig, spec: AttentionSpec, dims: _Dims, t: Tiling, mask: TensorView | None) -> dict[str, Any]:
    """Kernel time estimate of a tiling: max(slowest core's compute and pipeline fill, DRAM time of all
    cores), plus part of the other, plus the fixed cost."""
    items = _work_items(dims, t, spec.is_causal)
    cycles = [_item_cycles(cfg, dims, it, mask is not None) for it in items]
    n_cores = _core_count(cfg, cycles).cores
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
            **({"loaded_apart": list(t.apart)} if t.apart else {}),
            "items": len(items), "cores": n_cores, "est_compute_us": round(compute_s * 1e6, 2),
            "est_dram_us": round(dram_s * 1e6, 2), "est_us": round((total + cfg.kernel_fixed_cost_s) * 1e6, 2)}


def _max_items_per_core(cfg: CardConfig, dims: _Dims, t: Tiling, causal: bool, has_mask: bool) -> int:
    items = _work_items(dims, t, causal)
    cycles = [_item_cycles(cfg, dims, it, has_mask) for it in items]
    return max(len(c) for c in _assign(cycles, _core_count(cfg, cycles).cores))


def _core_count(cfg: CardConfig, cycles: list[float]) -> CoreCount:
    """Cores for work items of these estimated cycles (``core_count``), at most one per item."""
    return cores_for(sum(cycles), cfg, parts=len(cycles))

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
lanes through a view; when the output packs heads of one stick but q, k or v hold them in sticks of
their own (K and V in buffers of their own), those roles are loaded member by member (``Tiling.apart``)
and the tile still stores the output's sticks whole. Items are dealt to the cores longest-first (causal items differ in cost), and
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

Modules: ``spec.py`` (AttentionSpec and its checks), ``plan.py`` (tilings, work items, assignment to
cores), ``tiles.py`` (scratchpad buffers, stick tiles), ``cost.py`` (the estimate that picks the
tiling), ``emit.py`` (one core's instructions); this module chooses the tiling, builds the program and
its decisions, and is the wrapper's generator.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torch_spyre.card.config import CardConfig
from torch_spyre.compiler.access import CodegenError, TensorView
from torch_spyre.compiler.codegen.attention.cost import _core_count, _estimate, _item_cycles, _max_items_per_core
from torch_spyre.compiler.codegen.attention.emit import _CoreEmitter
from torch_spyre.compiler.codegen.attention.plan import Tiling, WorkItem, _assign, _candidates, _work_items
from torch_spyre.compiler.codegen.attention.spec import AttentionSpec, _broadcast_mask, _check_spec, _Dims
from torch_spyre.compiler.codegen.attention.tiles import _buffers, _row_widths
from torch_spyre.compiler.decisions import BufferDecision, KernelDecisions
from torch_spyre.compiler.placement import cores_near_memory
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, plan
from torch_spyre.program import Instruction, Program

__all__ = ["GENERATOR", "AttentionSpec", "CodegenError", "Tiling", "WorkItem", "build_attention",
           "spec_from_kernel", "generate"]


def _with_deferred_stores(tilings: list[Tiling], spec: AttentionSpec, dims: _Dims, mask: TensorView | None,
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


def _choose_tiling(spec: AttentionSpec, dims: _Dims, mask: TensorView | None, cfg: CardConfig
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
    count = _core_count(config, cycles)
    per_core = _assign(cycles, count.cores)
    buf = {b.name: b.offset for b in sp_plan.buffers}

    cores: dict[int, list[Instruction]] = {}
    totals = {"blocks": 0, "causal_bias_blocks": 0, "skipped_blocks": 0}
    used = [idxs for idxs in per_core if idxs]
    for core, idxs in zip(cores_near_memory(len(used), config), used):
        if idxs:
            em = _CoreEmitter(spec, dims, tiling, mask, buf)
            cores[core] = em.run(core, [items[i] for i in idxs])
            for k in totals:
                totals[k] += em.stats[k]

    decisions = _decisions(spec, dims, tiling, sp_plan, per_core, items, cycles, totals, considered, mask)
    decisions.core_count = count.to_dict()
    program = Program(spec.name, _operands(spec), cores, {"kind": "attention", "decisions": decisions.to_dict()})
    return program, decisions


def _operands(spec: AttentionSpec) -> list:
    ins = [spec.query, spec.key, spec.value] + ([spec.attn_mask] if spec.attn_mask is not None else [])
    seen: dict[str, TensorView] = {}
    for t in ins:
        if t.name in seen and seen[t.name].layout != t.layout:
            raise CodegenError(f"sdpa operands named %{t.name} disagree on the buffer's layout")
        seen.setdefault(t.name, t)
    if spec.out.name in seen:
        raise CodegenError(f"sdpa out %{spec.out.name} is also an input; write to a separate buffer")
    return [t.operand("in") for t in seen.values()] + [spec.out.operand("out")]


def _decisions(spec: AttentionSpec, dims: _Dims, t: Tiling, sp_plan: Any, per_core: list[list[int]],
               items: list[WorkItem], cycles: list[float], totals: dict[str, int], considered: list[dict[str, Any]],
               mask: TensorView | None) -> KernelDecisions:
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
                  "loaded_apart": list(t.apart),
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


def tensor_arg(kspec: Any, name: str, places: dict[str, Any]) -> TensorView:
    """A kernel buffer as a :class:`TensorView` (see :meth:`TensorView.of_kernel_buffer`)."""
    return TensorView.of_kernel_buffer(kspec, name, places)


def spec_from_kernel(kspec: Any, places: dict[str, Any]) -> AttentionSpec:
    """``kspec.params``: query, key, value, out, attn_mask (buffer names; attn_mask may be None),
    is_causal, scale (None: 1/sqrt(D)), enable_gqa."""
    p = kspec.params
    mask = p.get("attn_mask")
    out = tensor_arg(kspec, p["out"], places)
    if p.get("out_heads"):  # out is [B, Lq, Hq * Dv]: the kernel writes its [B, Hq, Lq, Dv] view
        (B, Lq, HDv), (sb, sl, _), H = out.shape, out.strides, int(p["out_heads"])
        out = dataclasses.replace(out, shape=(B, H, Lq, HDv // H), strides=(sb, HDv // H, sl, 1))
    return AttentionSpec(
        tensor_arg(kspec, p["query"], places), tensor_arg(kspec, p["key"], places),
        tensor_arg(kspec, p["value"], places), out,
        tensor_arg(kspec, mask, places) if mask else None, bool(p.get("is_causal", False)), p.get("scale"),
        bool(p.get("enable_gqa", False)), kspec.name, source_ops=tuple(kspec.source_ops) or AttentionSpec.source_ops)


def generate(kspec: Any, places: dict[str, Any], config: CardConfig) -> Program:
    """Register with ``wrapper.register_generator(GENERATOR, generate)``."""
    program, decisions = build_attention(spec_from_kernel(kspec, places), config)
    decisions.source_lines = list(getattr(kspec, "source_lines", []))
    program.metadata["decisions"] = decisions.to_dict()
    return program

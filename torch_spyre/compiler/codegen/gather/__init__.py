"""Gathers (embedding, index_select, a gather that reduces to one) as Spyre programs over ``DmaGather``.

How a gather runs
-----------------
A DmaGather picks *rows of whole sticks*: for each index ``i`` held in scratchpad it copies ``row_sticks``
contiguous sticks from ``src + i * row_stride``. In a stick layout the sticks that share one coordinate
of the gathered dimension form ``i * R + P``: a fixed set ``P`` of stick offsets shifted by a row
stride ``R`` (e.g. an embedding table [V, D] sticked on D: ``R`` = 1 stick, ``P`` = {s * V}: the D sticks
of one row are V sticks apart). ``P`` splits into contiguous runs and each run is one DmaGather, so an
embedding row of D fp16 values costs ceil(D / 64) gathers per chunk of indices, whatever the number of
indices. Gathering along the stick dimension itself (torch.gather or index_select along the last dim)
picks single elements inside sticks: each index then gathers the stick holding its element, and a
one-hot select on the vector unit keeps its lane (two stick reads per element; ``element.py``).

Per core: load a chunk of indices (whole index sticks) by DMA, gather each run into scratchpad, store
the gathered sticks to the output rows (compressed DMA patterns); chunks alternate between two buffer
sets so the next chunk's loads overlap this chunk's store.

Modules: ``spec.py`` (GatherSpec, normalisation), ``rows.py`` (a source row's sticks, the output rows'),
``plan.py`` (chunks and cores), ``emit.py`` (a chunk's instructions), ``element.py`` (gathers along the
stick dim); this module builds the program and its decisions and is the wrapper's generator.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from torch_spyre.card.config import CardConfig
from torch_spyre.compiler.access import CodegenError, TensorView
from torch_spyre.compiler.codegen.gather.element import ELEMENT_CHUNK_BYTES, build_element_gather
from torch_spyre.compiler.codegen.gather.emit import _emit_chunk
from torch_spyre.compiler.codegen.gather.plan import (_Chunk, _choose_chunks, _chunk_plans, _chunk_size, _core_count,
                                                      _lead_coords, _split)
from torch_spyre.compiler.codegen.gather.rows import _RowSticks, _source_rows
from torch_spyre.compiler.codegen.gather.spec import (
    GATHER_KINDS,
    INDEX_DTYPES,
    GatherSpec,
    _is_element_gather,
    _normalise,
    _Plan,
    _select_as_gather,
)
from torch_spyre.compiler.decisions import BufferDecision, KernelDecisions
from torch_spyre.compiler.placement import cores_near_memory
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError, SpBuffer, plan
from torch_spyre.program import STICK_BYTES, Program

__all__ = ["GENERATOR", "GATHER_KINDS", "INDEX_DTYPES", "ELEMENT_CHUNK_BYTES", "CodegenError", "GatherSpec",
           "build_gather", "build_gather_group", "group_member_specs", "build_element_gather", "explain_gather_error", "spec_from_kernel", "generate"]


def build_gather(spec: GatherSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """embedding / index_select / (expanded-index) gather -> (Program, KernelDecisions). Raises
    CodegenError for specs it cannot compile; an index outside the source's rows stops the program on
    the card (see :func:`explain_gather_error`)."""
    if _is_element_gather(spec):
        return build_element_gather(spec, config)
    if spec.kind == "index_select" and len(spec.source.shape) > 1 and spec.dim % len(spec.source.shape) == len(spec.source.shape) - 1:
        return build_element_gather(_select_as_gather(spec), config)
    p = _normalise(spec)
    rows = _source_rows(p)
    idx_rows = int(np.prod(p.index.shape[:-1])) if len(p.index.shape) > 1 else 1
    count = _core_count(p, rows, config)
    per_chunk = _chunk_size(p, rows, spec, config, count.cores)
    lanes = p.index.row_start_lanes(_lead_coords(p.index.shape, 0, idx_rows))
    plans = _chunk_plans(idx_rows, p.index.shape[-1], per_chunk, p.index.lanes,
                         rows_alike=bool(np.all(lanes == lanes[0])))
    plan_name, chunks, plan_scores = _choose_chunks(p, rows, plans)
    # A chunk pays its DMA latencies in turn (index load, one gather per run, stores), a fixed cost of
    # its own: chunking by output bursts can make more chunks than cores, and then each gets its core.
    per_core = _split(chunks, min(config.num_cores, max(count.cores, len(chunks))))
    largest = max(chunks, key=lambda c: c.size)
    row_bytes = rows.sticks_per_key * len(rows.keys) * STICK_BYTES
    idx_bytes = (largest.r1 - largest.r0) * (-(-(largest.c1 - largest.c0 + p.index.lanes - 1) // p.index.lanes) + 1) * STICK_BYTES
    bufs = [SpBuffer(f"{name}{q}", size) for q in range(2)
            for name, size in (("idx", idx_bytes), ("rows", largest.size * row_bytes))]
    try:
        sp_plan = plan(bufs, config.scratchpad_plannable_bytes)
    except ScratchpadOverflowError as e:
        raise CodegenError(f"{spec.kind} {spec.name}: a chunk of {largest.size} indices does not fit: {e}") from None
    buf = {b.name: b.offset for b in sp_plan.buffers}
    per_core = [cs for cs in per_core if cs]
    cores = {core: [i for n, c in enumerate(cs) for i in _emit_chunk(p, rows, c, buf, n % 2)]
             for core, cs in zip(cores_near_memory(len(per_core), config), per_core)}
    decisions = _gather_decisions(spec, p, rows, per_core, per_chunk, sp_plan)
    decisions.core_count = count.to_dict()
    if len(per_core) > count.cores:
        decisions.notes.append(f"{len(chunks)} chunks (cut by output bursts) for a work of {count.cores} core(s): "
                               f"one chunk per core on {len(per_core)} cores")
    decisions.tiling["chunking"] = plan_name
    decisions.alternatives.insert(0, {"option": "chunking by output DRAM bursts per index", **plan_scores,
                                      "chosen": plan_name})
    operands = [p.source.operand("in")]
    if p.index.name != p.source.name:
        operands.append(p.index.operand("in"))
    if p.out.name in (p.source.name, p.index.name):
        raise CodegenError(f"{spec.kind} out %{p.out.name} is also an input; write to a separate buffer")
    operands.append(p.out.operand("out"))
    meta = {"kind": "gather", "decisions": decisions.to_dict(),
            "gather": {"index_operand": p.index.name, "source_operand": p.source.name, "dim": p.dim,
                       "valid_range": [0, p.num_rows]}}
    return Program(spec.name, operands, cores, meta), decisions


def explain_gather_error(program: Program, error: Exception) -> str:
    """The card stops a DmaGather whose index is out of range, naming core, instruction and the range;
    this adds which index tensor and source it was, from the program's metadata."""
    g = program.metadata.get("gather")
    if not g:
        return str(error)
    lo, hi = g["valid_range"]
    return (f"{program.name}: index tensor %{g['index_operand']} holds a value outside [{lo}, {hi}), the valid "
            f"rows of %{g['source_operand']} along dim {g['dim']} ({error})")


def _gather_decisions(spec: GatherSpec, p: _Plan, rows: _RowSticks, per_core: list[list[_Chunk]],
                      per_chunk: int, sp_plan: Any) -> KernelDecisions:
    dec = KernelDecisions(spec.name, "gather", source_ops=list(spec.source_ops))
    dec.buffers = [BufferDecision(p.source.name, "input", p.source.describe()),
                   BufferDecision(p.index.name, "input", p.index.describe()),
                   BufferDecision(p.out.name, "output", p.out.describe())]
    sizes = [sum(c.size for c in cs) for cs in per_core if cs]
    dec.work_division = {"unit": "index positions (each output row owns its sticks)", "cores": len(sizes),
                         "positions_per_core": [min(sizes), max(sizes)], "chunks": sum(len(cs) for cs in per_core)}
    dec.tiling = {"positions_per_chunk": per_chunk, "gathers_per_chunk": len(rows.runs),
                  "row_sticks": [n for _, n in rows.runs], "row_stride_sticks": rows.stride, "dim": p.dim,
                  "valid_rows": p.num_rows}
    dec.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                      "buffers": {b.name: [b.offset, b.aligned_bytes] for b in sp_plan.buffers}}
    dec.overlap = {"double_buffered": ["idx", "rows"]}
    dec.alternatives = [
        {"option": "one DmaGather per contiguous run of a row's sticks", "gathers_per_chunk": len(rows.runs),
         "chosen": True},
        {"option": "relayout the source so a row's sticks are contiguous (one gather per chunk)",
         "chosen": False, "why": "a relayout pass over the whole table costs more than the extra gather instructions"},
    ]
    dec.notes = [f"indices outside [0, {p.num_rows}) stop the program at the DmaGather (card check); "
                 f"index tensor %{p.index.name}, source %{p.source.name}"]
    return dec


# ---------------------------------------------------------------------------------------------
# The wrapper's generator interface (compiler/wrapper.py: fn(KernelSpec, places, config) -> Program)
# ---------------------------------------------------------------------------------------------
GENERATOR = "gather"


def spec_from_kernel(kspec: Any, places: dict[str, Any]) -> GatherSpec:
    """``kspec.params``: kind (embedding, index_select or gather), source, index, out (buffer names), dim."""
    def arg(name: str) -> TensorView:
        return TensorView.of_kernel_buffer(kspec, name, places)

    p = kspec.params
    return GatherSpec(p["kind"], arg(p["source"]), arg(p["index"]), arg(p["out"]), int(p.get("dim", 0)),
                      kspec.name, source_ops=tuple(kspec.source_ops))


def build_gather_group(specs: list[GatherSpec], config: CardConfig, name: str) -> tuple[Program, KernelDecisions]:
    """Gathers of one kernel (``compiler/embedding_group.py``): each member planned as on its own, the
    programs run one after another (a barrier of every core between two), one launch."""
    from torch_spyre.compiler.codegen.matmul.group import sequence

    built = [build_gather(s, config) for s in specs]
    program = sequence(name, [p for p, _ in built])
    first = built[0][1]
    dec = KernelDecisions(name, "gather", list(first.source_ops),
                          buffers=[b for _, d in built for b in d.buffers])
    dec.work_division = {"members": [{"gather": d.kernel, **d.work_division} for _, d in built]}
    dec.tiling = {"members": [d.tiling for _, d in built]}
    dec.fusion = {"embedding_group": len(specs), "optimization": "embedding_group",
                  "where": "the members' gather programs one after another in one launch, a barrier of every core "
                           "between two; each writes its slice of the stacked output",
                  "unfused": "a gather kernel per lookup, each paying the kernel's fixed cost"}
    dec.notes = [f"member {i}: {n}" for i, (_, d) in enumerate(built) for n in d.notes]
    program.metadata["decisions"] = dec.to_dict()
    program.metadata["gather_members"] = [p.metadata.get("gather") for p, _ in built]
    return program, dec


def group_member_specs(sources: list[TensorView], indices: list[TensorView], out: TensorView, name: str,
                       source_ops: tuple[str, ...] = ()) -> list[GatherSpec]:
    """The members of an "embedding_group" kernel: lookup k reads ``sources[k]`` by ``indices[k]`` and
    writes ``out[k]`` (whole rows of the stacked output: each slice starts on a row, rows own their sticks)."""
    return [GatherSpec("embedding", src, idx, replace(out, shape=out.shape[1:], strides=out.strides[1:],
                                                      storage_offset=out.storage_offset + k * out.strides[0]),
                       0, f"{name}[{k}]", source_ops=source_ops)
            for k, (src, idx) in enumerate(zip(sources, indices))]


def _group_specs(kspec: Any, places: dict[str, Any]) -> list[GatherSpec]:
    def view(role: str) -> TensorView:
        return TensorView.of_kernel_buffer(kspec, role, places)

    members = kspec.params["members"]
    return group_member_specs([view(m["source"]) for m in members], [view(m["index"]) for m in members],
                              view("out"), kspec.name, tuple(kspec.source_ops))


def generate(kspec: Any, places: dict[str, Any], config: CardConfig) -> Program:
    """Register with ``wrapper.register_generator(GENERATOR, generate)``."""
    if kspec.params.get("kind") == "embedding_group":
        program, decisions = build_gather_group(_group_specs(kspec, places), config, kspec.name)
    else:
        program, decisions = build_gather(spec_from_kernel(kspec, places), config)
        if kspec.params.get("note"):  # why it was not grouped with its siblings (compiler/embedding_group.py)
            decisions.notes.append(kspec.params["note"])
    decisions.source_lines = list(getattr(kspec, "source_lines", []))
    program.metadata["decisions"] = decisions.to_dict()
    return program

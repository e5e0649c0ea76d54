"""The matmul family as Spyre programs: mm, bmm, addmm, baddbmm and linear.

    C[b, m, n] = alpha * sum_k A[b, m, k] * B[b, k, n]  (+ beta * bias[b, m, n], broadcast)

:func:`build_matmul` turns a :class:`MatmulSpec` (named device buffers with their stick layouts and the
strided views over them) into a :class:`~torch_spyre.program.Program` and the
:class:`~torch_spyre.compiler.decisions.KernelDecisions` that explain it. It is independent of Inductor:
the integrator builds a spec (the ``*_spec`` helpers) and calls it; :func:`generate` is that
integration for the compiler's kernel specs (the wrapper's ``"matmul"`` generator).

How a program is shaped (docs/compiler.md, "The matmul family"):

- **Layouts.** The PE arrays stream activations sticked on K and hold weights sticked on N; the output
  is sticked on N. An operand sticked the other way is loaded as it lies and transposed in scratchpad on
  the vector unit (its cost is charged); :func:`preferred_layouts` tells the integrator which layout
  would avoid that, so a weight can be given the layout its matmul wants once, at load time.
- **Work division** over (batch, M rows, N sticks, K-split), every candidate from the divisors, chosen
  by an analytic cost model: PE time at the card's matmul rate, vector time, per-core DMA time, shared
  DRAM time, and the busiest ring link (DRAM traffic rides the ring to the memory stop; K-split partial
  sums ride the reduction ring or the data ring). K-split partners are adjacent ring stops.
- **Tiling.** M-, N- and K-tiles (N and K in whole sticks) shrink until the buffers fit
  ``scratchpad_plannable_bytes`` (checked with :func:`~torch_spyre.compiler.scratchpad.plan`).
- **Order.** Weight-stationary: for each N tile, for each K tile, one B tile stays while A tiles stream
  through it; A stays resident in scratchpad when it fits. A, B (and transposition staging) buffers and
  the fp32 accumulators are double-buffered, so loads overlap PE work and one tile's epilogue overlaps
  the next tile's matmuls. The epilogue (alpha, beta * bias, an activation, a residual) runs in fp32
  and rounds once to the output dtype.
- **K-split.** Partners each accumulate a K slice; partial sums (fp32) flow down a chain of adjacent
  partners, chunk by chunk, alternating direction so both ring directions work; the last partner of a
  chain adds the epilogue and stores. Receive buffers are reused with credit tokens (signal/wait).

The package, along those seams: ``spec.py`` (the spec, its binding to device memory and its checks),
``plan.py`` (what a split and tiles mean: work per core, scratchpad buffers), ``cost.py`` (the
analytic estimate of a plan), ``search.py`` (the split/tile search), ``share.py`` (A loaded once per row of the
split and forwarded over the ring), ``emit.py`` (the per-core
instructions of a plan) and this module (the entry points and the decisions record).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ....card import costs
from ....card.config import CardConfig
from ....program import Program
from ... import optimizations, scratchpad
from ...access import TensorView
from ...core_count import CoreCount, cores_for, dma_cycles
from ...decisions import BufferDecision, KernelDecisions
from .cost import Estimate, _core_dram_bytes, estimate
from .emit import generate_plan
from .plan import Split, Tiles, _assign, _buffers, _core_shape, leftover_ways
from .search import (Plan, _best_tiles, _core_span, _span_ok, cached_rank_plans, first_fit, naive_split,
                     plan_for_split, rank_plans)
from .spec import (
    MatmulSpec,
    MatmulSpecError,
    _check,
    _Problem,
    addmm_spec,
    baddbmm_spec,
    bmm_spec,
    linear_spec,
    mm_spec,
    preferred_layouts,
    preferred_view_dim,
)

__all__ = [
    "GENERATOR", "Estimate", "MatmulSpec", "MatmulSpecError", "Plan", "Split", "Tiles", "addmm_spec", "baddbmm_spec",
    "bmm_spec", "build_matmul", "estimate", "generate", "generate_plan", "linear_spec", "mm_spec", "naive_split",
    "plan_for_split", "preferred_layouts", "preferred_view_dim", "rank_plans",
]

GENERATOR = "matmul"
_RECORDED_PLANS = 8  # the cheapest plans the decisions list as alternatives


# =============================================================================================
# Entry points
# =============================================================================================
def build_matmul(spec: MatmulSpec, config: CardConfig, verify_top: int = 0) -> tuple[Program, KernelDecisions]:
    """The program for ``spec`` on a card with ``config`` and the record of what was decided and why.

    The plan is the analytic cost model's cheapest. With ``verify_top`` = n > 1, the model's n cheapest
    plans are generated and timed with the card's timing model and the fastest is kept (an autotuning
    step: slower to compile, for kernels run often).

    With the ``matmul_tiling`` optimization switched off (``optimizations``), nothing is searched: the naive
    split and the first tiles that fit (:func:`~.search.first_fit`)."""
    if not optimizations.enabled("matmul_tiling"):
        return _unsearched(spec, config)
    # The decisions list the 8 cheapest plans and the cheapest without a K-split: only those are needed.
    keep = max(_RECORDED_PLANS, verify_top)
    count = _core_count(_check(spec), config)
    cheapest = cached_rank_plans(spec, config, keep=keep)
    # Plans spreading the work thinner than core_count's minimum per core go, unless none is left (then
    # the cheapest stands) or the card's timing model finds the cheapest faster (below).
    ranked = cheapest if cheapest[0].split.cores <= count.cores else cached_rank_plans(spec, config, keep=keep,
                                                                                       max_cores=count.cores)
    simulated: dict[int, float] = {}
    programs: dict[int, Program] = {}
    thinner = None  # the estimate's cheapest plan, when the core count left it out
    if verify_top > 1:
        picks = list(range(min(verify_top, len(ranked))))
        other = _other_scheme(ranked)  # the other dataflow scheme's cheapest plan is timed too
        if other is not None and ranked.index(other) not in picks:
            picks.append(ranked.index(other))
        for i in picks:
            programs[i] = generate_plan(spec, ranked[i].split, ranked[i].tiles, config)
            simulated[i] = _simulated_s(programs[i], config)
    elif cheapest[0] is not ranked[0] and not count.forced:
        # The estimate does not see a core's fixed costs and the core count does not see the plan's: the
        # card's timing model settles whether the plan on fewer cores is really no slower.
        programs[0] = generate_plan(spec, ranked[0].split, ranked[0].tiles, config)
        simulated[0] = _simulated_s(programs[0], config)
        c = cheapest[0]
        thinner_program = generate_plan(spec, c.split, c.tiles, config)
        thinner = (c, _simulated_s(thinner_program, config), simulated[0])
        if thinner[1] < simulated[0]:
            ranked, simulated, programs = cheapest, {0: thinner[1]}, {0: thinner_program}
    if simulated and verify_top > 1:
        best = min(simulated, key=simulated.get)
        reordered = [ranked[best]] + ranked[:best] + ranked[best + 1:]
        position = {id(c): n for n, c in enumerate(reordered)}
        simulated = {position[id(ranked[i])]: t for i, t in simulated.items()}
        programs = {0: programs[best]}
        ranked = reordered
    scheme_note = leftover_note = None
    if not simulated:
        ranked, programs, leftover_note = _settle_leftover(spec, config, ranked)
        ranked, more, simulated, scheme_note = _settle_scheme(spec, config, ranked)
        programs = more if more else programs
    best = ranked[0]
    program = programs[0] if 0 in programs else generate_plan(spec, best.split, best.tiles, config)
    decisions = _decisions(spec, config, ranked, simulated)
    if scheme_note:
        decisions.work_division["operand_sharing"]["settled"] = scheme_note
    if leftover_note:  # the chosen split may have no leftover sticks at all
        record = decisions.work_division["leftover_sticks"] or {"scheme": "none: N divides equally over the cores"}
        decisions.work_division["leftover_sticks"] = {**record, "settled": leftover_note}
    decisions.core_count = count.to_dict()
    if thinner is not None:
        c, t, t_rule = thinner
        why = (f"the card times it faster ({t * 1e6:.3f} us against {t_rule * 1e6:.3f} us), so it stands"
               if ranked[0] is c else f"no faster on the card ({t * 1e6:.3f} us against {t_rule * 1e6:.3f} us)")
        decisions.notes.append(f"the estimate's cheapest split, {c.split} ({c.split.cores} cores), spreads the "
                               f"work thinner than the minimum per core: {why}")
    program.metadata["decisions"] = decisions.to_dict()
    program.metadata["op"] = op_work(spec)
    return program, decisions


def _unsearched(spec: MatmulSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """The program and decisions of :func:`~.search.first_fit` (``matmul_tiling`` switched off)."""
    plan = first_fit(spec, config)
    program = generate_plan(spec, plan.split, plan.tiles, config)
    decisions = _decisions(spec, config, [plan])
    decisions.notes.append("matmul_tiling is switched off: the naive split (output rows only) and the first tiles "
                           "that fit, not searched")
    program.metadata["decisions"] = decisions.to_dict()
    program.metadata["op"] = op_work(spec)
    return program, decisions


def op_work(spec: MatmulSpec) -> dict[str, float]:
    """The op this kernel implements, for the op roofline (card/timing/roofline.py): 2*B*M*N*K flops
    without stick padding, each operand's sticks read once and the output's written once."""
    b, m, n, k = spec.dims
    reads = [v for v in (spec.a, spec.b, spec.bias, spec.residual, spec.norm_weight, spec.norm_bias) if v is not None]
    return {"flops": 2.0 * b * m * n * k, "vector_cycles": 0.0, "read_bytes": sum(v.device_bytes() for v in reads),
            "write_bytes": spec.out.device_bytes()}


SCHEME_MARGIN = 1.15  # estimates of the two dataflow schemes this close are settled on the card


def _settle_scheme(spec: MatmulSpec, config: CardConfig, ranked: list[Plan]):
    """When the cheapest plan of the other operand scheme (A shared over the ring, or every core loading
    its own) is estimated within ``SCHEME_MARGIN`` of the cheapest plan, both are timed on the card and the
    faster kept: the estimate misranks the two by up to about 15 % (1024^3: a K-split estimated cheaper
    times 100.2 us against 88.1 us for A shared over 16 cores)."""
    first, other = ranked[0], _other_scheme(ranked)
    if other is None or other.est.total_s > SCHEME_MARGIN * first.est.total_s:
        return ranked, {}, {}, None
    progs = [generate_plan(spec, c.split, c.tiles, config) for c in (first, other)]
    times = [_simulated_s(prog, config) for prog in progs]
    i = 1 if times[1] < times[0] else 0
    order = [other, first] + [c for c in ranked[1:] if c is not other] if i else ranked
    note = (f"the two schemes' cheapest plans timed on the card: {first.split} ({_scheme(first)}) "
            f"{times[0] * 1e6:.2f} us, {other.split} ({_scheme(other)}) {times[1] * 1e6:.2f} us; the faster kept")
    return order, {0: progs[i]}, {}, note


def _settle_leftover(spec: MatmulSpec, config: CardConfig, ranked: list[Plan]):
    """When the cheapest plan splits the leftover N sticks by K (``Split.leftover_k``), it and the cheapest
    plan that does not are timed on the card and the faster kept: the estimate sees neither the leftover
    pass's own A stream nor its partial-sum chain (768x384x1536: estimated 72.65 us against 72.97 us for
    24 cores of a stick each, timed 69.21 us against 56.8 us)."""
    first = ranked[0]
    plain = [c for c in ranked[1:] if c.split.leftover_k == 1]  # the same operand scheme's first, if any
    other = next((c for c in plain if c.tiles.share == first.tiles.share), plain[0] if plain else None)
    if first.split.leftover_k == 1 or other is None:
        return ranked, {}, None
    progs = [generate_plan(spec, c.split, c.tiles, config) for c in (first, other)]
    times = [_simulated_s(prog, config) for prog in progs]
    i = 1 if times[1] < times[0] else 0
    order = [other, first] + [c for c in ranked[1:] if c is not other] if i else ranked
    note = (f"timed on the card: {first.split} {times[0] * 1e6:.2f} us, {other.split} {times[1] * 1e6:.2f} us "
            "(the cheapest plan without it, of the same operand scheme where there is one); the faster kept")
    return order, {0: progs[i]}, note


def _other_scheme(ranked: list[Plan]) -> Plan | None:
    """The cheapest plan whose operands travel the other way than the cheapest plan's."""
    shared = ranked[0].tiles.share == "a"
    return next((c for c in ranked[1:] if (c.tiles.share == "a") != shared), None)


def _scheme(plan: Plan) -> str:
    return "A shared over the ring" if plan.tiles.share == "a" else "own loads"


def _simulated_s(program: Program, config: CardConfig) -> float:
    from ....card.timing import time_program  # the card's own clock, used only to settle a choice

    return time_program(program, config).total_s


def _core_count(p: _Problem, cfg: CardConfig) -> CoreCount:
    """Cores for this matmul (``core_count``): its work on one core, the cost model's PE, vector and
    DMA-channel time of the best one-core plan; when no one-core plan is feasible, PE cycles of every
    weight tile plus DMA cycles of the operands read and the output written once."""
    single = Split(1, 1, 1, 1)
    one = _best_tiles(p, single, cfg) if _span_ok(p, single, cfg) else None
    if one is not None:
        parts = one.est.parts
        return cores_for((parts["pe"] + parts["vector"] + parts["dma_core"]) * cfg.clock_hz, cfg)
    rows, batch = (p.batch * p.M, 1) if p.b_shared else (p.M, p.batch)
    pe = costs.pe_matmul_cycles(cfg, rows, p.K, p.N, p.a.layout.device_dtype, batch)
    moved = sum(_core_dram_bytes(p, Split(1, 1, 1, 1), _assign(p, Split(1, 1, 1, 1), cfg)[0]))
    return cores_for(pe + dma_cycles(cfg, moved), cfg)




def _decisions(spec: MatmulSpec, cfg: CardConfig, ranked: list[Plan],
               simulated: dict[int, float] | None = None) -> KernelDecisions:
    p = _check(spec)
    best = ranked[0]
    s, t = best.split, best.tiles
    work = _assign(p, s, cfg)
    sh = _core_shape(p, s, t, work[0])
    sp_plan = scratchpad.plan(_buffers(p, s, t, sh, cfg.scratchpad_plannable_bytes), cfg.scratchpad_plannable_bytes)
    d = KernelDecisions(spec.name, "matmul", list(spec.source_ops))
    for bound, kind in ((p.a, "input"), (p.b, "weight"), (p.bias, "input"), (p.residual, "input"),
                         (p.norm_weight, "weight"), (p.norm_bias, "weight"), (p.out, "output")):
        if bound is not None:
            d.buffers.append(BufferDecision(bound.name, kind, bound.layout.describe()))
    d.work_division = {"cores": s.cores, "split": {"batch": s.batch, "M": s.m, "N_sticks": s.n, "K_split": s.k},
                       "operand_sharing": _sharing_decision(p, cfg, best),
                       "leftover_sticks": _leftover_decision(p, cfg, best),
                       "k_partners": "adjacent ring stops" if s.k > 1 else "none",
                       "k_network": t.network if s.k > 1 else None,
                       "max_core_span_bytes": max(_core_span(p, w) for w in work)}
    d.tiling = {"rows": t.bt * t.mt, "batches_per_tile": t.bt, "M_tile": t.mt, "N_tile_sticks": t.nt,
                "K_tile_sticks": t.kt, "a_resident": t.a_resident, "order": "weight-stationary: N tile > K tile > A rows",
                "n_tiles": sh.n_tiles, "k_tiles": sh.k_tiles, "row_tiles": sh.row_tiles, "epilogue_rows": sh.chunk_rows}
    d.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": cfg.scratchpad_plannable_bytes,
                    "buffers": {b.name: b.aligned_bytes for b in sp_plan.buffers}}
    d.overlap = {"double_buffered": [b.name[:-1] for b in sp_plan.buffers if b.name.endswith("0")],
                 "accumulate": "fp32 in scratchpad, one rounding to " + p.out_dtype, "estimate": best.est.to_dict()}
    simulated = simulated or {}
    seen = set()
    picks = list(range(min(_RECORDED_PLANS, len(ranked)))) + [i for i, c in enumerate(ranked) if c.split.k == 1][:1]
    for i in picks:
        c = ranked[i]
        if str(c.split) in seen:
            continue
        seen.add(str(c.split))
        alt = {"split": str(c.split), "tiles": str(c.tiles), "estimate_us": round(c.est.total_s * 1e6, 2)}
        if i in simulated:
            alt["simulated_us"] = round(simulated[i] * 1e6, 2)
        d.alternatives.append(alt)
    naive = naive_split(spec, cfg)
    nc = _best_tiles(p, naive, cfg) if _span_ok(p, naive, cfg) else None
    if nc is not None:
        d.alternatives.append({"split": f"{naive} (naive: output rows only)", "tiles": str(nc.tiles),
                               "estimate_us": round(nc.est.total_s * 1e6, 2)})
    if simulated:
        d.notes.append(f"plan verified: {len(simulated)} plans timed on the card model (the cost model's cheapest, "
                       "and the other operand scheme's cheapest); the fastest kept")
    d.notes += _layout_notes(p, spec, cfg, best)
    return d


def _sharing_decision(p: _Problem, cfg: CardConfig, best: Plan) -> dict[str, Any]:
    """Which dataflow scheme moves the operands, and why: the estimate of the chosen plan against the
    best plan of the same split with the other scheme."""
    s = best.split
    if best.tiles.share == "a":
        other = _best_tiles(p, s, cfg, sharing=False)
        why = (f"estimated {best.est.total_s * 1e6:.2f} us against {other.est.total_s * 1e6:.2f} us with every "
               "core loading its own A" if other else "no plan without sharing fits")
        return {"scheme": f"A forwarded over the ring along each row of the split ({s.n} cores share a row's A: "
                          "one core loads each tile from DRAM, two chains pass it on)", "why": why}
    if not optimizations.enabled("ring_sharing"):
        return {"scheme": "each core loads its own operands", "why": "the ring_sharing optimization is switched off"}
    if s.k > 1 or s.n == 1 or p.a_transposed:
        reason = ("a K-split" if s.k > 1 else "no N split: no two cores share A rows" if s.n == 1
                  else "A is transposed in scratchpad")
        return {"scheme": "each core loads its own operands", "why": f"sharing not possible: {reason}"}
    return {"scheme": "each core loads its own operands",
            "why": "the estimate's cheapest tiles for this split load A on every core (sharing estimated no cheaper)"}


def _leftover_decision(p: _Problem, cfg: CardConfig, best: Plan) -> dict[str, Any] | None:
    """How N sticks that do not divide equally over the cores are dealt (None when they do), and why: the
    chosen plan's estimate against the best of the same split dealt the other way."""
    s = best.split
    q, r = divmod(p.n_units, s.n)
    if r == 0 or s.n == 1:
        return None
    if s.leftover_k > 1:
        other = _best_tiles(p, replace(s, leftover_k=1), cfg) if _assign(p, replace(s, leftover_k=1), cfg) else None
        vs = f" against {other.est.total_s * 1e6:.2f} us with uneven pieces" if other else ""
        return {"scheme": f"every core takes {q} sticks; each of the {r} leftover sticks is split by K over "
                          f"{s.leftover_k} cores, whose fp32 partial sums go down a chain to the last, which stores it "
                          "(those cores share their K piece's A tiles over the ring)",
                "why": f"every core gets the same work: estimated {best.est.total_s * 1e6:.2f} us{vs}"}
    g = leftover_ways(p, s)
    other = _best_tiles(p, replace(s, leftover_k=g), cfg) if g else None
    why = (f"estimated {best.est.total_s * 1e6:.2f} us against {other.est.total_s * 1e6:.2f} us with the leftover "
           f"sticks split by K over {g} cores" if other
           else "the matmul_leftover_split optimization is switched off" if not optimizations.enabled("matmul_leftover_split")
           else "splitting the leftover sticks by K does not apply here")
    return {"scheme": "uneven pieces: the first cores take one stick more (or equal pieces, the last short)", "why": why}


def _layout_notes(p: _Problem, spec: MatmulSpec, cfg: CardConfig, best: Plan) -> list[str]:
    """What a transposed operand costs here, against relayouting it once in its own kernel."""
    notes = []
    for role, flag, bound in (("b", p.b_transposed, p.b), ("a", p.a_transposed, p.a)):
        if not flag:
            continue
        straight = _straight_problem(p, role)
        c = _best_tiles(straight, best.split, cfg)
        in_kernel = best.est.total_s - (c.est.total_s if c else best.est.total_s)
        nbytes = bound.layout.nbytes
        relayout = cfg.kernel_fixed_cost_s + nbytes / cfg.dram_read_bandwidth + nbytes / cfg.dram_write_bandwidth
        notes.append(f"{role} %{bound.name} is sticked on K, not N: transposed in scratchpad on the vector unit "
                     f"(estimated +{in_kernel * 1e6:.2f} us per call) vs. a relayout kernel "
                     f"(~{relayout * 1e6:.2f} us once, e.g. at weight load); preferred_layouts() names the layout")
    return notes


def _straight_problem(p: _Problem, role: str) -> _Problem:
    """The same problem as if ``role`` had the preferred layout (for costing only)."""
    if role == "b":
        return replace(p, b=replace(p.b, lane_dim=2))
    return replace(p, a=replace(p.a, lane_dim=2))


# =============================================================================================
# The compiler's "matmul" generator
# =============================================================================================
def generate(kspec: Any, places: dict[str, Any], config: CardConfig) -> Program:
    """Adapter from a "matmul" KernelSpec (params: kind, alpha, beta, activation, epilogue; operands a, b,
    out, and bias and residual when present) to
    :func:`build_matmul`. Views keep Inductor's sizes/strides and the bound storage offsets."""

    def view(role: str) -> TensorView:
        return TensorView.of_kernel_buffer(kspec, role, places)

    p = kspec.params
    bias = view("bias") if "bias" in p else None
    residual = view("residual") if "residual" in p else None
    norm = p.get("norm")  # a LayerNorm after the epilogue (compiler/epilogue.py)
    mspec = MatmulSpec(view("a"), view("b"), view("out"), bias, float(p.get("alpha", 1.0)),
                       float(p.get("beta", 1.0)), p["kind"], kspec.name, tuple(kspec.source_ops),
                       activation=p.get("activation"), residual=residual,
                       norm_eps=None if norm is None else float(norm["eps"]),
                       norm_weight=view("norm_weight") if "norm_weight" in p else None,
                       norm_bias=view("norm_bias") if "norm_bias" in p else None)
    program, decisions = build_matmul(mspec, config)
    decisions.source_lines = list(kspec.source_lines)
    if "epilogue" in p:  # fused from the compiled graph (compiler/epilogue.py)
        decisions.fusion = {"epilogue": list(p["epilogue"]["steps"]),
                            "where": "on the fp32 accumulator tile in scratchpad, before the one rounding and store",
                            "optimization": p["epilogue"]["optimization"],
                            "unfused": "a pointwise kernel per chain, reading the matmul's output from device memory"}
    if "unfused_mlp" in p:  # part of an MLP block whose fused kernel did not fit (lowerings._lower_fused_mlp)
        decisions.notes.append(p["unfused_mlp"])
    if "note" in p:  # an fp32 matmul's K as 16-bit parts concatenated (lowerings._fp32_note)
        decisions.notes.append(p["note"])
    program.metadata["decisions"] = decisions.to_dict()
    return program

"""The fused MLP as one Spyre program: up (and gate) -> activation (and gate product) -> down.

``h = act(x @ w_gate + b_gate) * (x @ w_up + b_up)`` (or ``act(x @ w_up + b_up)`` without a gate) and
``out = h @ w_down + b_down``, with h never leaving the scratchpads: each core computes h for its share
of the intermediate columns, keeps it resident, multiplies it by its rows of ``w_down`` and the partial
sums meet over the ring (docs/compiler.md, "Fused MLP"). Against the unfused kernels this saves h's
round trip through device memory (written once, read once, 2 x tokens x I x 2 bytes), the gate product's
pointwise kernel and two kernels' fixed costs.

:func:`build_fused_mlp` turns an :class:`MlpSpec` into a :class:`~torch_spyre.program.Program` and its
:class:`~torch_spyre.compiler.decisions.KernelDecisions`; :func:`fit` says whether a shape fits the
scratchpad at all (the compiler runs the unfused kernels when it does not); :func:`generate` is the
wrapper's ``"mlp"`` generator. The package: ``spec.py`` (the spec and its checks), ``plan.py`` (cores,
passes, tiles, scratchpad), ``emit.py`` (per-core instructions).
"""

from __future__ import annotations

from typing import Any

from ....card.config import CardConfig
from ....program import Program
from ...access import TensorView
from ...decisions import BufferDecision, KernelDecisions
from ..matmul.emit import _check_spans
from ..matmul.plan import _CoreWork
from ..matmul.share import share_a
from .emit import MlpEmitter
from .plan import MlpFitError, MlpTiles, assign, choose, passes, row_tiles
from .spec import MlpSpec, MlpSpecError, _MlpProblem, check

W_TAG, W_CREDIT_TAG = 8, 48  # the leftover weights' forwarding (x's uses share.py's 2 and 16+)

__all__ = ["GENERATOR", "MlpFitError", "MlpSpec", "MlpSpecError", "MlpTiles", "build_fused_mlp", "fit", "generate",
           "op_work"]

GENERATOR = "mlp"


def fit(spec: MlpSpec, config: CardConfig) -> str | None:
    """None when some tiling of ``spec`` fits the scratchpad, else why not (the unfused kernels run)."""
    try:
        p = check(spec)
        choose(p, assign(p, config), config)
    except MlpSpecError as e:
        return str(e)
    return None


def build_fused_mlp(spec: MlpSpec, config: CardConfig) -> tuple[Program, KernelDecisions]:
    """The program and the record of what was decided. Raises :class:`MlpFitError` when no tiling fits
    the scratchpad and :class:`MlpSpecError` for shapes, dtypes or layouts it cannot take."""
    p = check(spec)
    work = assign(p, config)
    tiles, sp_plan, tried = choose(p, work, config)
    offsets = {b.name: b.offset for b in sp_plan.buffers}
    cores, x_loads, w_loads = {}, {}, {}
    for c in work.cores:
        em = MlpEmitter(p, work, tiles, c, offsets, config)
        cores[c.core], x_loads[c.core], w_loads[c.core] = em.run(), em.x_loads, em.w_loads
    meta: dict[str, Any] = {"kind": "fused_mlp", "tiles": str(tiles)}
    notes = []
    if work.leftovers and work.cores[0].leftover[2] > 1:  # a leftover stick's weights: loaded once per group
        xs = {c: {id(cores[c][i]) for i in idx} for c, idx in x_loads.items()}
        groups = [_CoreWork(c.core, (c.leftover[0], 1), (0, 1), (0, 1), (0, 1), 0, (c.core,))
                  for c in work.cores if c.leftover]
        cores, more = share_a(cores, w_loads, groups, config, tag=W_TAG, credit_tag=W_CREDIT_TAG)
        notes += more
        x_loads = {c: [i for i, ins in enumerate(cores[c]) if id(ins) in xs[c]] for c in cores}
    if work.count > 1:  # every core streams the same x tiles: one loads each, the ring carries it on
        row = [_CoreWork(c.core, (0, 1), (0, 1), (0, 1), (0, 1), 0, (c.core,)) for c in work.cores]
        cores, more = share_a(cores, x_loads, row, config)
        notes += more
    if notes:
        meta["share_notes"] = notes
    _check_spans(p, cores, config)
    program = Program(spec.name, _operands(spec), cores, meta)
    decisions = _decisions(p, work, tiles, sp_plan, tried, meta)
    program.metadata["decisions"] = decisions.to_dict()
    program.metadata["op"] = op_work(spec)
    return program, decisions


def op_work(spec: MlpSpec) -> dict[str, float]:
    """The op, for the op roofline: the three (or two) matmuls' flops; x, the weights and biases read once,
    the output written once (h is internal to the op)."""
    p = check(spec)
    mats = 3 if p.gated else 2
    reads = [v for v in (spec.x, spec.w_up, spec.w_gate, spec.w_down, spec.b_up, spec.b_gate, spec.b_down,
                         spec.residual, spec.norm_weight, spec.norm_bias) if v is not None]
    return {"flops": 2.0 * p.rows * p.H * p.I * mats, "vector_cycles": 0.0,
            "read_bytes": sum(v.device_bytes() for v in reads), "write_bytes": spec.out.device_bytes()}


def _operands(spec: MlpSpec) -> list:
    out, seen = [], set()
    for view, access in ((spec.x, "in"), (spec.w_up, "in"), (spec.w_gate, "in"), (spec.w_down, "in"),
                         (spec.b_up, "in"), (spec.b_gate, "in"), (spec.b_down, "in"), (spec.residual, "in"),
                         (spec.norm_weight, "in"), (spec.norm_bias, "in"), (spec.out, "out")):
        if view is not None and view.name not in seen:
            seen.add(view.name)
            out.append(view.operand(access))
    return out


def _decisions(p: _MlpProblem, work, tiles: MlpTiles, sp_plan, tried: list[str], meta: dict) -> KernelDecisions:
    spec = p.spec
    d = KernelDecisions(spec.name, "fused_mlp", list(spec.source_ops))
    for bound, kind in ((p.x, "input"), (p.w_up, "weight"), (p.w_gate, "weight"), (p.w_down, "weight"),
                        (p.b_up, "weight"), (p.b_gate, "weight"), (p.b_down, "weight"), (p.residual, "input"),
                        (p.norm_weight, "weight"), (p.norm_bias, "weight"), (p.out, "output")):
        if bound is not None:
            d.buffers.append(BufferDecision(bound.name, kind, bound.layout.describe()))
    left = work.leftovers
    d.work_division = {
        "cores": work.count, "intermediate_sticks_per_core": work.base,
        "leftover_sticks": (f"{left} stick(s) left over after {work.base} per core, each split by tokens over "
                            f"{work.cores[0].leftover[2]} cores (one loads each weight tile and forwards it within the "
                            f"group): {_balance(work)}" if left else "none"),
        "x": "loaded once per pass and forwarded core to core over the ring" if work.count > 1 and
             not meta.get("share_notes") else "each core loads its own",
        "down": f"K-split over the {work.count} cores; partial sums flow over the ring from both sides to core "
                f"{work.cores[work.finisher].core} (the memory stop), which adds the bias, rounds and stores"}
    d.tiling = {"rows_per_tile": tiles.rows, "row_tiles": len(row_tiles(p, tiles.rows)),
                "passes": len(passes(work, tiles.nt)) + (1 if left else 0), "I_sticks_per_pass": tiles.nt,
                "x_tile_H_sticks": tiles.kt, "down_tile_H_sticks": tiles.n2, "receive_slots": tiles.slots,
                "accumulator_sets": 2 if tiles.acc_double else 1,
                "order": "per row tile: up/gate passes writing h, then down tiles with the partial-sum chains"}
    d.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": sp_plan.capacity,
                    "buffers": {b.name: b.aligned_bytes for b in sp_plan.buffers},
                    "intermediate": "h resident: its sticks never leave the scratchpad"}
    d.overlap = {"double_buffered": ["x", "w_up", "w_gate", "w_down", "acc2", "o"],
                 "accumulate": "fp32 in scratchpad, h rounded once to DLFloat16, output rounded once"}
    d.fusion = {"mlp": (["gate"] if p.gated else []) + ["up", spec.activation] + (["mul"] if p.gated else []) + ["down"],
                "where": "one kernel; the intermediate stays in scratchpad", "optimization": "fused_mlp",
                "unfused": "matmul kernels (the activation in the up/gate one's epilogue), a pointwise product "
                           "kernel, h written to and read back from device memory"}
    if p.has_norm:
        d.fusion["mlp"] += (["residual"] if p.residual is not None else []) + ["layer_norm"]
        d.fusion["layer_norm"] = {"eps": float(spec.norm_eps), "optimization": "mlp_layer_norm",
                                  "where": f"core {work.cores[work.finisher].core} (the finisher) keeps each row "
                                           "tile's whole rows in fp32 and normalizes them before the one rounding"}
    d.alternatives = [{"tiles": t} for t in tried]
    d.notes += list(meta.get("share_notes", []))
    return d


def _balance(work) -> str:
    idle = sum(1 for c in work.cores if c.leftover is None)
    return "every core does the same work" if not idle else f"{idle} core(s) have no leftover share"


def generate(kspec: Any, places: dict[str, Any], config: CardConfig) -> Program:
    """Adapter from an "mlp" KernelSpec (params: activation; operands x, w_up, w_down, out and, when
    present, w_gate, b_up, b_gate, b_down) to :func:`build_fused_mlp`."""

    def view(role: str) -> TensorView | None:
        return TensorView.of_kernel_buffer(kspec, role, places) if role in kspec.params else None

    eps = kspec.params.get("norm_eps")
    spec = MlpSpec(view("x"), view("w_up"), view("w_down"), view("out"), view("w_gate"), view("b_up"), view("b_gate"),
                   view("b_down"), kspec.params["activation"], kspec.name, tuple(kspec.source_ops),
                   view("residual"), view("norm_weight"), view("norm_bias"), None if eps is None else float(eps))
    program, decisions = build_fused_mlp(spec, config)
    decisions.source_lines = list(kspec.source_lines)
    if kspec.params.get("norm_note"):  # why the LayerNorm after this MLP was not folded (compiler/mlp_norm.py)
        decisions.notes.append(kspec.params["norm_note"])
    program.metadata["decisions"] = decisions.to_dict()
    return program

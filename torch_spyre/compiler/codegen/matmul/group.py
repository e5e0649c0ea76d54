"""Sibling matmuls in one kernel: the compiler's ``"matmul_group"`` generator (``compiler/matmul_group.py``).

The kernel computes ``out[..., o_i : o_i + N_i] = a @ b_i (+ bias_i)`` for each member i. Each member is
planned by :func:`~torch_spyre.compiler.codegen.matmul.build_matmul` exactly as it would be on its own,
with its output a column slice of the shared buffer (whole sticks: the rewrite only groups members whose
N is), and the members' programs run one after another in one program (:func:`sequence`): one launch,
one fixed cost, where separate kernels paid one each. A barrier of every core between two members orders
them: a member's ring traffic and scratchpad buffers reuse the bytes the previous one used.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ....card.config import CardConfig
from ....program import Barrier, Program, RingRecv, RingSend, Signal, Wait
from ...access import CodegenError, TensorView
from ...decisions import KernelDecisions
from . import build_matmul
from .spec import MatmulSpec

GENERATOR = "matmul_group"
_TAGGED = (RingSend, RingRecv, Signal, Wait, Barrier)


def member_specs(a: TensorView, out: TensorView, members: list[tuple[TensorView, TensorView | None, int]],
                 name: str, source_ops: tuple[str, ...] = ()) -> list[MatmulSpec]:
    """One :class:`MatmulSpec` per member ``(b [K, N], bias [N] or None, column offset in out)``; ``a`` is
    [M, K] or [B, M, K] (then each ``b`` is shared by the batch), ``out`` [..., sum of N]."""
    specs = []
    for i, (b, bias, offset) in enumerate(members):
        n = b.shape[-1]
        if offset % out.lanes or offset + n > out.shape[-1]:
            raise CodegenError(f"matmul group {name}: member {i}'s columns [{offset}, {offset + n}) of out "
                               f"[{', '.join(map(str, out.shape))}] do not start on a stick boundary or do not fit")
        o = replace(out, shape=(*out.shape[:-1], n), storage_offset=out.storage_offset + offset * out.strides[-1])
        batched = len(a.shape) == 3
        if batched and len(b.shape) == 2:
            b = b.expanded(a.shape[0])
        kind = ("baddbmm" if batched else "addmm") if bias is not None else ("bmm" if batched else "mm")
        specs.append(MatmulSpec(a, b, o, bias, 1.0, 1.0, kind, f"{name}[{i}]", source_ops))
    return specs


def sequence(name: str, programs: list[Program]) -> Program:
    """The programs run one after another as one program. Operands of one name must be the same buffer
    (same bytes); ring, signal and barrier tags are renumbered so no two programs share one; a barrier of
    every core that runs anything separates two programs (each core's work of one is done, and visible,
    before any core starts the next)."""
    operands: dict[str, Any] = {}
    for p in programs:
        for o in p.operands:
            seen = operands.setdefault(o.name, o)
            if seen.nbytes != o.nbytes:
                raise CodegenError(f"{name}: operand {o.name!r} has {seen.nbytes} bytes in one member and "
                                   f"{o.nbytes} in another")
            if seen.access != o.access:
                operands[o.name] = replace(seen, access="inout")
    cores = tuple(sorted({c for p in programs for c, ins in p.cores.items() if ins}))
    merged: dict[int, list] = {c: [] for c in cores}
    base = 0
    for i, p in enumerate(programs):
        top = base
        own = tuple(sorted(c for c, ins in p.cores.items() if ins))
        for c in cores:
            for ins in p.cores.get(c, []):
                if isinstance(ins, _TAGGED):
                    ins = replace(ins, tag=ins.tag + base)
                    top = max(top, ins.tag + 1)
                if isinstance(ins, Barrier) and ins.cores is None:  # "every core that runs something": its own
                    ins = replace(ins, cores=own)
                merged[c].append(ins)
        base = top
        if i < len(programs) - 1:
            for c in cores:
                merged[c].append(Barrier(tag=base, cores=cores))
            base += 1
    return Program(name, list(operands.values()), merged)


def op_work(specs: list[MatmulSpec]) -> dict[str, float]:
    """The op roofline's work of the group: the members' flops, ``a`` read once, every weight and bias read
    once, the output written once."""
    from . import op_work as one

    works = [one(s) for s in specs]
    a_bytes = specs[0].a.device_bytes()
    return {"flops": sum(w["flops"] for w in works), "vector_cycles": 0.0,
            "read_bytes": sum(w["read_bytes"] for w in works) - (len(works) - 1) * a_bytes,
            "write_bytes": sum(w["write_bytes"] for w in works)}


def build_matmul_group(specs: list[MatmulSpec], config: CardConfig, name: str) -> tuple[Program, KernelDecisions]:
    built = [build_matmul(s, config) for s in specs]
    program = sequence(name, [p for p, _ in built])
    first = built[0][1]
    decisions = KernelDecisions(name, "matmul_group", list(first.source_ops), buffers=list(first.buffers))
    decisions.work_division = {"members": [{"matmul": d.kernel, **d.work_division} for _, d in built]}
    decisions.tiling = {"members": [d.tiling for _, d in built]}
    decisions.core_count = first.core_count
    decisions.fusion = {"matmul_group": [s.kind for s in specs], "optimization": "matmul_group",
                        "where": "the members' matmul programs one after another in one launch, a barrier of every "
                                 "core between two; each writes its columns of the shared output",
                        "unfused": "a matmul kernel per member, each paying the kernel's fixed cost"}
    decisions.notes = [f"member {i}: {n}" for i, (_, d) in enumerate(built) for n in d.notes]
    program.metadata["decisions"] = decisions.to_dict()
    program.metadata["op"] = op_work(specs)
    return program, decisions


def generate(kspec: Any, places: dict[str, Any], config: CardConfig) -> Program:
    """Adapter from a "matmul_group" KernelSpec (params: ``members``, each ``{"b": role, "bias": role or
    None, "offset": column}``; operands a, out and the members' roles) to :func:`build_matmul_group`."""

    def view(role: str) -> TensorView:
        return TensorView.of_kernel_buffer(kspec, role, places)

    members = [(view(m["b"]), view(m["bias"]) if m.get("bias") else None, int(m["offset"]))
               for m in kspec.params["members"]]
    specs = member_specs(view("a"), view("out"), members, kspec.name, tuple(kspec.source_ops))
    program, decisions = build_matmul_group(specs, config, kspec.name)
    decisions.source_lines = list(kspec.source_lines)
    decisions.notes += list(kspec.params.get("notes", []))  # the members' own (e.g. transposed_product.py)
    program.metadata["decisions"] = decisions.to_dict()
    return program

"""The fused MLP's buffer layout before 9d13e2c (the leftover stick's forwarded weight tiles sharing bytes
with phase 2's buffers over several row tiles) against the checked executor's scratchpad race check, which
orders a ring transfer against the receiver's uses by happens-before alone, whatever the core order."""

from __future__ import annotations

import dataclasses
import re

import pytest

from torch_spyre.card import Card, CardConfig
from torch_spyre.card.execute import ExecutionError, resolve_addresses
from torch_spyre.card.execute.driver import Execution
from torch_spyre.card.execute.state import scratchpads
from torch_spyre.compiler.codegen.mlp import build_fused_mlp
from torch_spyre.compiler.codegen.mlp import plan as mlp_plan

from .test_fused_mlp import mlp_spec, rnd

from benchmarks.programs import encode, operand_layout  # noqa: E402

LEFTOVER = re.compile(r"l[ug]\d|l[ug]_t\d")


@pytest.fixture
def pre_fix_layout(monkeypatch):
    """plan.buffers as before 9d13e2c: the leftover stick's weight buffers live in phase 1 only, so the
    scratchpad planner lets phase 2's buffers (the ring receive slots among them) share their bytes."""
    buffers = mlp_plan.buffers

    def old(p, work, t):
        return [dataclasses.replace(b, end=1) if LEFTOVER.fullmatch(b.name) else b for b in buffers(p, work, t)]

    monkeypatch.setattr(mlp_plan, "buffers", old)


def run_ordered(gated: bool, sp_kib: int, order=None):
    """Build the 300x128x320 MLP on 4 cores (4 row tiles, a leftover stick) and run it checked, the
    simulator stepping the cores in ``order`` (default: by core id)."""
    cfg = CardConfig(num_cores=4, scratchpad_plannable_bytes=sp_kib * 1024)
    prog, dec = build_fused_mlp(mlp_spec(300, 128, 320, gated, True, "silu" if gated else "gelu", False), cfg)
    assert dec.tiling["row_tiles"] > 1
    card = Card(0, cfg)
    ins = {"x": rnd(300, 128), "wu": rnd(128, 320, seed=1), "wg": rnd(128, 320, seed=2),
           "wd": rnd(320, 128, seed=3), "bu": rnd(320, seed=4), "bg": rnd(320, seed=5), "bd": rnd(128, seed=6)}
    allocs = {op.name: card.memory.allocate(op.nbytes) for op in prog.operands}
    for op in prog.operands:
        if op.name in ins:
            card.memory.write(allocs[op.name].address, operand_layout(op).pack(encode(ins[op.name], op.device_dtype)))
    addresses = resolve_addresses(prog, {n: a.address for n, a in allocs.items()})
    with scratchpads(card).lock:
        ex = Execution(card, prog, addresses)
        if order is not None:
            ex.active = list(order)
        ex.run()
    return ex


RACE = r"scratchpad race on core \d"


@pytest.mark.parametrize("order", [None, (3, 2, 1, 0), (1, 3, 0, 2)])
def test_pre_fix_ungated_layout_races_in_every_core_order(pre_fix_layout, order):
    with pytest.raises(ExecutionError, match=RACE):
        run_ordered(False, 200, order)


@pytest.mark.parametrize("order", [None, (3, 2, 1, 0), (1, 3, 0, 2)])
def test_pre_fix_gated_layout_races_when_the_leftover_tiles_land_in_a_receive_slot_in_use(pre_fix_layout, order):
    # At 260 KB the gated plan puts a leftover weight tile where a partial sum is still being added.
    with pytest.raises(ExecutionError, match=RACE):
        run_ordered(True, 260, order)


@pytest.mark.parametrize("order", [None, (3, 2, 1, 0), (1, 3, 0, 2)])
def test_pre_fix_gated_layout_at_200_kib_is_ordered_by_its_buffer_free_wait(pre_fix_layout, order):
    """At 200 KB the leftover tiles also share bytes with a receive slot (recv1), but every forwarding
    sender waits for the receiver's buffer-free signal sent after its last use of those bytes: ordered by
    happens-before, so no race, in any core order."""
    ex = run_ordered(True, 200, order)
    overlapping = 0
    for t in ex.received:
        uses = [pc for pc, lo, hi, _ in ex.cores[t.dst_core].uses if pc < t.recv_index and lo < t.hi and hi > t.lo]
        overlapping += bool(uses)
    assert overlapping  # the layout does reuse bytes across transfers: the check had something to order


def test_fixed_layout_passes(monkeypatch):
    for gated, sp in ((False, 200), (True, 260), (True, 200)):
        run_ordered(gated, sp)

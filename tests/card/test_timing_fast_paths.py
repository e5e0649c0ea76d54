"""The timing model's shortcuts give the figures of the plain computation, bit for bit: the memo of finished
timings (``card/timing/memo.py``) and the indexed progressive filling (``card/timing/sharing.py``)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.programs import build_all_to_all, build_elementwise, build_matmul_ksplit, build_row_reduce
from torch_spyre.card.config import CardConfig, MiB
from torch_spyre.card.timing import network_path, time_program
from torch_spyre.card.timing.memo import program_key
from torch_spyre.card.timing.sharing import Sharing
from torch_spyre.card.timing.timer import simulate_program
from torch_spyre.program import Addr, DmaLoad, DmaPattern, DmaStore, Operand, Program

CFG = CardConfig()


def _figures(t) -> dict[str, Any]:
    return {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name not in ("program_name", "config")}


def _renamed(program: Program, prefix: str) -> Program:
    """The same program with every operand renamed (DMA addresses follow)."""
    def addr(a: Addr) -> Addr:
        return Addr(prefix + a.operand, a.offset)

    def ins(i: Any) -> Any:
        for field in ("src", "dst"):
            if isinstance(getattr(i, field, None), Addr):
                return dataclasses.replace(i, **{field: addr(getattr(i, field))})
        return i

    return Program(program.name + "_renamed", [dataclasses.replace(o, name=prefix + o.name) for o in program.operands],
                   {c: [ins(i) for i in v] for c, v in program.cores.items()}, dict(program.metadata))


@pytest.mark.parametrize("build", [build_elementwise, build_row_reduce, build_matmul_ksplit, build_all_to_all])
def test_memo_hit_has_the_figures_of_a_fresh_simulation(build):
    program = build().program
    renamed = _renamed(program, "other_")
    assert program_key(program, CFG) == program_key(renamed, CFG)
    first, hit = time_program(program, CFG), time_program(renamed, CFG)
    fresh = simulate_program(renamed, CFG)
    assert _figures(hit) == _figures(fresh) == _figures(first)
    assert (hit.program_name, first.program_name) == (renamed.name, program.name)


def test_memo_hits_do_not_share_containers():
    program = build_elementwise(rows=64, cols=256, num_cores=4).program
    a, b = time_program(program, CFG), time_program(program, CFG)
    a.intervals.clear()
    a.busy_s[0]["dma"] = -1.0
    a.bytes["dram_read"] = -1
    c = time_program(program, CFG)
    assert c.intervals == b.intervals and len(c.intervals) > 0
    assert c.busy_s[0]["dma"] == b.busy_s[0]["dma"] >= 0 and c.bytes["dram_read"] == b.bytes["dram_read"] > 0


def test_memo_keeps_which_dma_shares_an_operand():
    """A store back to the operand just loaded waits for the load (device-memory WAR); a store to another
    operand does not. The key must tell the two apart, though both rename to 'two operands'."""
    n = 4  # sticks: latency-bound, so running the two together is clearly faster

    def p(store_to: str) -> Program:
        return Program("t", [Operand("x", 64 * MiB), Operand("y", 64 * MiB, "out")],
                       {0: [DmaLoad(Addr("x", 0), 0, DmaPattern.contiguous(n)),
                            DmaStore(Addr(store_to, 0), 65536, DmaPattern.contiguous(n))]})

    same, other = p("x"), p("y")
    assert program_key(same, CFG) != program_key(other, CFG)
    t_same, t_other = time_program(same, CFG), time_program(other, CFG)
    assert t_same.total_s > t_other.total_s
    assert _figures(t_same) == _figures(simulate_program(same, CFG))
    assert _figures(t_other) == _figures(simulate_program(other, CFG))


def test_memo_key_includes_the_configuration():
    program = build_elementwise(rows=64, cols=256, num_cores=4).program
    slow = CFG.model_copy(update={"dram_latency_s": 2 * CFG.dram_latency_s})
    assert time_program(program, slow).total_s > time_program(program, CFG).total_s


# --- sharing: the indexed filling against the plain dict-based one it replaced ------------------------
def _reference_rates(sharing: Sharing, classes: dict[tuple, int]) -> tuple[dict[tuple, float], dict[Any, float]]:
    """Progressive filling as first written: dicts keyed by signature and resource, loads recomputed."""
    def capacity(r: Any) -> float:
        return 1.0 if r == "dram" else (sharing.reduce_link_bw if r[0] == "reduce" else sharing.link_bw)

    reads = sum(n for sig, n in classes.items() if sig[1] == "r")
    writes = sum(n for sig, n in classes.items() if sig[1] == "w")
    total = reads + writes
    dram = {"r": sharing.t_read + sharing.t_turn * writes / total,
            "w": sharing.t_write + sharing.t_turn * reads / total} if total else {}
    uses = {sig: [(link, 1.0) for link in sig[0]] + ([("dram", dram[sig[1]] * sig[2])] if sig[1] else [])
            for sig in classes}
    left = {r: capacity(r) for use in uses.values() for r, _ in use}
    rate = {sig: 0.0 for sig in classes}
    active = dict(classes)
    while active:
        load: dict[Any, float] = defaultdict(float)
        for sig, count in active.items():
            for r, w in uses[sig]:
                load[r] += w * count
        step = min([left[r] / load[r] for r in load if load[r] > 0] + [sig[3] - rate[sig] for sig in active])
        for sig in active:
            rate[sig] += step
        for r, l in load.items():
            left[r] -= step * l
        full = {r for r in load if left[r] <= 1e-9 * capacity(r)}
        for sig in list(active):
            if rate[sig] >= sig[3] * (1 - 1e-12) or any(r in full for r, _ in uses[sig]):
                del active[sig]
    busy: dict[Any, float] = defaultdict(float)
    for sig, count in classes.items():
        for r, w in uses[sig]:
            busy[r] += count * rate[sig] * w / capacity(r)
    return rate, dict(busy)


@st.composite
def _flow_mix(draw) -> list[tuple[tuple, int]]:
    n, mem = CFG.num_cores, CFG.memory_ring_stop
    mix = {}
    for _ in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(["r", "w", "ring", "reduce"]))
        core = draw(st.integers(0, n - 1))
        if kind in ("r", "w"):
            path = network_path(mem, core, n, "data") if kind == "r" else network_path(core, mem, n, "data")
            factor = 1.0 + draw(st.sampled_from([0.0, 0.0, 0.05, 0.5, 3.0]))
            sig = (path, kind, factor, CFG.dma_engine_bandwidth)
        else:
            net = "reduce" if kind == "reduce" else "data"
            path = network_path(core, draw(st.integers(0, n - 1)), n, net)
            sig = (path, "", 1.0, CFG.reduction_ring_link_bandwidth if net == "reduce" else CFG.ring_link_bandwidth)
        mix[sig] = mix.get(sig, 0) + draw(st.integers(1, 3))
    return list(mix.items())


@settings(max_examples=200, deadline=None)
@given(_flow_mix())
def test_indexed_filling_equals_the_plain_one_bit_for_bit(mix):
    sharing = Sharing(CFG)
    classes = {sharing.intern(sig): count for sig, count in mix}
    rate, busy = sharing.rates(classes)
    ref_rate, ref_busy = _reference_rates(sharing, dict(mix))
    assert [rate[sharing.intern(sig)] for sig, _ in mix] == [ref_rate[sig] for sig, _ in mix]  # exact floats
    assert busy == ref_busy and list(busy) == list(ref_busy)

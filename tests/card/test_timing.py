"""The event-driven timing model: engines, dependencies, contention and the scaling laws."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.work_counter import python_calls
from torch_spyre.card.config import CardConfig, MiB
from torch_spyre.card.timing import time_program
from torch_spyre.card.timing.timer import simulate_program
from torch_spyre.program import (
    Addr,
    Barrier,
    DmaGather,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    MatMul,
    Operand,
    Program,
    ProgramError,
    Reduce,
    RingRecv,
    RingSend,
    Signal,
    SpTensor,
    Wait,
)

CFG = CardConfig()
STICK = 128
DL = "dlfloat16"


def load(offset: int, sp: int, sticks: int, operand: str = "x") -> DmaLoad:
    return DmaLoad(Addr(operand, offset), sp, DmaPattern.contiguous(sticks))


def store(offset: int, sp: int, sticks: int, operand: str = "y") -> DmaStore:
    return DmaStore(Addr(operand, offset), sp, DmaPattern.contiguous(sticks))


def vec(op: str, sp_out: int, sp_in: int, elems: int, dtype: str = DL) -> Elementwise:
    return Elementwise(op, SpTensor(sp_out, dtype, (elems,)), (SpTensor(sp_in, dtype, (elems,)),))


def prog(cores: dict, nbytes: int = 64 * MiB) -> Program:
    return Program("t", [Operand("x", nbytes), Operand("y", nbytes, "out")], cores)


def interval(t, core: int, index: int):
    return next(iv for iv in t.intervals if iv.core == core and iv.index == index)


def stream(cores: list[int], total: int, chunk: int = 256 * 1024) -> Program:
    per = total // len(cores)
    return prog({c: [load(i * per + k * chunk, (k % 2) * chunk, chunk // STICK) for k in range(per // chunk)]
                 for i, c in enumerate(cores)}, nbytes=total)


# --- basics ---------------------------------------------------------------------------------------
def test_empty_program_costs_the_fixed_cost():
    t = time_program(prog({}), CFG)
    assert t.total_s == CFG.kernel_fixed_cost_s
    assert t.bottleneck == "fixed-cost-bound"


def test_tiny_kernel_is_fixed_cost_plus_latencies():
    t = time_program(prog({0: [load(0, 0, 1), vec("relu", 128, 0, 64), store(0, 128, 1)]}), CFG)
    assert CFG.kernel_fixed_cost_s < t.total_s < CFG.kernel_fixed_cost_s + 1e-6
    assert t.bottleneck == "fixed-cost-bound"
    assert [iv.engine for iv in t.intervals] == ["dma", "vector", "dma"]
    assert t.intervals[0].start == pytest.approx(CFG.kernel_fixed_cost_s)


def test_dma_moves_at_its_engine_rate_after_the_latency():
    sticks = 8192
    t = time_program(prog({0: [load(0, 0, sticks)]}), CFG)
    expected = CFG.dram_latency_s + sticks * STICK / (CFG.dma_bytes_per_cycle * CFG.clock_hz)
    assert t.execution_s == pytest.approx(expected, rel=1e-6)


# --- compute engines --------------------------------------------------------------------------------
def _matmul(m: int, k: int, n: int, dtype: str = DL) -> MatMul:
    a = SpTensor(0, dtype, (m, k))
    b = SpTensor(m * k * 4, dtype, (k, n))
    return MatMul(SpTensor(m * k * 4 + k * n * 4, dtype, (m, n)), a, b)


def test_matmul_weight_stationary_tiles_with_fill_and_drain():
    m, k, n = 256, 64, 128
    t = time_program(prog({0: [_matmul(m, k, n)]}), CFG)
    tiles = (k // CFG.pe_rows) * (n // (CFG.pe_cols * CFG.pe_simd_fp16))
    fill = CFG.pe_rows + CFG.pe_cols + CFG.mac_latency_cycles
    per_corelet = math.ceil(tiles / CFG.corelets_in_use)  # the corelets share the weight tiles
    assert CFG.corelets_in_use == 2 and per_corelet == tiles // 2
    assert t.execution_s * CFG.clock_hz == pytest.approx(per_corelet * (m + fill) + CFG.pe_rows)
    assert t.pe_flops == 2 * m * k * n


def test_big_matmul_approaches_the_pe_peak_and_two_corelets_double_it():
    one_cfg = CFG.model_copy(update={"corelets_in_use": 1})
    one = time_program(prog({0: [_matmul(1024, 512, 512)]}), one_cfg)
    peak = 2 * one_cfg.fp16_macs_per_cycle_per_core * CFG.clock_hz
    assert one.pe_flops / one.execution_s == pytest.approx(peak, rel=0.05)
    two = time_program(prog({0: [_matmul(1024, 512, 512)]}), CFG)
    assert CFG.corelets_in_use == 2
    assert one.execution_s / two.execution_s == pytest.approx(2.0, rel=0.01)
    assert one.bottleneck == "compute-bound"


def test_fp32_matmul_runs_at_half_the_fp16_rate():
    fp16 = time_program(prog({0: [_matmul(1024, 512, 512)]}), CFG)
    fp32 = time_program(prog({0: [_matmul(1024, 512, 512, "float32")]}), CFG)
    assert fp32.execution_s / fp16.execution_s == pytest.approx(2.0, rel=0.02)


def test_vector_unit_fp32_takes_twice_fp16_and_transcendentals_cost_extra():
    n = 64 * 1024
    fp16 = time_program(prog({0: [vec("relu", 0, 2 * n, n)]}), CFG).execution_s
    fp32 = time_program(prog({0: [vec("relu", 0, 4 * n, n, "float32")]}), CFG).execution_s
    exp = time_program(prog({0: [vec("exp", 0, 2 * n, n)]}), CFG).execution_s
    assert fp16 * CFG.clock_hz == pytest.approx(n / (CFG.vector_fp16_per_cycle * CFG.corelets_in_use))
    assert fp32 == pytest.approx(2 * fp16)
    assert exp == pytest.approx((1 + CFG.vector_transcendental_cycles) * fp16)


def test_reduce_costs_its_input_sticks():
    red = Reduce("sum", SpTensor(0, "float32", (64, 1)), SpTensor(4096, DL, (64, 1024)), axis=1)
    t = time_program(prog({0: [red]}), CFG)
    assert t.execution_s * CFG.clock_hz == pytest.approx(64 * 1024 / (CFG.vector_fp16_per_cycle * CFG.corelets_in_use))
    assert t.flops == 64 * 1024


def test_gather_pays_a_burst_per_row():
    rows, row_sticks = 256, 4
    index = SpTensor(0, "int32", (rows,))
    gather = DmaGather(Addr("x"), index, row_stride=4096, row_sticks=row_sticks, sp_offset=4096, num_rows=1000)
    dense = load(0, 4096, rows * row_sticks)
    cores = range(32)
    t_gather = time_program(prog({c: [gather] for c in cores}), CFG).execution_s
    t_dense = time_program(prog({c: [dense] for c in cores}), CFG).execution_s
    overhead = 1 + CFG.dram_run_overhead_bytes / (row_sticks * STICK)
    assert t_gather == pytest.approx(t_dense * overhead, rel=0.03)


def test_broadcast_operand_does_not_set_the_vector_width():
    row = SpTensor(0, "float32", (64, 64), (1, 0))
    ins = Elementwise("sub", SpTensor(1024, DL, (64, 64)), (SpTensor(1024, DL, (64, 64)), row))
    plain = Elementwise("sub", SpTensor(1024, DL, (64, 64)), (SpTensor(1024, DL, (64, 64)), SpTensor(16384, DL, (64, 64))))
    assert time_program(prog({0: [ins]}), CFG).execution_s == time_program(prog({0: [plain]}), CFG).execution_s


# --- dependencies -----------------------------------------------------------------------------------
def test_read_after_write_waits_and_independent_work_overlaps():
    mm = MatMul(SpTensor(900_000, DL, (64, 64)), SpTensor(800_000, DL, (64, 64)), SpTensor(850_000, DL, (64, 64)))
    t = time_program(prog({0: [load(0, 0, 1024), vec("relu", 512 * 1024, 0, 64 * 1024), mm]}), CFG)
    ld, dep, indep = (interval(t, 0, i) for i in range(3))
    assert dep.start == pytest.approx(ld.end)
    assert indep.start == pytest.approx(ld.start)  # other bytes, other engine: runs during the load


def test_write_after_read_waits_for_the_reader():
    n = 64 * 1024
    t = time_program(prog({0: [vec("exp", 2 * n, 0, n), load(0, 0, 16)]}), CFG)
    reader, writer = interval(t, 0, 0), interval(t, 0, 1)
    assert writer.start == pytest.approx(reader.end)


def test_double_buffering_overlaps_dma_with_compute():
    chunk, blocks = 64 * 1024, 8

    def body(buffers: int) -> list:
        ins = []
        for b in range(blocks):
            sp = (b % buffers) * chunk
            ins += [load(b * chunk, sp, chunk // STICK), vec("exp", sp, sp, chunk // 2), store(b * chunk, sp, chunk // STICK)]
        return ins

    single = time_program(prog({0: body(1)}), CFG)
    double = time_program(prog({0: body(2)}), CFG)
    assert double.execution_s < 0.85 * single.execution_s
    # In the double-buffered program block 1 is loaded while block 0 is computed.
    assert interval(double, 0, 3).start < interval(double, 0, 1).end


def test_same_core_device_memory_round_trip_is_ordered():
    t = time_program(prog({0: [store(0, 0, 64, "y"), load(0, 8192, 64, "y")]}), CFG)
    assert interval(t, 0, 1).start >= interval(t, 0, 0).end


def test_signal_wait_orders_cores():
    n = 64 * 1024
    t = time_program(prog({0: [vec("exp", 0, 2 * n, n), Signal(1, tag=3)], 1: [Wait(0, tag=3), vec("relu", 0, 2 * n, 64)]}), CFG)
    assert interval(t, 1, 1).start > interval(t, 0, 0).end


def test_barrier_releases_when_the_slowest_core_arrives():
    n = 64 * 1024
    cores = {c: [vec("exp", 0, 2 * n, n * (c + 1) // 4), Barrier(tag=0), vec("relu", 0, 2 * n, 64)] for c in range(4)}
    t = time_program(prog(cores), CFG)
    slowest = max(interval(t, c, 0).end for c in range(4))
    assert all(interval(t, c, 2).start >= slowest for c in range(4))


def test_ring_receive_gates_readers_of_the_received_bytes():
    t = time_program(prog({0: [RingSend(1, 0, 4096, 64 * 1024, tag=1)],
                           1: [RingRecv(0, tag=1), vec("relu", 200_000, 100_000, 64), vec("relu", 0, 4096, 64)]}), CFG)
    send = interval(t, 0, 0)
    assert interval(t, 1, 1).start < send.end  # unrelated bytes: no wait
    assert interval(t, 1, 2).start >= send.end  # reads what arrived


@pytest.mark.parametrize("cores", [
    {0: [Wait(1, tag=0)]},
    {0: [RingRecv(1, tag=0)], 1: []},
    {0: [Wait(1, tag=0), Signal(1, tag=0)], 1: [Wait(0, tag=0), Signal(0, tag=0)]},
])
def test_programs_that_cannot_finish_are_errors(cores):
    with pytest.raises(ProgramError):
        time_program(prog(cores), CFG)


# --- contention and scaling -------------------------------------------------------------------------
def test_double_the_bytes_double_the_dma_time():
    small = time_program(stream([0], 8 * MiB), CFG).execution_s
    large = time_program(stream([0], 16 * MiB), CFG).execution_s
    assert large / small == pytest.approx(2.0, rel=0.01)


def test_more_cores_less_time_until_bandwidth_bound():
    total = 32 * MiB
    times = [time_program(stream(cores, total), CFG).execution_s
             for cores in ([0], [0, 1], [0, 1, 31], [0, 1, 31, 2, 30], list(range(32)))]
    assert all(b <= a * 1.01 for a, b in zip(times, times[1:]))
    assert times[0] / times[1] > 1.2
    bound = total / min(CFG.dram_read_bandwidth, 2 * CFG.ring_link_bandwidth)
    assert times[-1] == pytest.approx(bound, rel=0.03)
    assert times[-2] == pytest.approx(times[-1], rel=0.03)  # bandwidth-bound: more cores no longer help


def test_dram_traffic_rides_the_ring_from_the_memory_stop():
    one_load = 8 * MiB
    near = time_program(stream([0], one_load, chunk=one_load), CFG).execution_s  # at the memory interface's stop
    far = time_program(stream([16], one_load, chunk=one_load), CFG).execution_s
    assert far / near == pytest.approx(CFG.dma_bytes_per_cycle * CFG.clock_hz / CFG.ring_link_bandwidth, rel=0.02)


def test_ring_distance_costs_hops():
    def send(dst: int) -> float:
        return time_program(prog({0: [RingSend(dst, 0, 0, STICK, tag=0)], dst: [RingRecv(0, tag=0)]}), CFG).execution_s

    near, far = send(1), send(16)
    assert far - near == pytest.approx(15 * CFG.ring_hop_latency_cycles / CFG.clock_hz, rel=1e-6)


def test_ring_links_are_shared():
    nbytes = 256 * 1024

    def t(pairs: list[tuple[int, int]]) -> float:
        cores: dict = {}
        for tag, (src, dst) in enumerate(pairs):
            cores.setdefault(src, []).append(RingSend(dst, 0, 0, nbytes, tag=tag))
            cores.setdefault(dst, []).append(RingRecv(src, tag=tag))
        return time_program(prog(cores), CFG).execution_s

    alone = t([(0, 2)])
    sharing = t([(0, 2), (1, 3)])  # both cross link 1->2
    disjoint = t([(0, 2), (4, 6)])
    assert sharing == pytest.approx(2 * alone, rel=0.02)
    assert disjoint == pytest.approx(alone, rel=0.01)
    opposite = t([(0, 2), (3, 1)])  # same links, other direction
    assert opposite == pytest.approx(alone, rel=0.01)


def test_reduction_ring_is_slower_than_the_data_ring():
    nbytes = 256 * 1024

    def t(network: str) -> float:
        return time_program(prog({0: [RingSend(1, 0, 0, nbytes, tag=0, network=network)], 1: [RingRecv(0, tag=0)]}), CFG).execution_s

    assert t("reduce") / t("data") == pytest.approx(CFG.ring_bytes_per_cycle / CFG.reduction_ring_bytes_per_cycle, rel=0.02)


def test_strided_dma_costs_more_than_a_burst():
    sticks = 8192
    burst = DmaLoad(Addr("x"), 0, DmaPattern((sticks,), (STICK,), (STICK,)))
    strided = DmaLoad(Addr("x"), 0, DmaPattern((sticks,), (4 * STICK,), (STICK,)))
    cores = list(range(32))
    t_burst = time_program(prog({c: [burst] for c in cores}), CFG).execution_s
    t_strided = time_program(prog({c: [strided] for c in cores}), CFG).execution_s
    assert t_strided == pytest.approx(t_burst * (1 + CFG.dram_run_overhead_bytes / STICK), rel=0.03)


def test_mixed_read_write_traffic_gets_less_than_pure_streams():
    sticks = 16384
    reads = {c: [load(c * sticks * STICK, 0, sticks)] for c in range(32)}
    mixed = {c: [load(c * sticks * STICK, 0, sticks) if c % 2 else store(c * sticks * STICK, 0, sticks)] for c in range(32)}
    nbytes = 32 * sticks * STICK
    pure_bw = nbytes / time_program(prog(reads), CFG).execution_s
    mixed_bw = nbytes / time_program(prog(mixed), CFG).execution_s
    assert mixed_bw < pure_bw
    assert mixed_bw == pytest.approx(CFG.dram_peak_bandwidth * CFG.dram_mixed_efficiency, rel=0.05)


# --- the result object --------------------------------------------------------------------------------
def test_timing_is_deterministic_and_independent_of_data_and_names():
    p1 = prog({c: [load(c * 65536, 0, 512), vec("exp", 0, 0, 32768), store(c * 65536, 0, 512)] for c in range(4)})
    renamed = Program("other", [Operand("a", 64 * MiB), Operand("b", 64 * MiB, "out")],
                      {c: [DmaLoad(Addr("a", (3 - c) * 65536), 0, DmaPattern.contiguous(512)), vec("exp", 0, 0, 32768),
                           DmaStore(Addr("b", (3 - c) * 65536), 0, DmaPattern.contiguous(512))] for c in range(4)})
    a, b, c = time_program(p1, CFG), time_program(p1, CFG), time_program(renamed, CFG)
    again = time_program(Program.from_json(p1.to_json()), CFG)
    assert a.total_s == b.total_s == c.total_s == again.total_s
    assert a.intervals == b.intervals
    fresh, fresh_renamed = simulate_program(p1, CFG), simulate_program(renamed, CFG)  # not from the memo
    assert a.intervals == fresh.intervals == fresh_renamed.intervals and a.total_s == fresh_renamed.total_s


def test_accounting_summary_and_roofline():
    p = prog({0: [load(0, 0, 1024), vec("exp", 0, 0, 64 * 1024), store(0, 0, 1024)]})
    t = time_program(p, CFG)
    assert t.bytes["dram_read"] == t.bytes["dram_write"] == 1024 * STICK
    assert t.bytes["sp_write"] == 2 * 1024 * STICK  # the load and the exp
    assert t.flops == 64 * 1024
    assert len(t.intervals) == 3
    assert all(0.0 <= u <= 1.0 for eng in t.utilization.values() for u in eng.values())
    assert t.roofline_s <= t.total_s and 0 < t.roofline_fraction <= 1
    text = t.summary()
    assert "roofline" in text and t.bottleneck in text and "core 0 " in text


def test_verdicts():
    assert time_program(stream(list(range(32)), 64 * MiB), CFG).bottleneck in ("dram-bound", "ring-bound")
    exp = prog({0: [vec("exp", 0, 0, 4 * MiB)]})
    assert time_program(exp, CFG).bottleneck == "vector-bound"
    chain = prog({0: [RingSend(1, 0, 0, STICK, tag=0)] + [Wait(1, tag=k) for k in range(1, 200)],
                  1: [RingRecv(0, tag=0)] + [Signal(0, tag=k) for k in range(1, 200)]})
    assert time_program(chain, CFG.model_copy(update={"kernel_fixed_cost_s": 0.0})).bottleneck == "latency/dependency-bound"


def _stream_iterations(n: int) -> Program:
    ins = []
    for k in range(n):
        sp = (k % 2) * 65536
        ins += [load(k * 65536, sp, 512), vec("exp", sp, sp, 32768), store(k * 65536, sp, 512)]
    return prog({c: ins for c in range(4)}, nbytes=128 * MiB)


def test_timing_work_grows_linearly_with_the_program():
    """The timing model's work (Python calls, counted, not timed) per instruction stays flat as the
    program doubles: no quadratic step in building the graph or in the event loop. Host wall time is
    measured by benchmarks/timing_model.py."""
    work = {}
    for n in (100, 200):
        calls, t = python_calls(time_program, _stream_iterations(n), CFG)
        assert len(t.intervals) == 12 * n
        work[n] = calls / (12 * n)
    assert work[200] <= 1.05 * work[100], work
    assert work[200] < 400, f"{work[200]:.0f} calls per instruction"  # about 125 when written


def test_a_few_thousand_instructions_time_completely():
    t = time_program(_stream_iterations(1000), CFG)
    assert len(t.intervals) == 12000
    assert math.isfinite(t.total_s)
    per_core = {c: [iv for iv in t.intervals if iv.core == c] for c in range(4)}
    assert all(len(ivs) == 3000 for ivs in per_core.values())


# --- invariants on random programs ---------------------------------------------------------------------
_BUF = 16 * 1024  # four scratchpad buffers of 16 KiB, so random programs collide often


@st.composite
def _random_core(draw) -> list:
    ins = []
    for k in range(draw(st.integers(1, 12))):
        a, b = draw(st.integers(0, 3)) * _BUF, draw(st.integers(0, 3)) * _BUF
        kind = draw(st.sampled_from(["load", "store", "exp", "add"]))
        if kind == "load":
            ins.append(load(k * _BUF, a, _BUF // STICK))
        elif kind == "store":
            ins.append(store(k * _BUF, a, _BUF // STICK))
        else:
            ins.append(vec(kind if kind == "exp" else "relu", a, b, _BUF // 2))
    return ins


def _spans(t, core: int, engine_ops: tuple[str, ...]) -> list:
    return sorted((iv.start, iv.end) for iv in t.intervals if iv.core == core and iv.op in engine_ops)


@settings(max_examples=40, deadline=None)
@given(st.lists(_random_core(), min_size=1, max_size=4))
def test_random_programs_respect_engines_and_hazards(cores):
    p = prog(dict(enumerate(cores)))
    t = time_program(p, CFG)
    assert simulate_program(p, CFG).intervals == t.intervals
    for core, ins in enumerate(cores):
        # each in-order queue runs one instruction at a time
        for ops in (("dma_load",), ("dma_store",), ("elementwise",)):
            spans = _spans(t, core, ops)
            assert all(e0 <= s1 * (1 + 1e-12) for (_, e0), (s1, _) in zip(spans, spans[1:]))
        # a reader of a buffer never starts before the last earlier writer of that buffer finished
        last_write: dict[int, float] = {}
        for i, instr in enumerate(ins):
            iv = interval(t, core, i)
            reads = [instr.sp_offset] if isinstance(instr, DmaStore) else (
                [instr.inputs[0].offset] if isinstance(instr, Elementwise) else [])
            for r in reads:
                assert iv.start >= last_write.get(r, 0.0) * (1 - 1e-12)
            written = instr.sp_offset if isinstance(instr, DmaLoad) else (
                instr.out.offset if isinstance(instr, Elementwise) else None)
            if written is not None:
                last_write[written] = iv.end

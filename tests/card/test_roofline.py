"""The op roofline (card/timing/roofline.py): the yardstick of every "of roofline" figure."""

from __future__ import annotations

import pytest

from torch_spyre.card import CardConfig, StickLayout
from torch_spyre.card.config import MiB
from torch_spyre.card.timing import time_program
from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.matmul import build_matmul, generate_plan, mm_spec, naive_split, plan_for_split
from torch_spyre.program import Addr, DmaLoad, DmaPattern, DmaStore, Operand, Program

CFG = CardConfig()
DL = "dlfloat16"


def buf(name: str, shape: tuple[int, ...], stick: int = -1) -> TensorView:
    return TensorView.whole(name, StickLayout(tuple(shape), stick, DL))


def mm(M: int, K: int, N: int):
    return mm_spec(buf("a", (M, K)), buf("b", (K, N)), buf("c", (M, N)), name=f"mm_{M}x{K}x{N}")


def test_matmul_op_roofline_is_flops_at_the_chip_peak_or_compulsory_bytes():
    M, K, N = 512, 1024, 2048
    prog, _ = build_matmul(mm(M, K, N), CFG)
    t = time_program(prog, CFG)
    compute = 2 * M * N * K / CFG.chip_peak_fp16_flops  # every core, every corelet, whatever the program used
    memory = (M * K + K * N) * 2 / CFG.dram_read_bandwidth + M * N * 2 / CFG.dram_write_bandwidth
    assert t.op_compute_s == pytest.approx(compute) and t.op_memory_s == pytest.approx(memory)
    assert t.roofline_s == pytest.approx(max(compute, memory) + CFG.kernel_fixed_cost_s)
    assert t.roofline_fraction == pytest.approx(t.roofline_s / t.total_s)
    assert t.op.source == "declared by the generator"


def test_op_bytes_are_whole_sticks_and_flops_the_ops_own():
    """K = 100 and N = 70 pad to two sticks each on the card: the compulsory bytes are those sticks; the
    flops are the op's, 2*M*N*K."""
    prog, _ = build_matmul(mm(64, 100, 70), CFG)
    t = time_program(prog, CFG)
    assert t.op.flops == 2 * 64 * 100 * 70
    assert (t.op.read_bytes, t.op.write_bytes) == ((64 * 2 + 100 * 2) * 128, 64 * 2 * 128)


def test_an_inefficient_program_is_measured_as_inefficient():
    """The naive split reloads B on every core: its own bound (its bytes) calls it efficient, the op
    roofline does not."""
    spec = mm(1024, 1024, 1024)
    naive = plan_for_split(spec, naive_split(spec, CFG), CFG)
    t = time_program(generate_plan(spec, naive.split, naive.tiles, CFG), CFG)
    assert t.bytes["dram_read"] > 4 * (2 * 1024 * 1024 * 2)  # operands loaded many times over
    assert t.roofline_s < t.program_bound_s
    assert t.roofline_fraction < t.program_bound_fraction
    assert "op roofline" in t.summary() and "program's own bound" in t.summary()


def test_one_corelet_program_is_measured_against_both_corelets():
    spec = mm(256, 512, 512)
    one = CFG.model_copy(update={"corelets_in_use": 1})
    two = CFG.model_copy(update={"corelets_in_use": 2})
    t1 = time_program(build_matmul(spec, one)[0], one)
    t2 = time_program(build_matmul(spec, two)[0], two)
    assert t1.op_compute_s == pytest.approx(t2.op_compute_s)  # the chip's peak, not the corelets in use


def test_without_a_declaration_the_op_is_read_off_the_operands_and_dma():
    """An input read only in part is charged what was read; an input read twice is charged once."""
    x, y = Operand("x", 4 * MiB), Operand("y", 4 * MiB, "out")
    cores = {0: [DmaLoad(Addr("x", 0), 0, DmaPattern.contiguous(1024)),
                 DmaLoad(Addr("x", 0), 0, DmaPattern.contiguous(1024)),
                 DmaStore(Addr("y", 0), 0, DmaPattern.contiguous(2048))]}
    t = time_program(Program("partial", [x, y], cores), CFG)
    assert t.op.source == "read off the program"
    assert (t.op.read_bytes, t.op.write_bytes) == (2 * 1024 * 128, 2048 * 128)
    assert t.bytes["dram_read"] == 2 * 1024 * 128  # the program read it twice
    assert t.op_memory_s == pytest.approx(1024 * 128 * 2 / CFG.dram_read_bandwidth
                                          + 2048 * 128 / CFG.dram_write_bandwidth)


def test_same_instructions_other_operands_get_their_own_op():
    """The timing memo reuses a program's simulation; the op is still each program's own."""
    cores = {0: [DmaLoad(Addr("x", 0), 0, DmaPattern.contiguous(64)), DmaStore(Addr("y", 0), 0, DmaPattern.contiguous(64))]}
    small = Program("small", [Operand("x", 4096), Operand("y", 4096, "out")], cores)
    big = Program("big", [Operand("x", 4096), Operand("y", 8192, "out")], cores, {"op": {
        "flops": 1e9, "read_bytes": 4096, "write_bytes": 8192}})
    ts, tb = time_program(small, CFG), time_program(big, CFG)
    assert ts.total_s == tb.total_s
    assert (ts.op.write_bytes, tb.op.write_bytes) == (4096, 8192) and tb.op.flops == 1e9


@pytest.mark.parametrize("shape, strides, offset, sticks", [
    ((256, 128), None, 0, 512),  # the whole [256, 128]: 2 sticks a row
    ((256, 64), (128, 1), 64, 256),  # the second stick of every row
    ((128, 256), (1, 128), 0, 512),  # transposed view: the same sticks
    ((4, 256, 128), (0, 128, 1), 0, 512),  # a stride-0 batch repeats the same sticks
    ((256,), (128,), 0, 256),  # one column: every element in a stick of its own
])
def test_view_device_bytes(shape, strides, offset, sticks):
    view = TensorView("v", StickLayout((256, 128), -1, DL), shape, strides, offset)
    assert view.device_bytes() == sticks * 128


def test_vector_work_is_measured_at_every_corelet_of_the_chip():
    from torch_spyre.card import costs
    from torch_spyre.program import Elementwise, SpTensor

    n = 64 * 1024
    exp = Elementwise("exp", SpTensor(0, DL, (n,)), (SpTensor(n * 2, DL, (n,)),))
    t = time_program(Program("exp", [Operand("x", 4096)], {0: [exp]}), CFG)
    one_corelet = costs.vector_cycles(CFG.model_copy(update={"corelets_in_use": 1}), n, 2, transcendental=True)
    assert t.op.vector_cycles == pytest.approx(one_corelet)
    assert t.op_compute_s == pytest.approx(one_corelet / (CFG.num_cores * CFG.corelets_per_core * CFG.clock_hz))

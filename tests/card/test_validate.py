"""Static validation: every hand-written program passes, and every kind of bad program is refused with a
message naming the core and the instruction."""

from __future__ import annotations


import pytest


from benchmarks.programs import ALL_BUILDERS, DeviceTensor, ew  # noqa: E402
from torch_spyre.card import load_config  # noqa: E402
from torch_spyre.card.validate import validate  # noqa: E402
from torch_spyre.program import (  # noqa: E402
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
    Scalar,
    Signal,
    SpTensor,
    Wait,
)

CONFIG = load_config(environ={})
DL = "dlfloat16"
X = DeviceTensor("x", (8, 64))
Y = DeviceTensor("y", (8, 64), access="out")
A = SpTensor(0, DL, (8, 64))
B = SpTensor(1024, DL, (8, 64))
OPERANDS = [X.operand(), Y.operand()]
LOAD = X.load(0, 0, 8, 0, 64)
STORE = Y.store(1024, 0, 8, 0, 64)


def check(cores, operands=OPERANDS, config=CONFIG):
    validate(Program("t", operands, cores), config)


def refused(cores, pattern, operands=OPERANDS, config=CONFIG):
    with pytest.raises(ProgramError, match=pattern) as info:
        check(cores, operands, config)
    return info.value


@pytest.mark.parametrize("name", sorted(ALL_BUILDERS))
def test_hand_written_programs_validate(name):
    validate(ALL_BUILDERS[name]().program, CONFIG)


def test_good_program():
    check({0: [LOAD, ew("exp", B, A), STORE]})


# --- operands, cores ------------------------------------------------------------------------------
def test_unknown_operand():
    e = refused({0: [LOAD, DmaStore(Addr("z", 0), 1024, DmaPattern.contiguous(8))]},
                r"^core 0, instruction 1 \(dma_store +%z\+0.*\): unknown operand %z; declared: %x, %y")
    assert (e.core, e.index) == (0, 1)


def test_core_outside_card():
    refused({32: [LOAD]}, r"core id 32 is outside this card's cores 0..31")


def test_duplicate_operand():
    refused({}, r"operand %x is declared twice", operands=OPERANDS + [X.operand()])


def test_store_into_input_operand():
    refused({0: [LOAD, DmaStore(Addr("x", 0), 0, DmaPattern.contiguous(8))]},
            r"core 0, instruction 1 .*writes to operand %x, which is declared access='in'")


# --- scratchpad bounds ----------------------------------------------------------------------------
def test_scratchpad_overflow_gives_bytes_needed_and_plannable():
    limit = CONFIG.scratchpad_plannable_bytes
    big = SpTensor(0, "float32", (512, 1024))  # 2 MiB
    refused({0: [LOAD, ew("exp", big, 1.0)]},
            rf"core 0, instruction 1 \(exp .*\): out reaches scratchpad byte {2 * 1024 * 1024}: the plan overflows the "
            rf"scratchpad, needing {2 * 1024 * 1024} bytes but only {limit} are plannable")


def test_dma_scratchpad_side_overflow():
    limit = CONFIG.scratchpad_plannable_bytes
    refused({0: [X.load(limit - 128, 0, 8, 0, 64)]},
            rf"core 0, instruction 0 .*the DMA's scratchpad side reaches scratchpad byte {limit + 896}.*only {limit} are plannable")


def test_ring_destination_overflow():
    limit = CONFIG.scratchpad_plannable_bytes
    refused({0: [LOAD, RingSend(1, 0, limit, 128, tag=0)], 1: [RingRecv(0, tag=0)]},
            r"core 0, instruction 1 \(ring_send.*the ring destination on core 1 reaches scratchpad byte")


def test_negative_scratchpad_offset():
    refused({0: [LOAD, ew("exp", SpTensor(-128, DL, (64,)), SpTensor(0, DL, (64,)))]},
            r"core 0, instruction 1 .*out starts at scratchpad byte -128")


# --- DMA -------------------------------------------------------------------------------------------
def test_dram_offset_not_aligned():
    refused({0: [DmaLoad(Addr("x", 64), 0, DmaPattern.contiguous(1))]},
            r"core 0, instruction 0 .*device offset 64 into %x is not 128-byte aligned")


def test_dram_range_outside_operand():
    refused({0: [DmaLoad(Addr("x", 128), 0, DmaPattern.contiguous(8))]},
            r"core 0, instruction 0 .*device bytes \[128, 1152\) are outside operand %x, which has 1024 bytes")


def test_dram_negative_stride_before_operand():
    refused({0: [DmaLoad(Addr("x", 0), 0, DmaPattern((2,), (-128,), (128,)))]},
            r"core 0, instruction 0 .*device bytes \[-128, 128\) are outside operand %x")


def test_sp_offset_not_aligned():
    refused({0: [DmaLoad(Addr("x", 0), 64, DmaPattern.contiguous(1))]},
            r"core 0, instruction 0 .*scratchpad offset 64 is not 128-byte aligned")


def test_dma_strides_not_whole_sticks():
    refused({0: [DmaLoad(Addr("x", 0), 0, DmaPattern((2,), (64,), (128,)))]},
            r"core 0, instruction 0 .*DMA dram strides \[64\] must be multiples of 128")


def test_dma_pattern_rank_mismatch():
    refused({0: [DmaLoad(Addr("x", 0), 0, DmaPattern((2, 2), (128,), (128, 256)))]},
            r"core 0, instruction 0 .*DMA pattern has 2 loops but 1 dram strides and 2 sp strides")


def test_gather_index_dtype():
    refused({0: [LOAD, DmaGather(Addr("x", 0), SpTensor(0, DL, (4,)), 128, 1, 1024, 8)]},
            r"core 0, instruction 1 .*gather index must have an integer dtype, got dlfloat16")


def test_gather_rows_outside_operand():
    refused({0: [LOAD, DmaGather(Addr("x", 0), SpTensor(0, "int64", (4,)), 128, 1, 1024, 9)]},
            r"core 0, instruction 1 .*device bytes \[0, 1152\) are outside operand %x")


# --- tensors and ops -------------------------------------------------------------------------------
def test_unknown_dtype():
    refused({0: [LOAD, ew("exp", SpTensor(1024, "float16", (8, 64)), A)]},
            r"core 0, instruction 1 .*out has unknown dtype 'float16'; known: dlfloat16")


def test_shape_stride_rank_mismatch():
    refused({0: [LOAD, ew("exp", B, SpTensor(0, DL, (8, 64), (64,)))]},
            r"core 0, instruction 1 .*input 0 has 2 sizes \[8, 64\] but 1 strides \[64\]")


def test_unknown_elementwise_op():
    refused({0: [LOAD, ew("softplus", B, A)]}, r"core 0, instruction 1 .*unknown elementwise op 'softplus'; known: abs")


def test_elementwise_arity():
    refused({0: [LOAD, ew("add", B, A)]}, r"core 0, instruction 1 .*add takes 2 input\(s\), got 1")
    refused({0: [LOAD, ew("exp", B, A, A)]}, r"core 0, instruction 1 .*exp takes 1 input\(s\), got 2")
    refused({0: [LOAD, Elementwise("where", B, (A, A))]}, r"where takes 3 input\(s\), got 2")


def test_elementwise_shape_mismatch():
    refused({0: [LOAD, ew("exp", B, SpTensor(0, DL, (4, 64)))]},
            r"core 0, instruction 1 .*input 0 has shape \[4, 64\] but out has \[8, 64\]")


def test_copy_must_keep_dtype():
    refused({0: [LOAD, ew("copy", SpTensor(1024, "float32", (8, 64)), A)]},
            r"core 0, instruction 1 .*copy keeps the dtype \(dlfloat16 -> float32\); use cast")


def test_broadcast_out_refused():
    refused({0: [LOAD, ew("exp", SpTensor(1024, DL, (8, 64), (0, 1)), A)]},
            r"core 0, instruction 1 .*out has a broadcast \(stride 0\) dimension")


def test_matmul_shape_mismatch():
    refused({0: [LOAD, MatMul(SpTensor(4096, "float32", (8, 8)), A, SpTensor(0, DL, (32, 8)))]},
            r"core 0, instruction 1 \(matmul.*matmul shapes do not agree: out\[8, 8\] = a\[8, 64\] @ b\[32, 8\]")


def test_matmul_rank():
    refused({0: [LOAD, MatMul(SpTensor(4096, "float32", (8,)), A, SpTensor(0, DL, (64, 8)))]},
            r"core 0, instruction 1 .*matmul out must be 2-d, got shape \[8\]")


def test_reduce_axis_out_of_range():
    refused({0: [LOAD, Reduce("sum", SpTensor(2048, "float32", (8, 1)), A, axis=2)]},
            r"core 0, instruction 1 \(reduce.*reduce axis 2 is out of range for a 2-d input \(0..1\)")


def test_reduce_out_shape():
    refused({0: [LOAD, Reduce("sum", SpTensor(2048, "float32", (8,)), A, axis=1)]},
            r"core 0, instruction 1 .*reduce out has shape \[8\], expected \[8, 1\]")


def test_unknown_reduce_op():
    refused({0: [LOAD, Reduce("mean", SpTensor(2048, "float32", (8, 1)), A, axis=1)]},
            r"core 0, instruction 1 .*unknown reduce op 'mean'")


# --- ring and synchronization ---------------------------------------------------------------------
def test_ring_send_without_recv():
    refused({0: [LOAD, RingSend(1, 0, 0, 1024, tag=7)], 1: []},
            r"core 0, instruction 1 \(ring_send.*has no matching ring_recv <- core 0 tag=7 on core 1 \(1 sent, 0 received\)")


def test_ring_recv_without_send():
    refused({0: [], 1: [RingRecv(0, tag=7)]},
            r"core 1, instruction 0 \(ring_recv.*has no matching ring_send -> core 1 tag=7 on core 0 \(0 sent, 1 received\)")


def test_signal_without_wait():
    refused({0: [Signal(3, tag=1)]}, r"core 0, instruction 0 \(signal.*has no matching wait <- core 0 tag=1 on core 3")


def test_wait_without_signal():
    refused({2: [Wait(0, tag=1)]}, r"core 2, instruction 0 \(wait.*has no matching signal -> core 2 tag=1 on core 0")


def test_ring_to_self():
    refused({0: [LOAD, RingSend(0, 0, 1024, 128, tag=0)]},
            r"core 0, instruction 1 .*ring destination core is this core itself")


def test_ring_network_and_alignment():
    refused({0: [LOAD, RingSend(1, 0, 0, 128, tag=0, network="fast")], 1: [RingRecv(0, tag=0)]},
            r"core 0, instruction 1 .*unknown ring network 'fast'")
    refused({0: [LOAD, RingSend(1, 0, 0, 100, tag=0)], 1: [RingRecv(0, tag=0)]},
            r"core 0, instruction 1 .*ring nbytes 100 is not a multiple of 128")


def test_wait_on_core_outside_card():
    refused({0: [Wait(40, tag=0)]}, r"core 0, instruction 0 .*wait source core 40 is not a core of this card")


def test_barrier_inconsistent_core_sets():
    refused({0: [Barrier(1, cores=(0, 1))], 1: [Barrier(1, cores=(0, 1, 2))], 2: [Barrier(1, cores=(0, 1, 2))]},
            r"core 1, instruction 0 \(barrier.*barrier tag 1 names cores \[0, 1, 2\] here but cores \[0, 1\] at core 0, "
            r"instruction 0")


def test_barrier_reached_unequally():
    refused({0: [Barrier(1), Barrier(1)], 1: [Barrier(1)]},
            r"core 0, instruction 0 .*barrier tag 1 is reached 2 time\(s\) by some cores but fewer by core\(s\) \[1\]")


def test_barrier_without_this_core():
    refused({0: [Barrier(1, cores=(1, 2))], 1: [Barrier(1, cores=(1, 2))], 2: [Barrier(1, cores=(1, 2))]},
            r"core 0, instruction 0 .*core set \[1, 2\] does not include it")


# --- per-core address span ------------------------------------------------------------------------
def test_core_address_span():
    small = load_config(environ={}, core_address_span_bytes=1024 * 1024)
    big = Operand("big", 4 * 1024 * 1024, "in")
    far = DmaLoad(Addr("big", 2 * 1024 * 1024), 128, DmaPattern.contiguous(1))
    cores = {0: [DmaLoad(Addr("big", 0), 0, DmaPattern.contiguous(1)), far], 1: [far]}
    refused(cores, r"^core 0: this core touches 2097280 bytes of device memory \(%big: 2097280 bytes\), more than the 1048576 bytes "
                   r"one core can address", operands=[big], config=small)
    del cores[0]
    check(cores, [big], small)  # one stick is fine


def test_error_attributes():
    e = refused({0: [LOAD, ew("add", B, A)]}, "takes 2")
    assert e.core == 0 and e.index == 1 and isinstance(e.instr, Elementwise)


def test_scalar_inputs_are_allowed():
    check({0: [ew("fma", B, Scalar(1.0), 2.0, 3.0), STORE]})

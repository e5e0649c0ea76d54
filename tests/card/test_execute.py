"""Functional execution: the hand-written programs against torch, op semantics, and every runtime check."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# benchmarks/ is not an installed package: make the repository root importable.

from benchmarks.programs import (  # noqa: E402
    ALL_BUILDERS,
    DeviceTensor,
    Scratch,
    build_matmul_1024,
    build_minilm_layer,
    encode,
    ew,
    operand_layout,
    run_on_card,
    view,
)
from tests.work_counter import python_calls  # noqa: E402
from torch_spyre.card import Card, load_config  # noqa: E402
from torch_spyre.card.dlfloat16 import round_float32  # noqa: E402
from torch_spyre.card.execute import ExecutionError, execute, resolve_addresses  # noqa: E402
from torch_spyre.program import (  # noqa: E402
    BINARY_OPS,
    STICK_BYTES,
    TERNARY_OPS,
    UNARY_OPS,
    Addr,
    Barrier,
    DmaGather,
    DmaLoad,
    DmaPattern,
    Elementwise,
    MatMul,
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

DL = "dlfloat16"


@pytest.fixture(scope="module")
def card() -> Card:
    return Card(0, load_config(environ={}))


def _check(built, card, rtol, atol, seed=0):
    inputs = built.make_inputs(seed)
    outputs, stats = run_on_card(card, built.program, inputs)
    for name, expected in built.reference(inputs).items():
        torch.testing.assert_close(outputs[name], expected.float(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
    return stats


# ---------------------------------------------------------------------------------------------
# The hand-written programs against torch
# ---------------------------------------------------------------------------------------------
# DLFloat16 keeps 9 fraction bits: one rounding is a relative error of at most 2^-10 ~ 1e-3; inputs
# are rounded too, so results that amplify input error (exp, long sums) get ~1e-2.
TOLERANCES = {
    "elementwise": (1e-2, 1e-2),
    "row_reduce": (1e-2, 1e-1),  # sums of 1024 rounded inputs
    "matmul_ksplit": (1e-2, 1e-2),
    "all_to_all": (0, 0),  # inputs are exact in DLFloat16: the exchange must be bit-exact
    "softmax_scratchpad": (1e-2, 1e-3),
    "softmax_roundtrip": (1e-2, 1e-3),
    "minilm_qkv_proj": (1e-2, 2e-2),
    "minilm_attention": (1e-2, 1e-2),
    "minilm_out_proj": (1e-2, 2e-2),
    "minilm_ln1": (1e-2, 2e-2),
    "minilm_ffn_up": (1e-2, 2e-2),
    "minilm_ffn_down": (1e-2, 2e-2),
    "minilm_ln2": (1e-2, 2e-2),
}


@pytest.mark.parametrize("name", sorted(TOLERANCES))
def test_hand_written_program_matches_torch(card, name):
    rtol, atol = TOLERANCES[name]
    _check(ALL_BUILDERS[name](), card, rtol, atol)


def test_every_builder_is_tested():
    assert set(ALL_BUILDERS) - set(TOLERANCES) == {"matmul_1024"}  # run by its own test below


def test_minilm_layer_has_seven_programs():
    assert list(build_minilm_layer()) == ["qkv_proj", "attention", "out_proj", "ln1", "ffn_up", "ffn_down", "ln2"]


# 9,615 Python calls when written (about 75 per instruction); a loop over the 2^20 output elements or
# the 2^30 multiply-adds would be millions.
CALL_BUDGET_MATMUL_1024 = 30_000
DMA_1024 = 96  # 3 per core on 32 cores: the two input tiles and the output tile


def test_matmul_1024_runs_right_in_bounded_host_work(card):
    """32 PE instructions over 1024^3: each instruction is one numpy/torch operation on whole tiles, not
    a Python loop over elements (counted calls, not wall time: benchmarks/launch.py times it)."""
    built = build_matmul_1024()
    inputs = built.make_inputs(0)
    allocs = {op.name: card.memory.allocate(op.nbytes) for op in built.program.operands}
    try:
        for op in built.program.operands:
            if op.name in inputs:
                card.memory.write(allocs[op.name].address, operand_layout(op).pack(encode(inputs[op.name], op.device_dtype)))
        addrs = resolve_addresses(built.program, {n: a.address for n, a in allocs.items()})
        execute(card, built.program, addrs)  # warm: scratchpads allocated once per card
        calls, stats = python_calls(execute, card, built.program, addrs)
    finally:
        for a in allocs.values():
            card.memory.free(a)
    assert calls < CALL_BUDGET_MATMUL_1024, f"{calls} Python calls to execute the 1024^3 matmul"
    assert stats.total_instructions == {"dma": DMA_1024, "pe": 32, "vector": 0, "ring": 0, "sync": 0}
    assert stats.total_dma_read_bytes == 32 * (256 * 1024 + 1024 * 128) * 2
    assert stats.total_dma_write_bytes == 1024 * 1024 * 2
    out, _ = run_on_card(card, built.program, inputs)
    torch.testing.assert_close(out["c"], built.reference(inputs)["c"], rtol=1e-2, atol=1e-2)


def test_stats_count_engines_and_bytes(card):
    stats = _check(ALL_BUILDERS["matmul_ksplit"](), card, 1e-2, 1e-2)
    assert stats.instructions[1] == {"dma": 2, "pe": 1, "vector": 0, "ring": 1, "sync": 0}
    assert stats.instructions[0] == {"dma": 3, "pe": 1, "vector": 1, "ring": 1, "sync": 0}
    assert stats.ring_bytes == {c: 64 * 64 * 4 for c in range(1, 32, 2)}
    assert stats.total_dma_write_bytes == 256 * 256 * 2


# ---------------------------------------------------------------------------------------------
# Small programs for op semantics and error paths
# ---------------------------------------------------------------------------------------------
def run_small(card, cores, operands, inputs, check=False):
    """Run a hand-made program; ``check`` also validates it first."""
    prog = Program("t", operands, cores)
    return run_on_card(card, prog, inputs, check=check)


def elementwise_program(op, in_dtypes, out_dtype, shape, scalars=()):
    """One core: load each input of ``shape`` ([n] or [rows, cols]), apply ``op`` (Scalars appended),
    store. In scratchpad each row is padded to whole sticks, so 2-D views are strided."""
    ins_t = [DeviceTensor(f"i{k}", shape, dt) for k, dt in enumerate(in_dtypes)]
    out_t = DeviceTensor("o", shape, out_dtype, access="out")
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    sp = Scratch()
    code, views = [], []

    def padded(t):
        width = t.layout.n_sticks * t.lanes
        buf = sp.alloc(t.dtype, (rows, width))
        return buf, view(buf, shape, (width, 1) if len(shape) == 2 else (1,)), width

    for t in ins_t:
        buf, v, width = padded(t)
        code.append(t.load(buf.offset, 0, rows, 0, width))
        views.append(v)
    obuf, ov, owidth = padded(out_t)
    # The padding lanes of the output sticks are stored too: give them a value first.
    code.append(ew("copy", obuf, 0))
    code.append(Elementwise(op, ov, tuple(views) + tuple(Scalar(s) for s in scalars)))
    code.append(out_t.store(obuf.offset, 0, rows, 0, owidth))
    return {0: code}, [t.operand() for t in ins_t + [out_t]]


def run_elementwise(card, op, inputs, out_dtype=DL, scalars=()):
    dtypes = [_device_dtype(x) for x in inputs]
    cores, operands = elementwise_program(op, dtypes, out_dtype, tuple(inputs[0].shape), scalars)
    out, _ = run_small(card, cores, operands, {f"i{k}": x for k, x in enumerate(inputs)}, check=True)
    return out["o"]


def _device_dtype(x: torch.Tensor) -> str:
    return {torch.float16: DL, torch.float32: "float32", torch.int64: "int64", torch.int32: "int32",
            torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}[x.dtype]


def _dl(x: torch.Tensor) -> torch.Tensor:
    """fp32 values as the card holds them."""
    return torch.from_numpy(round_float32(x.float().numpy()))


TORCH_UNARY = {
    "copy": lambda x: x, "cast": lambda x: x, "neg": torch.neg, "abs": torch.abs, "relu": torch.relu,
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "sign": torch.sign,
    "logical_not": torch.logical_not, "square": torch.square, "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"), "silu": torch.nn.functional.silu,
    "acos": torch.acos, "asin": torch.asin, "atan": torch.atan,
    "sinh": torch.sinh, "cosh": torch.cosh, "tan": torch.tan, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erfc": torch.special.erfc, "signbit": torch.signbit,
}
TORCH_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "minimum": torch.minimum, "pow": torch.pow, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "eq": torch.eq, "ne": torch.ne, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "remainder": torch.remainder, "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "atan2": torch.atan2, "fmod": torch.fmod, "copysign": torch.copysign, "hypot": torch.hypot,
}
TORCH_TERNARY = {"where": lambda c, a, b: torch.where(c, a, b), "fma": lambda a, b, c: a * b + c}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt", "pow"}  # first input kept positive
NONZERO_DIVISOR = {"div", "remainder", "floordiv"}


def test_every_op_has_a_reference():
    assert set(TORCH_UNARY) == UNARY_OPS and set(TORCH_BINARY) == BINARY_OPS and set(TORCH_TERNARY) == TERNARY_OPS


def _values(raw, shape, positive=False, nonzero=False):
    # Multiples of 1/16 in [-8, 8): exact in fp16 and DLFloat16, so only the op and its rounding differ.
    n = int(np.prod(shape))
    v = torch.from_numpy(np.resize(np.asarray(raw, dtype=np.float32), n).reshape(shape)) / 16
    if positive:
        v = v.abs() + 0.25
    if nonzero:
        v = torch.where(v.abs() < 0.25, torch.full_like(v, 0.5), v)
    return v.half()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    op=st.sampled_from(sorted(UNARY_OPS | BINARY_OPS | TERNARY_OPS)),
    shape=st.one_of(st.tuples(st.integers(1, 300)), st.tuples(st.integers(1, 5), st.integers(1, 150))),
    raw=st.lists(st.integers(-128, 127), min_size=3, max_size=300),
)
def test_elementwise_matches_torch(card, op, shape, raw):
    """Every elementwise op, on random 1-D and 2-D shapes (rows padded to sticks: strided views)."""
    parts = [raw[k::3] or [1] for k in range(3)]
    if op in UNARY_OPS:
        inputs = [_values(parts[0], shape, positive=op in POSITIVE_ONLY)]
        fn = TORCH_UNARY[op]
    elif op in BINARY_OPS:
        inputs = [_values(parts[0], shape, positive=op in POSITIVE_ONLY),
                  _values(parts[1], shape, nonzero=op in NONZERO_DIVISOR)]
        if op == "pow":
            inputs[1] = (inputs[1].float() / 4).half()  # moderate exponents
        fn = TORCH_BINARY[op]
    else:
        inputs = [_values(p, shape) for p in parts]
        if op == "where":
            inputs[0] = inputs[0] > 0
        fn = TORCH_TERNARY[op]
    got = run_elementwise(card, op, inputs)
    expected = _dl(fn(*[x if x.dtype == torch.bool else x.float() for x in inputs]).float())
    torch.testing.assert_close(got, expected, rtol=4e-3, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize(
    "op, a, b, expected",
    [
        ("remainder", [-7, 7, -7, 7], [3, 3, -3, -3], [2, 1, -1, -2]),  # sign of the divisor, like Python
        ("floordiv", [-7, 7, -7, 7], [3, 3, -3, -3], [-3, 2, 2, -3]),
        ("add", [1, 2**40, -5, 0], [2, 1, 5, 0], [3, 2**40 + 1, 0, 0]),  # int64 math, exact
        ("lt", [1, 2, 3, 4], [2, 2, 2, 2], [1, 0, 0, 0]),
        ("maximum", [1, -2, 3, -4], [0, 0, 0, 0], [1, 0, 3, 0]),
    ],
)
def test_integer_ops_compute_in_int64(card, op, a, b, expected):
    got = run_elementwise(card, op, [torch.tensor(a), torch.tensor(b)], out_dtype="int64")
    assert got.tolist() == expected


def test_integer_division_by_zero_is_an_error(card):
    with pytest.raises(ExecutionError, match=r"core 0, instruction 3 .*integer floordiv by zero"):
        run_elementwise(card, "floordiv", [torch.tensor([1, 2]), torch.tensor([1, 0])], out_dtype="int64")


def test_cast_float_to_int_truncates_toward_zero(card):
    x = torch.tensor([-2.5, -1.75, -0.5, 0.5, 1.75, 2.5, 100.25]).half()
    got = run_elementwise(card, "cast", [x], out_dtype="int32")
    assert got.tolist() == x.float().to(torch.int32).tolist()


def test_cast_int_to_dlfloat16_and_bool(card):
    x = torch.tensor([0, 1, -3, 1000, 4097], dtype=torch.int32)
    assert run_elementwise(card, "cast", [x], out_dtype=DL).tolist() == [0, 1, -3, 1000, 4096]  # 9-bit fraction
    assert run_elementwise(card, "cast", [x], out_dtype="bool").tolist() == [False, True, True, True, True]


def test_comparisons_give_zero_or_one(card):
    a, b = torch.tensor([1.0, 2.0, 3.0]).half(), torch.tensor([2.0, 2.0, 2.0]).half()
    assert run_elementwise(card, "ge", [a, b], out_dtype="uint8").tolist() == [0, 1, 1]
    assert run_elementwise(card, "ne", [a, b], out_dtype="bool").tolist() == [True, False, True]


def test_where_and_fma(card):
    cond = torch.tensor([True, False, True, False])
    a, b = torch.tensor([1.0, 2.0, 3.0, 4.0]).half(), torch.tensor([-1.0, -2.0, -3.0, -4.0]).half()
    assert run_elementwise(card, "where", [cond, a, b]).tolist() == [1.0, -2.0, 3.0, -4.0]
    c = torch.tensor([0.5, 0.5, 0.5, 0.5]).half()
    assert run_elementwise(card, "fma", [a, b, c]).tolist() == [-0.5, -3.5, -8.5, -15.5]


def test_scalar_inputs_int_keeps_integer_float_promotes(card):
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert run_elementwise(card, "mul", [x], out_dtype="int32", scalars=(2,)).tolist() == [2, 4, 6]
    assert run_elementwise(card, "mul", [x], out_dtype=DL, scalars=(0.5,)).tolist() == [0.5, 1.0, 1.5]


def test_results_round_ties_away_from_zero(card):
    # 1 + 2^-10 is halfway between two DLFloat16 values (9 fraction bits): it rounds up.
    x = torch.tensor([1.0, -1.0], dtype=torch.float32)
    got = run_elementwise(card, "add", [x], scalars=(2.0**-10,))
    assert got.tolist() == [1 + 2.0**-9, -(1 - 2.0**-10)]  # -(1 - 2^-10) is exact: finer steps below 1


# ---------------------------------------------------------------------------------------------
# Reduce, matmul, gather
# ---------------------------------------------------------------------------------------------
def _matrix_program(rows, cols, body, out_shape, out_dtype="float32"):
    """Load x [rows, cols] (fp32, one stick row = 32 lanes), run ``body(xs, sp)`` -> (code, out tensor), store."""
    x = DeviceTensor("x", (rows, cols), "float32")
    o = DeviceTensor("o", out_shape, out_dtype, access="out")
    sp = Scratch()
    xs = sp.alloc("float32", (rows, cols))
    code, out = body(xs, sp)
    orows = out_shape[0] if len(out_shape) == 2 else 1
    ocols = out_shape[-1]
    return {0: [x.load(xs.offset, 0, rows, 0, cols), *code, o.store(out.offset, 0, orows, 0, ocols)]}, [x.operand(), o.operand()]


@pytest.mark.parametrize("op, fn", [("sum", torch.sum), ("max", torch.amax), ("min", torch.amin), ("prod", torch.prod)])
def test_reduce_ops_and_accumulate(card, op, fn):
    x = (torch.randn(32, 64, generator=torch.Generator().manual_seed(1)) / 4 + 1).float()

    def body(xs, sp):
        part = sp.alloc("float32", (1, 64))
        lo, hi = view(xs, (16, 64), (64, 1)), view(xs, (16, 64), (64, 1), 16 * 64)
        return [Reduce(op, part, lo, axis=0), Reduce(op, part, hi, axis=0, accumulate=True)], part

    cores, operands = _matrix_program(32, 64, body, (64,))
    out, _ = run_small(card, cores, operands, {"x": x}, check=True)
    torch.testing.assert_close(out["o"], fn(x, 0) if op in ("sum", "prod") else fn(x, dim=0), rtol=1e-5, atol=1e-5)


def test_matmul_with_transposed_view_and_accumulate(card):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))

    def body(xs, sp):
        out = sp.alloc("float32", (32, 32))
        a = view(xs, (32, 32), (64, 1))  # x[:, :32]
        bt = view(xs, (32, 32), (1, 64), 32)  # x[:, 32:]^T
        return [MatMul(out, a, bt), MatMul(out, a, bt, accumulate=True)], out

    cores, operands = _matrix_program(32, 64, body, (32, 32))
    out, _ = run_small(card, cores, operands, {"x": x}, check=True)
    torch.testing.assert_close(out["o"], 2 * x[:, :32] @ x[:, 32:].T, rtol=1e-5, atol=1e-4)


def gather_program(index_values):
    table = DeviceTensor("table", (100, 64))
    idx = DeviceTensor("idx", (16,), "int64")
    out = DeviceTensor("o", (16, 64), access="out")
    sp = Scratch()
    ib, rows = sp.alloc("int64", (16,)), sp.alloc(DL, (16, 64))
    code = [
        idx.load(ib.offset, 0, 1, 0, 16),
        # table [100, 64] sticked on its last dim: row r is stick r, 128 bytes apart.
        DmaGather(Addr("table", 0), ib, row_stride=STICK_BYTES, row_sticks=1, sp_offset=rows.offset, num_rows=100),
        out.store(rows.offset, 0, 16, 0, 64),
    ]
    return {0: code}, [table.operand(), idx.operand(), out.operand()]


def test_gather_picks_rows(card):
    table = (torch.arange(100 * 64) % 997).reshape(100, 64).half()
    idx = torch.tensor([5, 0, 99, 5, 42, 7, 1, 2, 3, 4, 60, 61, 62, 63, 98, 10])
    cores, operands = gather_program(idx)
    out, stats = run_small(card, cores, operands, {"table": table, "idx": idx}, check=True)
    torch.testing.assert_close(out["o"], _dl(table[idx]))
    assert stats.dma_read_bytes[0] == 128 + 16 * 128


def test_gather_index_out_of_range(card):
    idx = torch.tensor([5, 0, 100] + [0] * 13)
    cores, operands = gather_program(idx)
    with pytest.raises(ExecutionError, match=r"core 0, instruction 1 \(dma_gather.*gather index 100 at position 2 "
                                             r"is outside \[0, 100\)"):
        run_small(card, cores, operands, {"table": torch.zeros(100, 64).half(), "idx": idx}, check=True)


# ---------------------------------------------------------------------------------------------
# Runtime checks
# ---------------------------------------------------------------------------------------------
X = DeviceTensor("x", (8, 64))
Y = DeviceTensor("y", (8, 64), access="out")
T = DeviceTensor("tmp", (8, 64), access="inout")
ROWS = SpTensor(0, DL, (8, 64))
ROWS2 = SpTensor(8 * 128, DL, (8, 64))
ONES = torch.ones(8, 64).half()


def test_read_of_unwritten_scratchpad(card):
    cores = {0: [ew("exp", ROWS2, ROWS), Y.store(ROWS2.offset, 0, 8, 0, 64)]}
    with pytest.raises(ExecutionError, match=r"core 0, instruction 0 \(exp .*reads scratchpad byte 0 .*nothing wrote"):
        run_small(card, cores, [Y.operand()], {}, check=True)


def test_scratchpad_starts_unwritten_on_every_execution(card):
    good = {0: [X.load(0, 0, 8, 0, 64), Y.store(0, 0, 8, 0, 64)]}
    run_small(card, good, [X.operand(), Y.operand()], {"x": ONES})
    bad = {0: [Y.store(0, 0, 8, 0, 64)]}  # the bytes hold the last execution's data, but not this one's
    with pytest.raises(ExecutionError, match=r"core 0, instruction 0 \(dma_store.*nothing wrote"):
        run_small(card, bad, [Y.operand()], {})


def test_out_of_scratchpad_access_at_execution(card):
    limit = card.config.scratchpad_plannable_bytes
    cores = {0: [X.load(0, 0, 8, 0, 64), ew("exp", SpTensor(limit - 128, DL, (8, 64)), ROWS)]}
    with pytest.raises(ExecutionError, match=rf"core 0, instruction 1 \(exp.*outside the plannable scratchpad "
                                             rf"\[0, {limit}\): the plan needs {limit + 896} bytes"):
        run_small(card, cores, [X.operand(), Y.operand()], {"x": ONES})


def test_dma_outside_any_allocation(card):
    prog = Program("t", [X.operand()], {0: [X.load(0, 0, 8, 0, 64)]})
    with pytest.raises(ExecutionError, match=r"core 0, instruction 0 \(dma_load.*not inside any live allocation"):
        execute(card, prog, resolve_addresses(prog, {"x": 0x7_0000_0000}))


def test_dma_running_past_its_allocation(card):
    small = card.memory.allocate(4 * 128)
    try:
        prog = Program("t", [X.operand()], {0: [X.load(0, 0, 8, 0, 64)]})
        with pytest.raises(ExecutionError, match=r"core 0, instruction 0 .*runs past the end of its allocation"):
            execute(card, prog, resolve_addresses(prog, {"x": small.address}))
    finally:
        card.memory.free(small)


def _two_core_handoff(sync_before, sync_after):
    """Core 0 writes tmp, core 1 reads it back; ``sync_*`` are the instructions that order them."""
    return {
        0: [X.load(0, 0, 8, 0, 64), T.store(0, 0, 8, 0, 64), *sync_before],
        1: [*sync_after, T.load(0, 0, 8, 0, 64), Y.store(0, 0, 8, 0, 64)],
    }


def test_race_on_device_memory_names_both_instructions(card):
    cores = _two_core_handoff([], [])
    with pytest.raises(ExecutionError, match=r"core 0, instruction 1 \(dma_store.*data race on device memory: this "
                                             r"instruction writes and core 1, instruction 0 \(dma_load.*reads the same "
                                             r"8 stick\(s\).*of operand %tmp"):
        run_small(card, cores, [X.operand(), T.operand(), Y.operand()], {"x": ONES}, check=True)


@pytest.mark.parametrize(
    "before, after",
    [
        ([Signal(1, tag=3)], [Wait(0, tag=3)]),
        ([Barrier(9)], [Barrier(9)]),
        ([RingSend(1, 0, 4096, 128, tag=1)], [RingRecv(0, tag=1)]),
    ],
    ids=["signal-wait", "barrier", "ring"],
)
def test_synchronization_orders_device_accesses(card, before, after):
    cores = _two_core_handoff(before, after)
    out, _ = run_small(card, cores, [X.operand(), T.operand(), Y.operand()], {"x": ONES}, check=True)
    assert torch.equal(out["y"], ONES.float())


def test_two_cores_writing_one_stick_race(card):
    cores = {c: [X.load(0, 0, 8, 0, 64), Y.store(0, 0, 8, 0, 64)] for c in (0, 1)}
    with pytest.raises(ExecutionError, match=r"core 0, instruction 1 .*data race.*writes and core 1, instruction 1 .*writes"):
        run_small(card, cores, [X.operand(), Y.operand()], {"x": ONES}, check=True)


def test_cores_reading_shared_input_is_no_race(card):
    cores = {c: [X.load(0, 0, 8, 0, 64), Y.store(0, c * 4, 4, 0, 64)] for c in (0, 1)}
    out, _ = run_small(card, cores, [X.operand(), Y.operand()], {"x": ONES}, check=True)
    assert torch.equal(out["y"], ONES.float())


def test_deadlock_names_blocked_cores(card):
    cores = {0: [Wait(1, tag=0), Signal(1, tag=0)], 1: [Wait(0, tag=0), Signal(0, tag=0)]}
    with pytest.raises(ExecutionError, match=r"core 0, instruction 0 \(wait.*deadlock: .*core 0 at instruction 0 "
                                             r"\(waits for a signal from core 1 tag 0\); core 1 at instruction 0 "
                                             r"\(waits for a signal from core 0 tag 0\)"):
        run_small(card, cores, [], {}, check=True)


def test_deadlock_at_barrier_after_partner_finished(card):
    cores = {0: [Barrier(1, cores=(0, 1))], 1: [RingRecv(0, tag=0)]}
    prog = Program("t", [], cores)
    with pytest.raises(ExecutionError, match=r"deadlock: .*waits at barrier tag 1 .*waits for ring data from core 0"):
        execute(card, prog, resolve_addresses(prog, {}))


def test_ring_data_is_not_readable_before_ring_recv(card):
    cores = {
        0: [X.load(0, 0, 8, 0, 64), RingSend(1, 0, 0, 1024, tag=2)],
        1: [ew("exp", ROWS2, ROWS), RingRecv(0, tag=2), Y.store(ROWS2.offset, 0, 8, 0, 64)],
    }
    with pytest.raises(ExecutionError, match=r"core 1, instruction 0 \(exp.*scratchpad race on core 1: input 0 reads "
                                             r"scratchpad byte 0 \(0x0\), which core 0's ring_send \(instruction 1\) "
                                             r"is writing .* If this reads that transfer, ring_recv it first"):
        run_small(card, cores, [X.operand(), Y.operand()], {"x": ONES}, check=True)


def test_ring_receiver_writing_in_flight_bytes(card):
    cores = {
        0: [X.load(0, 0, 8, 0, 64), RingSend(1, 0, 0, 1024, tag=2)],
        1: [X.load(0, 0, 8, 0, 64), RingRecv(0, tag=2), Y.store(0, 0, 8, 0, 64)],
    }
    with pytest.raises(ExecutionError, match=r"core 1, instruction 1 \(ring_recv.*wrote scratchpad bytes \[0, 1024\) "
                                             r"while core 0's ring_send \(instruction 1\) was in flight"):
        run_small(card, cores, [X.operand(), Y.operand()], {"x": ONES}, check=True)


def test_ring_send_overwriting_a_buffer_still_in_use(card):
    # Core 1 signals too early: it still reads the buffer after telling core 0 to go ahead.
    cores = {
        0: [X.load(0, 0, 8, 0, 64), Wait(1, tag=5), RingSend(1, 0, 0, 1024, tag=2)],
        1: [X.load(0, 0, 8, 0, 64), Signal(0, tag=5), ew("exp", ROWS2, ROWS), RingRecv(0, tag=2),
            Y.store(0, 0, 8, 0, 64)],
    }
    with pytest.raises(ExecutionError, match=r"core 0, instruction 2 \(ring_send.*scratchpad race on core 1: .*"
                                             r"core 1's instruction 2 \(exp .*\), which uses bytes \[0, 1024\)"):
        run_small(card, cores, [X.operand(), Y.operand()], {"x": ONES}, check=True)


def test_ring_send_after_receiver_released_buffer(card):
    cores = {
        0: [X.load(0, 0, 8, 0, 64), Wait(1, tag=5), RingSend(1, 0, 0, 1024, tag=2)],
        1: [X.load(0, 0, 8, 0, 64), ew("exp", ROWS2, ROWS), Signal(0, tag=5), RingRecv(0, tag=2),
            ew("add", ROWS, ROWS, ROWS2), Y.store(0, 0, 8, 0, 64)],
    }
    out, stats = run_small(card, cores, [X.operand(), Y.operand()], {"x": ONES}, check=True)
    torch.testing.assert_close(out["y"], torch.full((8, 64), 1 + math.e), rtol=2e-3, atol=0)
    assert stats.ring_bytes == {0: 1024}


def test_unreceived_ring_data_without_validation(card):
    prog = Program("t", [X.operand()], {0: [X.load(0, 0, 8, 0, 64), RingSend(1, 0, 0, 128, tag=0)], 1: []})
    alloc = card.memory.allocate(X.layout.nbytes)
    try:
        with pytest.raises(ExecutionError, match=r"core 0, instruction 1 .*never received"):
            execute(card, prog, resolve_addresses(prog, {"x": alloc.address}))
    finally:
        card.memory.free(alloc)


def test_barrier_across_all_cores(card):
    # Each core writes its half of tmp, then (after the barrier) copies the other core's half to y.
    cores = {
        c: [X.load(0, c * 4, 4, 0, 64), T.store(0, c * 4, 4, 0, 64), Barrier(0),
            T.load(0, (1 - c) * 4, 4, 0, 64), Y.store(0, (1 - c) * 4, 4, 0, 64)]
        for c in (0, 1)
    }
    x = torch.arange(8 * 64).reshape(8, 64).half()
    out, stats = run_small(card, cores, [X.operand(), T.operand(), Y.operand()], {"x": x}, check=True)
    assert torch.equal(out["y"], _dl(x))
    assert stats.instructions[0]["sync"] == 1


def test_execute_refuses_short_address_table(card):
    prog = Program("t", [X.operand()], {0: [X.load(0, 0, 8, 0, 64)]})
    with pytest.raises(ExecutionError, match=r"dma_addresses\[0\] has 0 entries but core 0 has 1 instructions"):
        execute(card, prog, {0: np.zeros(0, dtype=np.int64)})


def test_execution_error_is_a_program_error():
    assert issubclass(ExecutionError, ProgramError)


def test_dma_pattern_moves_strided_sticks(card):
    # Load every other stick of x's rows in reverse order: negative DRAM strides work too.
    x = torch.arange(8 * 64).reshape(8, 64).half()
    pat = DmaPattern((4,), (-2 * 128,), (128,))
    cores = {0: [DmaLoad(Addr("x", 6 * 128), 0, pat), Y.store(0, 0, 4, 0, 64),
                 DmaLoad(Addr("x", 7 * 128), 512, pat), Y.store(512, 4, 4, 0, 64)]}
    out, _ = run_small(card, cores, [X.operand(), Y.operand()], {"x": x}, check=True)
    assert torch.equal(out["y"], _dl(x[[6, 4, 2, 0, 7, 5, 3, 1]]))



def test_overflow_gives_the_nan_inf_code(card):
    # exp(30) ~ 1.1e13 is beyond DLFloat16's largest finite value (~8.6e9): the NaN/Inf code, read back as NaN.
    got = run_elementwise(card, "exp", [torch.tensor([30.0, 1.0]).half()])
    assert math.isnan(got[0]) and got[1] == _dl(torch.tensor([math.e]))[0]


def test_copy_moves_bits(card):
    x = torch.tensor([2**62 + 1, -(2**62) - 3, 7])
    assert run_elementwise(card, "copy", [x], out_dtype="int64").tolist() == x.tolist()


@pytest.mark.parametrize("fuse, reads, writes", [(True, 4, 2), (False, 5, 3)], ids=["4-kernels", "5-kernels"])
def test_softmax_roundtrip_traffic(card, fuse, reads, writes):
    # IBM gives 8MN + 4N fp16 elements of device traffic for the unfused round trip (5 kernels).
    from benchmarks.programs import build_softmax_roundtrip

    stats = _check(build_softmax_roundtrip(fuse_sub_exp=fuse), card, 1e-2, 1e-3)
    mn, n = 512 * 1024 * 2, 512 * 2
    assert (stats.total_dma_read_bytes, stats.total_dma_write_bytes) == (reads * mn + 2 * n, writes * mn + 2 * n)

"""The fast executor gives bit for bit what the checked executor gives, and runs only proved programs.

Each comparison runs a program checked and fast from the same device memory and compares every operand
byte: the hand-written programs (benchmarks/programs.py), hypothesis-generated multi-core programs with
ring transfers, signals and barriers. Every program the compile tests make is compared too: their helper
checks a compiled graph's second call (fast) against its first (checked), bit for bit
(tests/compiler/spyre_compile_helpers.py), and the eager zoo runs with TORCH_SPYRE_CHECK=compare.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.programs import ALL_BUILDERS, encode, operand_layout
from torch_spyre.card import Card
from torch_spyre.card.config import load_config
from torch_spyre.card.execute import (
    CHECK_ENV,
    ExecutionError,
    FastExecutionMismatch,
    FastPlan,
    execute,
    resolve_addresses,
)
from torch_spyre.card.execute import fast
from torch_spyre.card.execute.proof import overlap_signature
from torch_spyre.card.execute.schedule import lockstep_rounds
from torch_spyre.card.validate import validate
from torch_spyre.errors import SpyreError
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
    Reduce,
    RingRecv,
    RingSend,
    Scalar,
    Signal,
    SpTensor,
    Wait,
)
from torch_spyre.runtime.launch import launch, prepare


@pytest.fixture(scope="module")
def card() -> Card:
    return Card(0, load_config(environ={}))


def both_ways(card: Card, program: Program, data: dict[str, np.ndarray], plan: FastPlan | None = None,
              poison: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run ``program`` checked, then fast (on ``plan``, or a new one) from the same memory: per operand,
    (checked bytes, fast bytes). ``poison``: the scratchpads are filled with other bytes in between (a
    fast step that reads bytes the fast plan did not write, e.g. a wrongly dropped load, reads those)."""
    validate(program, card.config)
    allocs = {op.name: card.memory.allocate(op.nbytes) for op in program.operands}
    try:
        def load_inputs():
            for op in program.operands:
                card.memory.write(allocs[op.name].address, data.get(op.name, np.zeros(op.nbytes, np.uint8)))

        addresses = resolve_addresses(program, {n: a.address for n, a in allocs.items()})
        load_inputs()
        execute(card, program, addresses)
        checked = {n: a.buffer[: op.nbytes].copy() for (n, a), op in zip(allocs.items(), program.operands)}
        load_inputs()
        plan = plan or FastPlan(program, card)
        if poison:
            plan.pads.block[:, : 256 * 1024] = 0x7F  # DLFloat16 and fp32 bits of large finite values
        plan.run(card.memory, addresses)
        return {n: (checked[n], a.buffer[: op.nbytes].copy()) for (n, a), op in zip(allocs.items(), program.operands)}
    finally:
        for a in allocs.values():
            card.memory.free(a)


def assert_identical(results: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    for name, (checked, fast) in results.items():
        if not np.array_equal(checked, fast):
            at = int(np.flatnonzero(checked != fast)[0])
            raise AssertionError(f"operand %{name} differs first at byte {at}: checked {checked[at]}, fast {fast[at]}")


@pytest.mark.parametrize("name", sorted(ALL_BUILDERS))
def test_hand_written_programs_fast_equals_checked(card, name):
    built = ALL_BUILDERS[name]()
    inputs = built.make_inputs(0)
    data = {}
    for op in built.program.operands:
        if op.name in inputs:
            data[op.name] = np.frombuffer(operand_layout(op).pack(encode(inputs[op.name], op.device_dtype)).tobytes(), np.uint8)
    assert_identical(both_ways(card, built.program, data))


def test_spmd_program_runs_as_one_step_per_instruction(card):
    """32 cores running alike instructions on their own rows: one array operation per instruction,
    not one per core."""
    built = ALL_BUILDERS["elementwise"]()
    per_core = {len(v) for v in built.program.cores.values()}
    plan = FastPlan(built.program, card)
    assert len(built.program.cores) == 32 and len(per_core) == 1
    assert len(plan.steps) == per_core.pop()


def test_a_decoded_tile_is_shared_until_something_rewrites_its_bytes(card):
    """Core 0 reads tile A (2 sticks of DLFloat16) twice, then A is rewritten by a DMA load, by core 1's
    ring send into its second stick, by a gather, and by an elementwise op writing one of its sticks;
    each rewrite makes the next read decode A again (and the results stay the checked executor's)."""
    p2, p1 = DmaPattern.contiguous(2), DmaPattern.contiguous(1)
    t = lambda off, rows=2: SpTensor(off, "dlfloat16", (rows, 64), (64, 1))  # noqa: E731
    A, B = t(0), t(1024)
    idx = SpTensor(4096, "int32", (2,))
    outs = [t(2048 + 256 * k) for k in range(5)]
    core0 = [DmaLoad(Addr("x", 0), 0, p2), DmaLoad(Addr("i", 0), 4096, p1),
             Elementwise("exp", outs[0], (A,)), Elementwise("neg", outs[1], (A,)),   # one decode of A
             DmaLoad(Addr("x", 256), 0, p2), Elementwise("add", outs[2], (A, outs[1])),  # rewritten: decode
             Signal(1, tag=2), RingRecv(1, tag=1), Elementwise("mul", outs[3], (A, A)),                  # ring wrote stick 1
             DmaGather(Addr("x", 0), idx, 128, 1, 0, 6), Elementwise("sub", outs[4], (A, outs[3])),
             Elementwise("copy", t(128, 1), (t(2048, 1),)), Elementwise("add", B, (A, outs[4])),
             *[DmaStore(Addr("y", 256 * k), o.offset, p2) for k, o in enumerate(outs)],
             DmaStore(Addr("y", 1280), B.offset, p2)]
    core1 = [DmaLoad(Addr("x", 512), 0, p1), Wait(0, tag=2), RingSend(0, 0, 128, 128, tag=1)]
    program = Program("rewrites", [Operand("x", 768), Operand("i", 128), Operand("y", 1536, access="out")],
                      {0: core0, 1: core1})
    plan = FastPlan(program, card)
    # A: exp+neg share one decode; after the DMA load; after the ring send (mul reads it twice: once);
    # after the gather; after the copy into its second stick. outs[1], outs[3], outs[4] once each.
    assert plan.tile_decodes == 5 + 3
    x = _random_bytes(768, "dlfloat16", 3)
    i = np.zeros(128, np.uint8)
    i[:8] = np.array([4, 1], np.int32).view(np.uint8)
    assert_identical(both_ways(card, program, {"x": x, "i": i}))


def _replicated_a_program(cores: int = 4) -> Program:
    """Each core loads its own copy of an A tile (8x64 DLFloat16, from %a) and its own B tile (64x64,
    from %b), computes A @ B and A + A, and stores both: alike instructions, one step per instruction
    over the cores. Whether the cores' A tiles hold the same bits is up to the data."""
    a_bytes, b_bytes = 8 * 128, 64 * 128
    A = SpTensor(0, "dlfloat16", (8, 64), (64, 1))
    B = SpTensor(a_bytes, "dlfloat16", (64, 64), (64, 1))
    mm = SpTensor(a_bytes + b_bytes, "float32", (8, 64), (64, 1))
    twice = SpTensor(mm.offset + 2048, "dlfloat16", (8, 64), (64, 1))
    prog = {c: [DmaLoad(Addr("a", c * a_bytes), A.offset, DmaPattern.contiguous(8)),
                DmaLoad(Addr("b", c * b_bytes), B.offset, DmaPattern.contiguous(64)),
                MatMul(mm, A, B), Elementwise("add", twice, (A, A)),
                DmaStore(Addr("y", c * 3072), mm.offset, DmaPattern.contiguous(24))] for c in range(cores)}
    return Program("replicated_a", [Operand("a", cores * a_bytes), Operand("b", cores * b_bytes),
                                    Operand("y", cores * 3072, access="out")], prog)


def test_cores_holding_the_same_tile_decode_it_once(card, monkeypatch):
    """Four cores' A tiles hold the same bits: the batched read decodes one core's tile (a quarter of
    the elements) and broadcasts it; with one element of one core's copy changed, every core's tile is
    decoded, and once a tile was seen to differ the plan stops comparing it. Every run's bytes are the
    checked executor's."""
    monkeypatch.setattr(fast, "SAME_BITS_MIN_ELEMENTS", 0)  # these tiles are small
    program, cores = _replicated_a_program(), 4
    plan = FastPlan(program, card)
    assert len(plan.steps) == 5 and plan.tile_decodes == 2  # A (read twice by the add: once), B
    tile = _random_bytes(1024, "dlfloat16", 5)
    same = np.tile(tile, cores)
    b = _random_bytes(cores * 8192, "dlfloat16", 6)
    a_elems, b_elems = 8 * 64, cores * 64 * 64

    assert_identical(both_ways(card, program, {"a": same, "b": b}, plan))
    assert (plan.replicated_reads, plan.decoded_elements) == (1, a_elems + b_elems)

    differs = same.copy()
    differs[2 * 1024 + 2 * 128 + 6] ^= 0x01  # core 2, row 2, element 3: its low mantissa bit
    results = both_ways(card, program, {"a": differs, "b": b}, plan)
    assert_identical(results)
    assert (plan.replicated_reads, plan.decoded_elements) == (1, 2 * (a_elems + b_elems) + 3 * a_elems)
    checked = results["y"][0].reshape(cores, 3072)
    assert not np.array_equal(checked[2], checked[1])  # the changed element reached the result

    assert_identical(both_ways(card, program, {"a": same, "b": b}, plan))
    assert plan.replicated_reads == 1  # not compared again: every core's tile decoded
    assert plan.decoded_elements == 3 * (a_elems + b_elems) + 6 * a_elems


def _reused_until_it_differs(card, program, plan, same, differs, first: int, later: int) -> None:
    """Runs ``plan`` on %a = ``same`` (one tile's values reused, ``first`` elements decoded), ``differs``
    (the reuse refused: ``later`` elements decoded), then ``same`` again (``later`` again: once a read
    was seen to differ it is not compared again), each run's bytes the checked executor's."""
    decoded = 0
    for data, more in ((same, first), (differs, later), (same, later)):
        assert_identical(both_ways(card, program, {"a": data}, plan))
        decoded += more
        assert (plan.reused_tiles, plan.decoded_elements) == (1, decoded)


def _second_core_reads_later(name: str, core0_reloads: bool = False) -> Program:
    """Core 0 loads %a[0:1024] into A and computes exp(A) (then, ``core0_reloads``, loads %a[1024:2048]
    over A) before signalling core 1, which has loaded its own %a[1024:2048] into A, waits, and computes
    neg(A); each stores its result to its half of %y."""
    A = SpTensor(0, "dlfloat16", (8, 64), (64, 1))
    out = SpTensor(1024, "dlfloat16", (8, 64), (64, 1))
    reload = [DmaLoad(Addr("a", 1024), 0, DmaPattern.contiguous(8))] if core0_reloads else []
    return Program(name, [Operand("a", 2048), Operand("y", 2048, access="out")], {
        0: [DmaLoad(Addr("a", 0), 0, DmaPattern.contiguous(8)), Elementwise("exp", out, (A,)), *reload,
            Signal(1, tag=1), DmaStore(Addr("y", 0), out.offset, DmaPattern.contiguous(8))],
        1: [DmaLoad(Addr("a", 1024), 0, DmaPattern.contiguous(8)), Wait(0, tag=1), Elementwise("neg", out, (A,)),
            DmaStore(Addr("y", 1024), out.offset, DmaPattern.contiguous(8))]})


def test_a_tile_holding_bits_decoded_earlier_takes_their_values(card, monkeypatch):
    """Core 1 reads its copy of A two rounds after core 0 decoded its own (core 1 waits for core 0's
    signal): equal bits take core 0's values, one element changed in core 1's copy decodes it, and once
    a read was seen to differ the plan stops comparing it. Every run's bytes are the checked executor's."""
    monkeypatch.setattr(fast, "SAME_BITS_MIN_ELEMENTS", 0)  # these tiles are small
    program = _second_core_reads_later("same_bits")
    plan = FastPlan(program, card)
    assert plan.tile_decodes == 2
    same = np.tile(_random_bytes(1024, "dlfloat16", 8), 2)
    differs = same.copy()
    differs[1024 + 1000] ^= 0x04  # core 1's copy, one element's mantissa

    _reused_until_it_differs(card, program, plan, same, differs, first=512, later=1024)


def test_a_tile_rewritten_since_it_was_decoded_is_not_taken(card, monkeypatch):
    """Core 0 decodes X, then loads Y over it; core 1 reads its own copy of Y afterwards. Core 0's
    bytes now equal core 1's, but its decoded values are X's: they are not a candidate."""
    monkeypatch.setattr(fast, "SAME_BITS_MIN_ELEMENTS", 0)  # these tiles are small
    program = _second_core_reads_later("rewritten", core0_reloads=True)
    plan = FastPlan(program, card)
    assert_identical(both_ways(card, program, {"a": _random_bytes(2048, "dlfloat16", 9)}, plan))
    assert (plan.reused_tiles, plan.decoded_elements) == (0, 1024)


def test_a_buffer_loaded_again_with_bits_it_held_before_takes_their_values(card, monkeypatch):
    """Core 0 loads X, Y, then X again into one buffer, reading it after each load: the third read
    takes the first's values (kept with a copy of its raw bits); with one element of the third load
    changed it is decoded, and once it was seen to differ the plan stops comparing it."""
    monkeypatch.setattr(fast, "SAME_BITS_MIN_ELEMENTS", 0)  # these tiles are small
    A = SpTensor(0, "dlfloat16", (8, 64), (64, 1))
    outs = [SpTensor(1024 * (k + 1), "dlfloat16", (8, 64), (64, 1)) for k in range(3)]
    core0 = []
    for k, op in enumerate(["exp", "neg", "abs"]):
        core0 += [DmaLoad(Addr("a", 1024 * k), 0, DmaPattern.contiguous(8)), Elementwise(op, outs[k], (A,))]
    program = Program("turns", [Operand("a", 3072), Operand("y", 3072, access="out")],
                      {0: [*core0, DmaStore(Addr("y", 0), 1024, DmaPattern.contiguous(24))]})
    plan = FastPlan(program, card)
    assert plan.tile_decodes == 3
    x, y = _random_bytes(1024, "dlfloat16", 10), _random_bytes(1024, "dlfloat16", 11)
    again = np.concatenate([x, y, x])
    changed = again.copy()
    changed[2048 + 700] ^= 0x02

    _reused_until_it_differs(card, program, plan, again, changed, first=1024, later=1536)


def test_small_tiles_are_decoded_without_comparing(card):
    """Below ``SAME_BITS_MIN_ELEMENTS`` per core the comparisons cost more than they save: not tried."""
    plan = FastPlan(_replicated_a_program(), card)
    same = np.tile(_random_bytes(1024, "dlfloat16", 5), 4)
    assert_identical(both_ways(card, _replicated_a_program(), {"a": same, "b": _random_bytes(4 * 8192, "dlfloat16", 6)}, plan))
    assert (plan.replicated_reads, plan.reused_tiles, plan.decoded_elements) == (0, 0, 4 * 512 + 4 * 4096)


def test_a_batched_matmul_over_a_broadcast_operand_is_one_gemm_per_core():
    """A replicated tile reaches np.matmul as a stride-0 batch: numpy's loop decides BLAS per item from
    the item's own strides (numpy/_core/src/umath/matmul.c.src), so each core's product is the single
    GEMM the checked executor runs, bit for bit."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 384), dtype=np.float32)
    b = rng.standard_normal((8, 384, 64), dtype=np.float32)
    broadcast = np.broadcast_to(a, (8, 64, 384))
    assert broadcast.strides[0] == 0
    result = np.matmul(broadcast, b)
    assert all(np.matmul(a, b[i]).tobytes() == result[i].tobytes() for i in range(8))


# ---------------------------------------------------------------------------------------------
# Hypothesis: random multi-core programs with ring transfers and synchronization
# ---------------------------------------------------------------------------------------------
UNARY = ["exp", "neg", "abs", "relu", "tanh", "sigmoid", "gelu", "silu", "sqrt", "square", "erf", "round"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "lt"]
ROWS, LANES = 4, 64  # one operand row block per core: ROWS x 64 dlfloat16 = ROWS sticks


@st.composite
def programs(draw):
    """Cores 0..n-1 (or every other core) each load their rows of %x, compute a random chain (with
    matmul and reduce), optionally pass a result to the next core over the ring, and store to %y."""
    n = draw(st.integers(1, 6))
    spread = draw(st.sampled_from([1, 2, 5]))
    cores = [c * spread for c in range(n)]
    dtype = draw(st.sampled_from(["dlfloat16", "float32"]))
    lanes = LANES if dtype == "dlfloat16" else 32
    isz = 128 // lanes
    chain = draw(st.lists(st.one_of(st.sampled_from(UNARY), st.sampled_from(BINARY), st.just("matmul"),
                                    st.just("reduce")), min_size=1, max_size=5))
    ring = n > 1 and draw(st.booleans())
    barrier = draw(st.booleans())
    width = draw(st.integers(1, lanes))  # compute on the first `width` lanes: odd sizes, array tails
    shape, strides = (ROWS, width), (lanes, 1)
    nbytes_block = ROWS * 128
    x = Operand("x", n * nbytes_block * 2)
    y = Operand("y", n * nbytes_block, access="out")
    a = SpTensor(0, dtype, shape, strides)
    b = SpTensor(nbytes_block, dtype, shape, strides)
    inbox = SpTensor(4 * nbytes_block, dtype, shape, strides)
    red = SpTensor(6 * nbytes_block, dtype, (ROWS, 1))
    prog = {}
    for k, c in enumerate(cores):
        ins = [DmaLoad(Addr("x", 2 * k * nbytes_block), 0, DmaPattern.contiguous(ROWS)),
               DmaLoad(Addr("x", (2 * k + 1) * nbytes_block), nbytes_block, DmaPattern.contiguous(ROWS))]
        for op in chain:
            if op == "matmul":
                sq = SpTensor(2 * nbytes_block, dtype, (ROWS, ROWS))
                ins.append(MatMul(sq, a, SpTensor(b.offset, dtype, (width, ROWS), (1, lanes))))
                ins.append(MatMul(a, sq, b))
            elif op == "reduce":
                ins.append(Reduce("max", red, a, axis=1))
                ins.append(Elementwise("sub", a, (a, SpTensor(red.offset, dtype, shape, (1, 0)))))
            elif op in UNARY:
                ins.append(Elementwise(op, a, (a,)))
            else:
                ins.append(Elementwise(op, a, (a, b if draw(st.booleans()) else Scalar(0.5))))
        if ring:
            dst, src = cores[(k + 1) % n], cores[(k - 1) % n]
            ins += [RingSend(dst, 0, inbox.offset, nbytes_block, tag=1), RingRecv(src, tag=1),
                    Elementwise("add", a, (a, inbox))]
        if barrier:
            ins.append(Barrier(7, tuple(cores)))
        ins.append(DmaStore(Addr("y", k * nbytes_block), 0, DmaPattern.contiguous(ROWS)))
        if n > 1 and k == 0:
            ins.insert(1, Signal(cores[1], tag=3))
        if n > 1 and k == 1:
            ins.insert(0, Wait(cores[0], tag=3))
        prog[c] = ins
    seed = draw(st.integers(0, 2**16))
    return Program(f"random_{n}_{dtype}", [x, y], prog), seed, dtype, isz


def _random_bytes(nbytes: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(nbytes // 4).astype(np.float32) * 3
    if dtype == "dlfloat16":
        from torch_spyre.card.dlfloat16 import from_float32
        bits = from_float32(rng.standard_normal(nbytes // 2).astype(np.float32) * 3)
        return bits.view(np.uint8)
    return values.view(np.uint8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_fast_equals_checked(card, case):
    program, seed, dtype, _ = case
    x = program.operands[0]
    with pytest.MonkeyPatch.context() as mp:  # these tiles are small: look for the same bits anyway
        mp.setattr(fast, "SAME_BITS_MIN_ELEMENTS", 0)
        assert_identical(both_ways(card, program, {"x": _random_bytes(x.nbytes, dtype, seed)}))


def _stick_runs_program(step_in: int, step_out: int, op: str = "copy", n: int = 8) -> Program:
    """Core 0 loads 16 sticks of fp32 and runs ``n`` alike one-stick instructions whose input and output
    offsets step by ``step_in`` and ``step_out`` bytes (the pointwise generator's box-by-box copies)."""
    t = lambda off: SpTensor(off, "float32", (32,), (1,))  # noqa: E731
    inputs = (lambda k: (t(k * step_in),)) if op == "copy" else (lambda k: (t(k * step_in), Scalar(0.5)))
    body = [Elementwise(op, t(1024 + k * step_out), inputs(k)) for k in range(n)]
    return Program("runs", [Operand("x", 2048), Operand("y", 2048, access="out")], {0: [
        DmaLoad(Addr("x", 0), 0, DmaPattern.contiguous(16)), *body,
        DmaStore(Addr("y", 0), 0, DmaPattern.contiguous(16))]})


@pytest.mark.parametrize("step_in, step_out, op, steps", [
    (128, 128, "copy", 3),   # 8 copies of disjoint sticks: one joined step between the DMAs
    (128, 128, "mul", 3),    # the same with an immediate
    (0, 128, "mul", 3),      # one input stick broadcast to 8 outputs: its step is 0
    (128, 0, "copy", 10),    # every copy writes the same stick: the last one wins, nothing is joined
    (-128, 128, "copy", 10),  # a falling offset is not joined
])
def test_runs_of_alike_vector_instructions_join(card, step_in, step_out, op, steps):
    """Consecutive alike vector instructions of one core run as one step when their offsets step evenly
    and none writes what a later one reads; the bytes stay the checked executor's."""
    if step_in < 0:
        program = _stick_runs_program(128, 128, op)
        body = program.cores[0][1:-1][::-1]  # offsets falling
        program = Program("runs", program.operands, {0: [program.cores[0][0], *body, program.cores[0][-1]]})
    else:
        program = _stick_runs_program(step_in, step_out, op)
    assert len(FastPlan(program, card).steps) == steps
    assert_identical(both_ways(card, program, {"x": _random_bytes(2048, "float32", 3)}))


def test_a_run_that_reads_what_it_wrote_is_not_joined(card):
    """Copy k reads the stick copy k - 1 wrote (a shift by one stick): joined, every copy would read the
    old bytes; the run is cut so that each copy sees its predecessor's result."""
    t = lambda off: SpTensor(off, "float32", (32,), (1,))  # noqa: E731
    body = [Elementwise("copy", t(128 * (k + 1)), (t(128 * k),)) for k in range(6)]
    program = Program("shift", [Operand("x", 2048), Operand("y", 2048, access="out")], {0: [
        DmaLoad(Addr("x", 0), 0, DmaPattern.contiguous(16)), *body, DmaStore(Addr("y", 0), 0, DmaPattern.contiguous(16))]})
    assert len(FastPlan(program, card).steps) == 8
    results = both_ways(card, program, {"x": _random_bytes(2048, "float32", 4)})
    assert_identical(results)
    checked = results["y"][0].view(np.float32)
    assert np.array_equal(checked[32 * 6:32 * 7], checked[:32])  # the first stick reached the seventh


def test_lockstep_rounds_put_synchronized_work_in_later_rounds():
    """Core 1 waits for core 0's signal: its store lands in a later round than core 0's store."""
    p = DmaPattern.contiguous(1)
    prog = Program("handoff", [Operand("y", 256, access="out")], {
        0: [DmaLoad(Addr("y", 0), 0, p), DmaStore(Addr("y", 0), 0, p), Signal(1, tag=0)],
        1: [Wait(0, tag=0), DmaLoad(Addr("y", 0), 0, p), DmaStore(Addr("y", 128), 0, p)],
    })
    rounds = lockstep_rounds(prog)
    where = {m: r for r, groups in enumerate(rounds) for g in groups for m in g.members}
    assert where[(1, 1)] > where[(0, 1)]


# ---------------------------------------------------------------------------------------------
# Through the runtime: the first launch proves, later ones run fast; what depends on data is checked
# ---------------------------------------------------------------------------------------------
def _gather_program(num_rows: int = 4) -> Program:
    idx = SpTensor(0, "int64", (2,))
    return Program("gather", [Operand("idx", 128), Operand("table", num_rows * 128), Operand("out", 256, access="out")], {
        0: [DmaLoad(Addr("idx", 0), 0, DmaPattern.contiguous(1)),
            DmaGather(Addr("table", 0), idx, row_stride=128, row_sticks=1, sp_offset=128, num_rows=num_rows),
            DmaStore(Addr("out", 0), 128, DmaPattern.contiguous(2))],
    })


def _launch_gather(card, prepared, indices):
    idx, table, out = (card.memory.allocate(n) for n in (128, 512, 256))
    try:
        raw = np.zeros(16, np.int64)
        raw[:2] = indices
        card.memory.write(idx.address, raw.view(np.uint8))
        card.memory.write(table.address, np.repeat(np.arange(4, dtype=np.uint8), 128))
        launch(prepared, {"idx": idx, "table": table, "out": out})
        return card.memory.read(out.address, 256).copy()
    finally:
        for a in (idx, table, out):
            card.memory.free(a)


def test_first_launch_is_checked_later_ones_fast(card, monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)
    prepared = prepare(_gather_program(), card)
    first = _launch_gather(card, prepared, [3, 1])
    assert prepared.executor.plan is None and prepared.executor.proved
    second = _launch_gather(card, prepared, [3, 1])
    assert prepared.executor.plan is not None
    np.testing.assert_array_equal(first, second)
    assert list(second[::128]) == [3, 1]


def test_gather_indices_are_checked_on_every_launch(card, monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)
    prepared = prepare(_gather_program(), card)
    _launch_gather(card, prepared, [0, 1])
    with pytest.raises(ExecutionError, match=r"gather index 9 at position 1 is outside \[0, 4\)"):
        _launch_gather(card, prepared, [2, 9])
    assert prepared.executor.plan is not None  # raised by the fast executor


def test_integer_division_by_zero_is_checked_on_every_launch(card, monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)
    t = SpTensor(0, "int32", (32,))
    u = SpTensor(128, "int32", (32,))
    prog = Program("idiv", [Operand("a", 256), Operand("out", 128, access="out")], {
        c: [DmaLoad(Addr("a", 0), 0, DmaPattern.contiguous(2)), Elementwise("floordiv", t, (t, u)),
            DmaStore(Addr("out", 0), 0, DmaPattern.contiguous(1))] if c == 0 else [] for c in (0,)})
    prepared = prepare(prog, card)
    a, out = card.memory.allocate(256), card.memory.allocate(128)
    try:
        card.memory.write(a.address, np.ones(64, np.int32).view(np.uint8))
        launch(prepared, {"a": a, "out": out})
        launch(prepared, {"a": a, "out": out})
        assert prepared.executor.plan is not None
        card.memory.write(a.address + 128, np.zeros(32, np.int32).view(np.uint8))
        with pytest.raises(ExecutionError, match="integer floordiv by zero"):
            launch(prepared, {"a": a, "out": out})
    finally:
        card.memory.free(a)
        card.memory.free(out)


def _copy_two_cores() -> Program:
    """Core 0 copies %src's first stick to %dst; core 1 reads %src's second stick into %dst's second."""
    p = DmaPattern.contiguous(1)
    return Program("copy2", [Operand("src", 256), Operand("dst", 256, access="out")], {
        0: [DmaLoad(Addr("src", 0), 0, p), DmaStore(Addr("dst", 0), 0, p)],
        1: [DmaLoad(Addr("src", 128), 0, p), DmaStore(Addr("dst", 128), 0, p)],
    })


def test_operands_that_overlap_differently_are_checked_again(card, monkeypatch):
    """Proved with disjoint operands; bound so that core 1's read of %src overlaps core 0's write of
    %dst, the launch runs checked and finds the race the fast executor would not look for."""
    monkeypatch.delenv(CHECK_ENV, raising=False)
    prepared = prepare(_copy_two_cores(), card)
    block = card.memory.allocate(512)
    try:
        for _ in range(2):
            launch(prepared, {"src": (block.address, 256), "dst": (block.address + 256, 256)})
        assert prepared.executor.plan is not None
        with pytest.raises(ExecutionError, match="data race"):
            launch(prepared, {"src": (block.address + 128, 256), "dst": (block.address, 256)})
    finally:
        card.memory.free(block)


def test_overlap_signature():
    b = np.array([0, 256, 512], np.int64)
    assert overlap_signature(b, np.array([256, 256, 256], np.int64)) == ()
    assert overlap_signature(b, np.array([300, 256, 256], np.int64)) == ((0, 1),)
    assert overlap_signature(np.array([512, 0], np.int64), np.array([128, 1024], np.int64)) == ((0, 1),)


def test_check_every_launch_never_plans(card, monkeypatch):
    monkeypatch.setenv(CHECK_ENV, "1")
    prepared = prepare(_gather_program(), card)
    for _ in range(3):
        _launch_gather(card, prepared, [0, 1])
    assert prepared.executor.plan is None


def test_unknown_check_mode_is_a_clear_error(card, monkeypatch):
    monkeypatch.setenv(CHECK_ENV, "sometimes")
    prepared = prepare(_gather_program(), card)
    with pytest.raises(SpyreError, match="TORCH_SPYRE_CHECK='sometimes' is not understood"):
        _launch_gather(card, prepared, [0, 1])


def test_compare_mode_catches_a_fast_executor_that_differs(card, monkeypatch):
    monkeypatch.setenv(CHECK_ENV, "compare")
    prepared = prepare(_gather_program(), card)
    _launch_gather(card, prepared, [0, 1])
    _launch_gather(card, prepared, [0, 1])  # compared: identical
    plan = prepared.executor.plan

    def corrupt(memory, dma_addresses):
        plan.pads.block[0, 128] ^= 1  # flip a bit of the gathered row before it is stored

    plan.steps.insert(2, corrupt)
    with pytest.raises(FastExecutionMismatch, match="operand %out"):
        _launch_gather(card, prepared, [0, 1])


def test_gathers_from_a_written_operand_always_run_checked(card, monkeypatch):
    """Which rows a gather reads depends on the indices: if the program also writes the gathered operand,
    whether it races depends on data, so no launch skips the checks."""
    monkeypatch.delenv(CHECK_ENV, raising=False)
    idx = SpTensor(0, "int64", (1,))
    prog = Program("gather_inplace", [Operand("idx", 128), Operand("t", 512, access="inout")], {
        0: [DmaLoad(Addr("idx", 0), 0, DmaPattern.contiguous(1)),
            DmaGather(Addr("t", 0), idx, row_stride=128, row_sticks=1, sp_offset=128, num_rows=4),
            DmaStore(Addr("t", 384), 128, DmaPattern.contiguous(1))],
    })
    prepared = prepare(prog, card)
    i, t = card.memory.allocate(128), card.memory.allocate(512)
    try:
        card.memory.write(i.address, np.zeros(16, np.int64).view(np.uint8))
        for _ in range(3):
            launch(prepared, {"idx": i, "t": t})
        assert prepared.executor.plan is None
    finally:
        card.memory.free(i)
        card.memory.free(t)


def test_max_over_nans_on_several_cores_keeps_the_checked_executors_nan(card):
    """numpy's max picks which NaN it returns (its sign survives in DLFloat16's special code) by how it
    walks the array: reductions run core by core on the checked executor's shapes."""
    t = SpTensor(0, "dlfloat16", (4, 3), (64, 1))
    red = SpTensor(2048, "dlfloat16", (4, 1))
    cores = {c: [DmaLoad(Addr("x", 512 * c), 0, DmaPattern.contiguous(4)), Elementwise("sqrt", t, (t,)),
                 Reduce("max", red, t, axis=1), Elementwise("sub", t, (t, SpTensor(2048, "dlfloat16", (4, 3), (1, 0)))),
                 DmaStore(Addr("y", 512 * c), 0, DmaPattern.contiguous(4))] for c in range(4)}
    prog = Program("nan_max", [Operand("x", 2048), Operand("y", 2048, access="out")], cores)
    for seed in range(5):
        assert_identical(both_ways(card, prog, {"x": _random_bytes(2048, "dlfloat16", seed)}))


@pytest.mark.parametrize("name", ["matmul_1024", "row_reduce"])
def test_operands_inside_one_allocation_and_a_plan_reused_with_other_bindings(card, name):
    """A DMA finds its operand's allocation once per run (``FastPlan._regions_of``): operands bound at
    stick offsets inside one shared allocation, in a different order on each of two runs of the same
    plan, give the checked executor's bytes each time."""
    built = ALL_BUILDERS[name]()
    program = built.program
    validate(program, card.config)
    inputs = built.make_inputs(0)
    data = {op.name: np.frombuffer(operand_layout(op).pack(encode(inputs[op.name], op.device_dtype)).tobytes(), np.uint8)
            if op.name in inputs else np.zeros(op.nbytes, np.uint8) for op in program.operands}
    sizes = [-(-op.nbytes // 128) * 128 for op in program.operands]
    shared = card.memory.allocate(128 + sum(sizes))
    plan = FastPlan(program, card)
    try:
        for order in (list(range(len(sizes))), list(reversed(range(len(sizes))))):
            bases, at = {}, shared.address + 128  # never at the allocation's start
            for i in order:
                bases[program.operands[i].name] = at
                at += sizes[i]
            addresses = resolve_addresses(program, bases)
            results = {}
            for run in ("checked", "fast"):
                for op in program.operands:
                    card.memory.write(bases[op.name], data[op.name])
                if run == "checked":
                    execute(card, program, addresses)
                else:
                    plan.run(card.memory, addresses)
                results[run] = {op.name: card.memory.read(bases[op.name], op.nbytes).copy() for op in program.operands}
            assert_identical({n: (results["checked"][n], results["fast"][n]) for n in results["checked"]})
    finally:
        card.memory.free(shared)

"""Program preparation and launch (runtime/launch.py): patching, execution, the stream clock, bad bindings."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torch_spyre.card import Card, load_config
from torch_spyre.program import Addr, DmaLoad, DmaPattern, DmaStore, Elementwise, Operand, Program, SpTensor
from torch_spyre.runtime import stream as S
from torch_spyre.runtime.launch import BindingError, DeviceBuffer, PreparedProgram, launch, prepare

# benchmarks/ is not an installed package: make the repository root importable for its builders.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.programs import ALL_BUILDERS, decode, encode, operand_layout  # noqa: E402

CARD = 5  # a card index no other test file uses, so our clock is ours alone
F32_PER_STICK = 32


@pytest.fixture
def card():
    S.clock(CARD).reset()
    c = Card(CARD, load_config(environ={}, dram_capacity_bytes=64 * 2**20))
    yield c
    S.clock(CARD).reset()


def add_program(n_sticks: int = 8, cores: int = 2, op: str = "add") -> Program:
    """out = x (op) y over float32, n_sticks sticks split evenly over ``cores`` cores."""
    per = n_sticks // cores
    nbytes = n_sticks * 128
    body = {}
    for c in range(cores):
        off = c * per * 128
        chunk = per * 128
        x, y, o = SpTensor(0, "float32", (per * F32_PER_STICK,)), SpTensor(chunk, "float32", (per * F32_PER_STICK,)), \
            SpTensor(2 * chunk, "float32", (per * F32_PER_STICK,))
        body[c] = [
            DmaLoad(Addr("x", off), 0, DmaPattern.contiguous(per)),
            DmaLoad(Addr("y", off), chunk, DmaPattern.contiguous(per)),
            Elementwise(op, o, (x, y)),
            DmaStore(Addr("out", off), 2 * chunk, DmaPattern.contiguous(per)),
        ]
    operands = [Operand("x", nbytes, "in"), Operand("y", nbytes, "in"), Operand("out", nbytes, "out")]
    return Program(f"{op}_{n_sticks}", operands, body)


def put(card: Card, values: np.ndarray):
    a = card.memory.allocate(values.nbytes)
    card.memory.write(a.address, values.astype(np.float32))
    return a


def get(card: Card, alloc, n: int) -> np.ndarray:
    return card.memory.read(alloc.address, 4 * n).view(np.float32).copy()


def buffers(card: Card, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    return x, y, put(card, x), put(card, y), card.memory.allocate(4 * n)


# ---------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------
def test_prepare_builds_the_patch_table_once(card):
    prog = add_program(8, cores=2)
    p = prepare(prog, card)
    assert isinstance(p, PreparedProgram)
    assert p.operand_names == ("x", "y", "out")
    # 3 DMA instructions per core, each a (core, index, operand, offset) row.
    rows = sorted(zip(p.patches.core.tolist(), p.patches.index.tolist(), p.patches.operand.tolist(),
                      p.patches.offset.tolist()))
    assert rows == [(0, 0, 0, 0), (0, 1, 1, 0), (0, 3, 2, 0), (1, 0, 0, 512), (1, 1, 1, 512), (1, 3, 2, 512)]
    assert set(p.dma_addresses) == {0, 1}
    assert all(a.dtype == np.int64 and a.size == 4 for a in p.dma_addresses.values())


def test_prepare_rejects_an_invalid_program(card):
    from torch_spyre.program import ProgramError

    prog = add_program(4, cores=1)
    prog.cores[0][0] = DmaLoad(Addr("nope", 0), 0, DmaPattern.contiguous(2))
    with pytest.raises(ProgramError):
        prepare(prog, card)


# ---------------------------------------------------------------------------------------------
# launch: results
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,ref", [("add", np.add), ("mul", np.multiply)])
def test_launch_computes_what_numpy_does(card, op, ref):
    n = 8 * F32_PER_STICK
    x, y, ax, ay, aout = buffers(card, n)
    rec = launch(prepare(add_program(8, 2, op), card), {"x": ax, "y": ay, "out": aout})
    np.testing.assert_array_equal(get(card, aout, n), ref(x, y))
    assert rec.addresses == {"x": ax.address, "y": ay.address, "out": aout.address}


def test_same_prepared_program_on_different_buffers_patches_each_time(card):
    n = 8 * F32_PER_STICK
    p = prepare(add_program(8, 2), card)
    runs = [buffers(card, n, seed) for seed in range(3)]
    for x, y, ax, ay, aout in runs:
        launch(p, {"x": ax, "y": ay, "out": aout})
        # The address arrays now hold exactly this launch's bases + offsets.
        assert p.dma_addresses[1][0] == ax.address + 512 and p.dma_addresses[1][3] == aout.address + 512
    for x, y, ax, ay, aout in runs:  # every output is its own inputs' sum: no stale address was used
        np.testing.assert_array_equal(get(card, aout, n), x + y)
    # Swapping roles reuses the same prepared program with the operands exchanged.
    x, y, ax, ay, aout = runs[0]
    launch(p, {"x": aout, "y": ay, "out": ax})
    np.testing.assert_array_equal(get(card, ax, n), (x + y) + y)
    assert p.launches == 4


def test_bindings_accept_device_buffers_and_tuples(card):
    n = 8 * F32_PER_STICK
    x, y, ax, ay, aout = buffers(card, n)
    # A DeviceBuffer inside a larger allocation (stick-aligned) and a bare (address, nbytes) tuple.
    big = card.memory.allocate(8 * n)
    launch(prepare(add_program(8, 2), card),
           {"x": DeviceBuffer(ax.address, ax.nbytes, card=CARD), "y": (ay.address, ay.nbytes),
            "out": DeviceBuffer(big.address + 4 * n, 4 * n)})
    out = card.memory.read(big.address + 4 * n, 4 * n).view(np.float32)
    np.testing.assert_array_equal(out, x + y)


# The card's hand-written programs (benchmarks/programs.py), launched through prepare/launch, with
# the tolerances their own execution tests use.
BUILT_TOLERANCES = {
    "matmul_ksplit": (1e-2, 1e-2),
    "all_to_all": (0, 0),
    "softmax_scratchpad": (1e-2, 1e-3),
    "minilm_attention": (1e-2, 1e-2),
    "minilm_ffn_up": (1e-2, 2e-2),
    "minilm_ln1": (1e-2, 2e-2),
}


def write_inputs(card: Card, program: Program, inputs: dict[str, torch.Tensor]) -> dict:
    """Allocate every operand and write the inputs in their stick layouts."""
    allocs = {op.name: card.memory.allocate(op.nbytes) for op in program.operands}
    for op in program.operands:
        if op.name in inputs:
            packed = operand_layout(op).pack(encode(inputs[op.name], op.device_dtype))
            card.memory.write(allocs[op.name].address, packed)
    return allocs


def read_output(card: Card, program: Program, name: str, alloc) -> torch.Tensor:
    op = program.operand(name)
    lay = operand_layout(op)
    raw = card.memory.read(alloc.address, lay.nbytes).view(lay.storage_dtype)
    return decode(lay.unpack(raw), op.device_dtype).reshape(op.host_shape)


@pytest.mark.parametrize("name", sorted(BUILT_TOLERANCES))
def test_hand_written_programs_launch_and_match_torch(card, name):
    built = ALL_BUILDERS[name]()
    p = prepare(built.program, card)
    # Two launches of one prepared program on two sets of buffers with different data.
    for seed in (0, 1):
        inputs = built.make_inputs(seed=seed)
        allocs = write_inputs(card, built.program, inputs)
        launch(p, allocs)
        rtol, atol = BUILT_TOLERANCES[name]
        for out, expected in built.reference(inputs).items():
            torch.testing.assert_close(read_output(card, built.program, out, allocs[out]), expected.float(),
                                       rtol=rtol, atol=atol, msg=lambda m: f"{name} seed {seed} {out}: {m}")


# ---------------------------------------------------------------------------------------------
# launch: time
# ---------------------------------------------------------------------------------------------
def test_launch_advances_the_stream_by_exactly_the_prepared_timing(card):
    n = 8 * F32_PER_STICK
    _, _, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)
    s = S.Stream(CARD)
    r1 = launch(p, {"x": ax, "y": ay, "out": aout}, stream=s)
    r2 = launch(p, {"x": ax, "y": ay, "out": aout}, stream=s)
    assert (r1.start, r1.end) == (0.0, p.timing.total_s)
    assert r2.start == r1.end and r2.end == pytest.approx(2 * p.timing.total_s)
    assert s.ready_at == r2.end
    assert p.timing is r2.timing  # timed once, at prepare


def test_launch_uses_the_current_stream_by_default(card):
    n = 8 * F32_PER_STICK
    _, _, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)
    s = S.Stream(CARD)
    with S.stream_context(s):
        r = launch(p, {"x": ax, "y": ay, "out": aout})
    assert r.stream_id == s.stream_id and s.ready_at == r.end
    r = launch(p, {"x": ax, "y": ay, "out": aout})
    assert r.stream_id == S.default_stream(CARD).stream_id


def test_events_around_a_launch_measure_it(card):
    n = 8 * F32_PER_STICK
    _, _, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)
    s = S.Stream(CARD)
    s.enqueue("before", 3e-6)
    start, end = S.Event(enable_timing=True), S.Event(enable_timing=True)
    start.record(s)
    launch(p, {"x": ax, "y": ay, "out": aout}, stream=s)
    end.record(s)
    assert start.elapsed_time(end) == pytest.approx(p.timing.total_s * 1e3)


def test_events_measure_a_launch_queued_after_a_host_synchronization(card):
    # The host waited for a long copy on another stream; the launch then starts at that observed time,
    # and events recorded around it must time the launch, not the idle gap before it.
    n = 8 * F32_PER_STICK
    _, _, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)
    s1, s2 = S.Stream(CARD), S.Stream(CARD)
    s2.enqueue("upload", 1e-3, kind="copy_h2d", resource="h2d")
    s2.synchronize()
    start, end = S.Event(enable_timing=True), S.Event(enable_timing=True)
    start.record(s1)
    rec = launch(p, {"x": ax, "y": ay, "out": aout}, stream=s1)
    end.record(s1)
    assert rec.start == pytest.approx(1e-3)
    assert start.elapsed_time(end) == pytest.approx(p.timing.total_s * 1e3)


def test_two_streams_serialize_on_the_cores_but_overlap_with_copies(card):
    # stream.py: a launch occupies the whole core array ("compute"); copies use the PCIe link.
    n = 8 * F32_PER_STICK
    _, _, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)
    s1, s2 = S.Stream(CARD), S.Stream(CARD)
    copy = s2.enqueue("h2d", 5e-6, kind="copy_h2d", resource="h2d")
    a = launch(p, {"x": ax, "y": ay, "out": aout}, stream=s1)
    assert a.start == 0.0 and copy.start == 0.0  # a kernel and a copy overlap
    b = launch(p, {"x": ax, "y": ay, "out": aout}, stream=s2)
    assert b.start == pytest.approx(a.end)  # two kernels cannot share the cores
    # An event orders a later launch after work on another stream.
    s3 = S.Stream(CARD)
    late = s1.enqueue("d2h", 500e-6, kind="copy_d2h", resource="d2h")
    s3.wait_event(s1.record_event())
    c = launch(p, {"x": ax, "y": ay, "out": aout}, stream=s3)
    assert c.start == pytest.approx(late.end)


def test_launch_record_reports_the_prepared_timing(card):
    n = 8 * F32_PER_STICK
    _, _, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)
    seen = []
    S.add_listener(seen.append)
    try:
        r = launch(p, {"x": ax, "y": ay, "out": aout})
    finally:
        S.remove_listener(seen.append)
    t = p.timing
    assert r.busy == t.busy_s and r.utilization == t.utilization and r.bytes == t.bytes
    assert (r.flops, r.roofline_bound, r.roofline_fraction, r.bottleneck) == \
        (t.flops, t.roofline_s, t.roofline_fraction, t.bottleneck)
    assert r.duration == pytest.approx(t.total_s)
    assert r.program in r.summary()
    [w] = seen
    assert (w.kind, w.resource, w.name) == ("kernel", "compute", p.name)
    assert w.details["timing"] is t and w.details["launch_id"] == r.launch_id


# ---------------------------------------------------------------------------------------------
# bad bindings: a clear error, and nothing changes
# ---------------------------------------------------------------------------------------------
def _untouched(card, p, aout, n):
    """Assert that the failed launch neither executed nor advanced the clock."""
    assert p.launches == 0
    assert S.clock(CARD).now == 0.0 and S.default_stream(CARD).ready_at == 0.0
    assert not get(card, aout, n).any()
    assert not p._flat.any()  # no patch applied


def _bad(card, bindings_fn, match, *, stream=None):
    n = 8 * F32_PER_STICK
    x, y, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)
    with pytest.raises(BindingError, match=match) as info:
        launch(p, bindings_fn(card, ax, ay, aout), stream=stream)
    _untouched(card, p, aout, n)
    return info.value


def test_missing_operand(card):
    e = _bad(card, lambda c, ax, ay, aout: {"x": ax, "out": aout}, r"operand 'y'.*not bound")
    assert e.operand == "y"


def test_unknown_operand(card):
    _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": ay, "out": aout, "z": ax}, r"'z'.*no such operand")


def test_buffer_too_small(card):
    e = _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": DeviceBuffer(ay.address, 128), "out": aout},
             r"operand 'y'.*needs 1024 bytes.*has 128")
    assert e.operand == "y"


def test_region_running_past_its_allocation(card):
    _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": DeviceBuffer(ay.address + 512, 1024), "out": aout},
         r"operand 'y'.*ends 512 bytes too soon")


def test_unaligned_address(card):
    _bad(card, lambda c, ax, ay, aout: {"x": (ax.address + 4, 1024), "y": ay, "out": aout},
         r"operand 'x'.*not 128-byte aligned")


def test_freed_allocation(card):
    def bind(c, ax, ay, aout):
        c.memory.free(ay)
        return {"x": ax, "y": ay, "out": aout}

    _bad(card, bind, r"operand 'y'.*not live memory")


def test_stale_handle_of_a_reused_block(card):
    def bind(c, ax, ay, aout):
        c.memory.free(ay)
        c.memory.allocate(ay.nbytes)  # the cached block goes to a new owner, at the same address
        return {"x": ax, "y": ay, "out": aout}

    _bad(card, bind, r"operand 'y'.*no longer live")


def test_a_bare_address_of_another_card_is_not_live_here(card):
    foreign = Card(CARD + 1, card.config).memory.allocate(1024)
    _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": DeviceBuffer(foreign.address, 1024), "out": aout},
         r"operand 'y'.*not live memory")


def test_address_never_allocated(card):
    _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": ay, "out": DeviceBuffer(0x7_0000_0000, 1024)},
         r"operand 'out'.*not live memory")


def test_buffer_of_another_card(card):
    other = Card(CARD + 1, card.config)
    foreign = other.memory.allocate(1024)
    _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": DeviceBuffer(ay.address, 1024, card=CARD + 1), "out": aout},
         r"operand 'y'.*spyre:6.*prepared for spyre:5")
    _bad(card, lambda c, ax, ay, aout: {"x": foreign, "y": ay, "out": aout}, r"operand 'x'")


def test_stream_of_another_card(card):
    _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": ay, "out": aout}, r"stream is on spyre:6",
         stream=S.Stream(CARD + 1))


def test_unsupported_binding_type(card):
    _bad(card, lambda c, ax, ay, aout: {"x": ax, "y": ay, "out": "memory"}, r"operand 'out'.*cannot bind a str")


def test_launch_neither_validates_nor_times_again(card, monkeypatch):
    import torch_spyre.runtime.launch as launch_mod

    n = 8 * F32_PER_STICK
    x, y, ax, ay, aout = buffers(card, n)
    p = prepare(add_program(8, 2), card)

    def forbidden(*args, **kwargs):
        raise AssertionError("launch must reuse what prepare computed")

    monkeypatch.setattr(launch_mod, "validate", forbidden)
    monkeypatch.setattr(launch_mod, "time_program", forbidden)
    launch(p, {"x": ax, "y": ay, "out": aout})
    np.testing.assert_array_equal(get(card, aout, n), x + y)


def test_a_program_failing_during_execution_does_not_advance_the_clock(card):
    from torch_spyre.card.execute import ExecutionError

    # Two cores store to the same output stick with nothing ordering them: a race the card reports.
    body = {c: [DmaLoad(Addr("x", 0), 0, DmaPattern.contiguous(1)), DmaStore(Addr("out", 0), 0, DmaPattern.contiguous(1))]
            for c in (0, 1)}
    prog = Program("racy", [Operand("x", 128), Operand("out", 128, "out")], body)
    p = prepare(prog, card)
    x, out = card.memory.allocate(128), card.memory.allocate(128)
    with pytest.raises(ExecutionError):
        launch(p, {"x": x, "out": out})
    assert p.launches == 0 and S.clock(CARD).now == 0.0

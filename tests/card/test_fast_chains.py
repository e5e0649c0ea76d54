"""Matmul K loops run as one step reading their tiles from device memory, and the DMA loads and ring
sends whose bytes nothing then reads are dropped (``torch_spyre/card/execute/chains.py``): the fast
executor's bytes stay the checked executor's, bit for bit.

The programs are shaped like the compiled Linear kernels: each core accumulates ``ks`` products of an
A tile (8 x 128 DLFloat16, two sticks per row, from a stick-major %a) and its own B tile (128 x 64, one
stick per row, from its column of %b) into one or two fp32 out tiles, and stores them. A comes from
device memory on every core, or only on core 0, which passes it on over the ring.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tests.card.test_fast_executor import _random_bytes, assert_identical
from tests.card.test_fast_executor import both_ways as fast_executor_both_ways
from torch_spyre.card import Card
from torch_spyre.card.config import load_config
from torch_spyre.card.dlfloat16 import from_float32, to_float32
from torch_spyre.card.execute import CHECK_ENV, FastPlan, chains
from torch_spyre.program import (
    Addr,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    MatMul,
    Operand,
    Program,
    RingRecv,
    RingSend,
    SpTensor,
)
from torch_spyre.runtime.launch import launch, prepare

M, K, N = 8, 128, 64
A_TILE = M * 2 * 128  # bytes of one A tile in scratchpad (two sticks per row)
B_TILE = K * 128
OUT_TILE = M * N * 4
B_SP, OUT_SP, SPARE_SP = 64 * 1024, 128 * 1024, 160 * 1024


@pytest.fixture(scope="module")
def card() -> Card:
    return Card(0, load_config(environ={}))


def both_ways(card: Card, program: Program, data: dict[str, np.ndarray], plan: FastPlan) -> dict:
    """``test_fast_executor.both_ways`` with the scratchpads filled with other bytes between the checked and
    the fast run: a dropped load whose bytes were read would read those."""
    return fast_executor_both_ways(card, program, data, plan, poison=True)


def kloop(ncores: int = 3, ks: int = 4, mtiles: int = 1, ring: bool = False, initial: bool = False,
          read_out_at: int | None = None, store_a: bool = False, b_order: list[int] | None = None,
          read_a: bool = False) -> Program:
    """The K loop program (module docstring). ``initial``: out starts from %init and every matmul
    accumulates; ``read_out_at``: core 0 copies out tile 0 to %z after that k (a read of out inside the
    loop); ``store_a``: core 0 finally stores a stick to %a; ``b_order``: the order of B tiles in %b
    (uneven offsets); ``read_a``: core 0 also computes exp of its first A tile's first half (stored to %z)."""
    rows = M * mtiles
    order = b_order or list(range(ks))
    b_col = K * ks * 128
    a_pat = DmaPattern((2, M, 1), (rows * 128, 128, 0), (128, 256, A_TILE))
    outs = [SpTensor(OUT_SP + m * OUT_TILE, "float32", (M, N), (N, 1)) for m in range(mtiles)]
    spare = SpTensor(SPARE_SP, "float32", (M, N), (N, 1))
    store_spare = DmaStore(Addr("z", 0), SPARE_SP, DmaPattern.contiguous(OUT_TILE // 128))
    cores = {}
    for c in range(ncores):
        prog = []
        if initial:
            prog += [DmaLoad(Addr("init", (c * mtiles + m) * OUT_TILE), o.offset, DmaPattern.contiguous(OUT_TILE // 128))
                     for m, o in enumerate(outs)]
        for k in range(ks):
            b_sp = B_SP + (k % 2) * B_TILE
            prog.append(DmaLoad(Addr("b", c * b_col + order[k] * B_TILE), b_sp, DmaPattern.contiguous(K)))
            for m in range(mtiles):
                slot = (k * mtiles + m) * A_TILE
                if ring and c > 0:
                    prog.append(RingRecv(c - 1, tag=1))
                else:
                    prog.append(DmaLoad(Addr("a", 2 * k * rows * 128 + m * M * 128), slot, a_pat))
                if ring and c + 1 < ncores:
                    prog.append(RingSend(c + 1, slot, slot, A_TILE, tag=1))
                a = SpTensor(slot, "dlfloat16", (M, K), (K, 1))
                prog.append(MatMul(outs[m], a, SpTensor(b_sp, "dlfloat16", (K, N), (N, 1)), accumulate=initial or k > 0))
                if c == 0 and read_a and k == 0 and m == 0:
                    prog += [Elementwise("exp", spare, (SpTensor(slot, "dlfloat16", (M, N), (K, 1)),)), store_spare]
            if c == 0 and k == read_out_at:
                prog += [Elementwise("copy", spare, (outs[0],)), store_spare]
        prog += [DmaStore(Addr("y", (c * mtiles + m) * OUT_TILE), o.offset, DmaPattern.contiguous(OUT_TILE // 128))
                 for m, o in enumerate(outs)]
        if c == 0 and store_a:
            prog.append(DmaStore(Addr("a", 0), outs[0].offset, DmaPattern.contiguous(1)))
        cores[c] = prog
    operands = [Operand("a", 2 * ks * rows * 128, access="inout" if store_a else "in"), Operand("b", ncores * b_col),
                Operand("init", ncores * mtiles * OUT_TILE), Operand("y", ncores * mtiles * OUT_TILE, access="out"),
                Operand("z", OUT_TILE, access="out")]
    return Program("kloop", operands, cores)


def _data(program: Program, seed: int, specials: bool = False) -> dict[str, np.ndarray]:
    data = {op.name: _random_bytes(op.nbytes, "float32" if op.name == "init" else "dlfloat16", seed + j)
            for j, op in enumerate(program.operands) if op.name in ("a", "b", "init")}
    if specials:  # NaN, and huge values whose products overflow and cancel (inf - inf = NaN)
        bits = {n: d.view(np.uint16) for n, d in data.items() if n != "init"}
        big = from_float32(np.array([np.nan, 3e9, -3e9, 1e9], np.float32))
        rng = np.random.default_rng(seed)
        for n, b in bits.items():
            at = rng.choice(b.size, 40, replace=False)
            b[at] = big[np.arange(40) % 4]
        init = data["init"].view(np.float32)
        init[:3] = [np.nan, np.inf, -np.inf]
    return data


def _step_names(plan: FastPlan) -> list[str]:
    return [s.__name__ for s in plan.steps]


@pytest.mark.parametrize("ring", [False, True])
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("mtiles", [1, 2])
def test_k_loops_run_as_one_step_each(card, ring, initial, mtiles):
    """Every matmul is inside a chain step, fewer steps run, the dropped DMA loads and ring sends
    included, and the bytes are the checked executor's: accumulating onto out's earlier values or not,
    two interleaved chains, A from device memory or over the ring."""
    program = kloop(ncores=3, mtiles=mtiles, ring=ring, initial=initial)
    plan, plain = FastPlan(program, card), FastPlan(program, card, fuse=False)
    names = _step_names(plan)
    assert plan.chains >= mtiles and names.count("matmul_chain") == plan.chains
    assert "matmul_fp32" not in names and "matmul_fp32" in _step_names(plain)
    assert plan.dropped_steps > 0 and len(plan.steps) + plan.dropped_steps < len(plain.steps)
    if not ring:  # every core's A and B loads: nothing reads their bytes but the chains
        assert "dma" not in names[:names.index("matmul_chain")] or initial
    for seed in (0, 1):
        assert_identical(both_ways(card, program, _data(program, seed), plan))


@pytest.mark.parametrize("ring", [False, True])
def test_nan_and_overflowing_operands(card, ring):
    """NaNs and products that overflow and cancel: the chain's NaNs, infinities and bits are the steps'."""
    program = kloop(ncores=2, mtiles=2, ring=ring, initial=True)
    plan = FastPlan(program, card)
    assert plan.chains
    data = _data(program, 5, specials=True)
    results = both_ways(card, program, data, plan)
    assert_identical(results)
    y = results["y"][0].view(np.float32)
    assert np.isnan(y).any() and np.isinf(y).any() and np.isfinite(y).any()


def _order_sensitive(program: Program, ks: int) -> dict[str, np.ndarray]:
    """Products that nearly cancel across k (large, alternating sign) plus small ones: an fp32 sum of
    them depends on its order, and one GEMM over the whole K sums differently again."""
    rng = np.random.default_rng(11)
    a = np.zeros((2 * ks, M, 64), np.float32)  # stick-major: (stick column, row, element)
    for k in range(ks):
        a[2 * k:2 * k + 2] = rng.uniform(0.5, 1.5, (2, M, 64)) * (4096.0 if k % 2 == 0 else 1.0)
    b = np.zeros((3, ks * K, N), np.float32)
    for k in range(ks):
        sign = 1.0 if k % 3 != 2 else -1.0
        b[:, k * K:(k + 1) * K] = rng.uniform(0.5, 1.5, (3, K, N)) * sign * (1.0 if k % 2 == 0 else 1e-3)
    data = {"a": from_float32(a).view(np.uint8).reshape(-1), "b": from_float32(b).view(np.uint8).reshape(-1)}
    return data


def test_the_chain_sums_in_the_steps_order_and_batches_k_as_separate_gemms(card):
    """On data whose fp32 sum depends on its order, the chain's bytes are the steps' (the checked
    executor's); summing the same products in another order, or computing them as one GEMM over the
    whole K, gives other bytes: a chain that did either would fail here."""
    ks = 6
    program = kloop(ncores=3, ks=ks)
    plan = FastPlan(program, card)
    assert plan.chains == 1
    data = _order_sensitive(program, ks)
    results = both_ways(card, program, data, plan)
    assert_identical(results)
    checked = results["y"][0].view(np.float32).reshape(3, M, N)

    a = to_float32(data["a"].view(np.uint16)).reshape(2 * ks, M, 64).transpose(1, 0, 2).reshape(M, ks * K)
    b = to_float32(data["b"].view(np.uint16)).reshape(3, ks * K, N)
    products = [np.stack([a[:, k * K:(k + 1) * K] @ b[c, k * K:(k + 1) * K] for k in range(ks)]) for c in range(3)]
    in_order = np.stack([_sum(p, range(ks)) for p in products])
    assert in_order.tobytes() == checked.tobytes()  # the steps' order, reproduced here
    assert _sum_reversed(products).tobytes() != checked.tobytes()
    assert np.stack([a @ b[c] for c in range(3)]).tobytes() != checked.tobytes()


def _sum(p: np.ndarray, order) -> np.ndarray:
    order = list(order)
    total = p[order[0]].copy()
    for k in order[1:]:
        total = p[k] + total
    return total


def _sum_reversed(products) -> np.ndarray:
    return np.stack([_sum(p, reversed(range(len(p)))) for p in products])


def test_a_read_of_out_inside_the_loop_splits_the_chain(card):
    """Core 0 copies out after k = 1: the loop runs as two chains there (the second starts from out's
    values), and both the copy and the result are the checked executor's."""
    program = kloop(ncores=1, ks=5, read_out_at=1)
    plan = FastPlan(program, card)
    assert plan.chains == 2
    assert _step_names(plan).count("copy_disjoint") == 1
    assert_identical(both_ways(card, program, _data(program, 3), plan))


def test_a_tile_read_by_another_step_keeps_its_load(card):
    """Core 0 also computes exp of its first A tile: that tile's load stays (the exp reads it), the
    other loads go, and the bytes are the checked executor's."""
    program = kloop(ncores=2, ks=3, read_a=True)
    plan = FastPlan(program, card)
    assert plan.chains and plan.dropped_steps
    assert_identical(both_ways(card, program, _data(program, 4), plan))


def test_uneven_tile_offsets_are_stacked(card):
    """B tiles loaded from %b out of order (offsets not stepping evenly): one view per k, stacked."""
    program = kloop(ncores=3, ks=4, b_order=[2, 0, 3, 1])
    plan = FastPlan(program, card)
    assert plan.chains == 1
    assert_identical(both_ways(card, program, _data(program, 6), plan))


def test_an_operand_the_program_stores_to_is_not_read_by_chains(card):
    """%a is also stored to: its bytes may change during the run, so no chain reads it."""
    program = kloop(ncores=2, ring=True, store_a=True)
    plan = FastPlan(program, card)
    assert plan.chains == 0 and plan.dropped_steps == 0
    assert_identical(both_ways(card, program, _data(program, 7), plan))


def test_repeated_bits_along_k_are_decoded_once(card, monkeypatch):
    """A's tiles for k = 2, 3 hold k = 0, 1's bits (as a K loop over an fp32 operand's 16-bit halves
    does): learned on the first run, decoded once on later ones; once they differ, every tile is
    decoded and the comparison stops. Every run's bytes are the checked executor's. (Nothing is kept
    across runs here: the next test is about that.)"""
    monkeypatch.setattr(chains, "KEEP_BYTES", 0)
    ks, ncores = 4, 2
    program = kloop(ncores=ncores, ks=ks)
    plan = FastPlan(program, card)
    data = _data(program, 8)
    a = data["a"].view(np.uint16).reshape(2 * ks, M * 64)
    a[4:8] = a[0:4]
    a_elems, b_elems = ks * M * K, ncores * ks * K * N
    decoded = 0
    for run in range(3):
        if run == 2:
            data["a"] = data["a"].copy()
            data["a"].view(np.uint16)[5 * M * 64 + 7] ^= 1
        assert_identical(both_ways(card, program, data, plan))
        decoded += b_elems + (a_elems if run == 2 else a_elems // 2)
        assert plan.decoded_elements == decoded
    assert_identical(both_ways(card, program, _data(program, 8), plan))  # compared no more: all decoded
    assert plan.decoded_elements == decoded + a_elems + b_elems


def test_tiles_holding_the_last_runs_bits_are_not_decoded_again(card):
    """Across runs, a chain operand's tiles are kept once a second run finds the same sample of their
    device bytes, and then decoded again only when the bytes differ from the copy: one bit anywhere
    (here in a tile that repeats an earlier tile's bits, so the repeat no longer holds either) is seen;
    an operand whose bytes differed at two runs running is no longer kept. Every run's bytes are the
    checked executor's. (Each run binds freshly allocated operands: the allocator hands back the same
    blocks, as it does to a program launched again.)"""
    ks, ncores = 4, 2
    program = kloop(ncores=ncores, ks=ks)
    plan = FastPlan(program, card)
    data = _data(program, 8)
    a = data["a"].view(np.uint16).reshape(2 * ks, M * 64)
    a[4:8] = a[0:4]  # A's tiles k = 2, 3 hold k = 0, 1's bits
    a_elems, b_elems = ks * M * K, ncores * ks * K * N

    def decoded_by_a_run() -> int:
        before = plan.decoded_elements
        assert_identical(both_ways(card, program, data, plan))
        return plan.decoded_elements - before

    def flip(name: str, element: int) -> None:
        data[name] = data[name].copy()
        data[name].view(np.uint16)[element] ^= 1

    assert decoded_by_a_run() == a_elems // 2 + b_elems  # A's distinct tiles, and B: seen
    assert decoded_by_a_run() == a_elems // 2 + b_elems  # the same sample: kept
    assert decoded_by_a_run() == 0
    flip("a", 6 * M * 64 + 3)  # in tile k = 3, a repeat of k = 1
    assert decoded_by_a_run() == a_elems
    assert decoded_by_a_run() == a_elems  # kept again
    assert decoded_by_a_run() == 0
    flip("b", ks * K * 64 + 5)  # core 1's B
    assert decoded_by_a_run() == b_elems
    flip("b", 0)  # (in the sample: a bit outside it would find the same sample and keep B again)
    assert decoded_by_a_run() == b_elems  # twice running: B is no longer kept
    assert decoded_by_a_run() == b_elems


def test_kept_tiles_are_bounded_and_given_back_with_their_plan(card, monkeypatch):
    """With no room left under ``KEEP_BYTES`` every run decodes; what a plan keeps is given back when the
    plan is dropped (its program evicted); a reader remembers at most ``KEEP_BINDINGS`` bindings."""
    program = kloop(ncores=2, ks=4)
    data = _data(program, 9)
    a_elems, b_elems = 4 * M * K, 2 * 4 * K * N
    gc.collect()  # (earlier tests' plans give their bytes back now, not in the middle of this test)
    monkeypatch.setattr(chains, "KEEP_BYTES", chains._Keep.used)
    plan = FastPlan(program, card)
    for _ in range(3):
        assert_identical(both_ways(card, program, data, plan))
    assert plan.decoded_elements == 3 * (a_elems + b_elems)
    monkeypatch.setattr(chains, "KEEP_BYTES", 1 << 30)
    used = chains._Keep.used
    plan = FastPlan(program, card)
    for _ in range(3):
        assert_identical(both_ways(card, program, data, plan))
    assert plan.decoded_elements == 2 * (a_elems + b_elems) and chains._Keep.used > used
    del plan
    gc.collect()
    assert chains._Keep.used == used
    monkeypatch.setattr(chains, "KEEP_BINDINGS", 1)
    plan, held, seen = FastPlan(program, card), [], set()
    try:
        for _ in range(3):
            assert_identical(both_ways(card, program, data, plan))
            assert plan.device_readers and all(len(r.bindings) <= 1 for r in plan.device_readers)
            seen |= {where for r in plan.device_readers for where in r.bindings}
            held += [card.memory.allocate(op.nbytes) for op in program.operands]  # the next run binds other blocks
        assert len(seen) >= 3
    finally:
        for block in held:
            card.memory.free(block)


def test_tiles_not_filling_a_span_are_decoded_at_every_run(card):
    """B's tiles at uneven offsets (no one span per core to compare): decoded at every run; A's are kept
    from the second run."""
    program = kloop(ncores=2, ks=4, b_order=[2, 0, 3, 1])
    plan = FastPlan(program, card)
    data = _data(program, 10)
    for _ in range(3):
        assert_identical(both_ways(card, program, data, plan))
    assert plan.decoded_elements == 2 * 4 * M * K + 3 * 2 * 4 * K * N


def test_operands_bound_over_a_stored_one_run_unfused(card, monkeypatch):
    """%y bound over %a's bytes (core 0 stores out tile 0 where later chains would read A): the launch
    uses the plan without chains, and its bytes are the checked executor's (compare mode). The chained
    plan on that binding reads A after the store: it would differ."""
    monkeypatch.setenv(CHECK_ENV, "compare")
    program = kloop(ncores=3, ks=4, ring=True)
    prepared = prepare(program, card)
    sizes = {op.name: op.nbytes for op in program.operands}
    data = _data(program, 9)
    block = card.memory.allocate(sum(sizes.values()) + 4096)
    try:
        def bind(overlap: bool) -> dict:
            at, binding = block.address, {}
            for name in ("a", "b", "init", "z", "y"):
                binding[name] = (at, sizes[name])
                at += -(-sizes[name] // 128) * 128
            if overlap:
                binding["y"] = (block.address, sizes["y"])  # over %a
            for name in ("a", "b", "init"):
                card.memory.write(binding[name][0], data[name])
            return binding

        launch(prepared, bind(False))
        launch(prepared, bind(False))  # fast, compared
        assert prepared.executor.plan.chains and prepared.executor.unfused_plan is None
        launch(prepared, bind(True))  # checked: a new overlap signature
        launch(prepared, bind(True))  # fast, compared
        assert prepared.executor.unfused_plan is not None and prepared.executor.unfused_plan.chains == 0
    finally:
        card.memory.free(block)


@pytest.mark.parametrize("shape", [(48, 128, 64), (96, 192, 64), (8, 128, 64)])
def test_a_chain_stack_over_cores_and_k_is_one_gemm_per_item(shape):
    """A chain's products are np.matmul over (cores, k) stacks, A broadcast over the cores (stride 0):
    numpy's loop runs one BLAS GEMM per item, decided from the item's own strides
    (numpy/_core/src/umath/matmul.c.src), so each is the product the member's own step computes."""
    m, k, n = shape
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 18, m, k), dtype=np.float32)
    b = rng.standard_normal((4, 18, k, n), dtype=np.float32)
    stacked = np.matmul(a, b)
    assert all(np.matmul(a[0, j], b[c, j]).tobytes() == stacked[c, j].tobytes() for c in range(4) for j in range(18))


def test_members_of_different_shapes_do_not_chain(card):
    """A K loop whose last tile is shorter (a leftover K): its tiles do not stack with the others, so it
    runs as plain steps (as a chain fails to form on anything planning cannot view as one array)."""
    a_full, a_half = SpTensor(0, "dlfloat16", (M, K), (K, 1)), SpTensor(A_TILE, "dlfloat16", (M, 64), (64, 1))
    b_full = SpTensor(B_SP, "dlfloat16", (K, N), (N, 1))
    b_half = SpTensor(B_SP + B_TILE, "dlfloat16", (64, N), (N, 1))
    out = SpTensor(OUT_SP, "float32", (M, N), (N, 1))
    a_bytes, b_bytes = 3 * M * 128, (K + 64) * 128
    core = [DmaLoad(Addr("a", 0), 0, DmaPattern.contiguous(2 * M)),
            DmaLoad(Addr("a", 2 * M * 128), A_TILE, DmaPattern.contiguous(M)),
            DmaLoad(Addr("b", 0), B_SP, DmaPattern.contiguous(K)),
            DmaLoad(Addr("b", K * 128), B_SP + B_TILE, DmaPattern.contiguous(64)),
            MatMul(out, a_full, b_full), MatMul(out, a_half, b_half, accumulate=True),
            DmaStore(Addr("y", 0), OUT_SP, DmaPattern.contiguous(OUT_TILE // 128))]
    program = Program("leftover_k", [Operand("a", a_bytes), Operand("b", b_bytes), Operand("y", OUT_TILE, access="out")],
                      {0: core})
    plan = FastPlan(program, card)
    assert plan.chains == 0 and plan.dropped_steps == 0
    data = {"a": _random_bytes(a_bytes, "dlfloat16", 12), "b": _random_bytes(b_bytes, "dlfloat16", 13)}
    assert_identical(both_ways(card, program, data, plan))

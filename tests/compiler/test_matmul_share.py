"""Operands shared over the ring (compiler/codegen/matmul/share.py): A loaded once per row of the split and
forwarded core to core; results still match torch, and the plan choice records the scheme and why."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.programs import run_on_card
from torch_spyre.card import Card, CardConfig, StickLayout
from torch_spyre.card.dlfloat16 import round_float32
from torch_spyre.card.timing import time_program
from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.matmul import Split, build_matmul, generate_plan, mm_spec, plan_for_split
from torch_spyre.compiler.codegen.matmul.plan import _assign
from torch_spyre.compiler.codegen.matmul.share import forwarding, rows_sharing_a
from torch_spyre.compiler.codegen.matmul.spec import _check
from torch_spyre.program import DmaLoad, RingRecv, RingSend

CFG = CardConfig()
DL = "dlfloat16"


def buf(name: str, shape: tuple[int, ...]) -> TensorView:
    return TensorView.whole(name, StickLayout(tuple(shape), -1, DL))


def mm(M: int, K: int, N: int):
    return mm_spec(buf("a", (M, K)), buf("b", (K, N)), buf("c", (M, N)), name=f"mm_{M}x{K}x{N}")


def dl(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(round_float32(x.float().numpy()))


@pytest.fixture(scope="module")
def shared_and_own():
    spec = mm(256, 512, 1024)
    plan = plan_for_split(spec, Split(1, 2, 8, 1), CFG)
    shared = generate_plan(spec, plan.split, replace(plan.tiles, share="a"), CFG)
    own = generate_plan(spec, plan.split, replace(plan.tiles, share=""), CFG)
    return spec, shared, own


def test_shared_a_matches_torch(shared_and_own):
    spec, shared, _ = shared_and_own
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(256, 512, generator=g) * 0.1).half(), (torch.randn(512, 1024, generator=g) * 0.1).half()
    outs, _ = run_on_card(Card(0, CFG), shared, {"a": a, "b": b})  # the checked executor: races are errors
    want = dl(a) @ dl(b)
    assert ((outs["c"].float() - want).abs().max() / want.abs().max()).item() < 2e-3


def test_each_row_loads_a_once_and_forwards_it(shared_and_own):
    spec, shared, own = shared_and_own
    work = _assign(_check(spec), Split(1, 2, 8, 1), CFG)
    for row in rows_sharing_a(work, CFG):
        loader, hops = forwarding(row)
        assert len(hops) == len(row) - 1 and {v for _, v in hops} == {w.core for w in row} - {loader}
        for w in row:
            a_loads = [i for i in shared.cores[w.core] if isinstance(i, DmaLoad) and i.src.operand == "a"]
            recvs = [i for i in shared.cores[w.core] if isinstance(i, RingRecv)]
            assert bool(a_loads) == (w.core == loader) and bool(recvs) == (w.core != loader)
    t_shared, t_own = time_program(shared, CFG), time_program(own, CFG)
    a_bytes = 256 * 512 * 2
    # A leaves DRAM once per row of the split (2 rows) instead of once per core (16), B as before.
    assert t_own.bytes["dram_read"] - t_shared.bytes["dram_read"] == 2 * 7 * (a_bytes // 2)
    assert t_shared.bytes["ring"] > 0 and t_own.bytes["ring"] == 0
    assert any(isinstance(i, RingSend) for i in shared.cores[forwarding(rows_sharing_a(work, CFG)[0])[0]])


def test_shared_plan_simulated_time(shared_and_own):
    """Deterministic simulated time of the forced shared plan, faster than every core loading its own A."""
    _, shared, own = shared_and_own
    t_shared, t_own = time_program(shared, CFG), time_program(own, CFG)
    assert t_shared.total_s == pytest.approx(43.6276e-6, rel=1e-5)
    assert t_shared.total_s < t_own.total_s


def test_decisions_record_the_scheme_and_why():
    _, dec = build_matmul(mm(256, 512, 1024), CFG)
    sharing = dec.work_division["operand_sharing"]
    assert sharing["scheme"].startswith("A forwarded over the ring")
    assert "with every core loading its own A" in sharing["why"]
    assert "A shared over the ring" in dec.alternatives[0]["tiles"]
    _, dec_k = build_matmul(mm(64, 4096, 64), CFG)  # long K: a K-split, nothing to share
    assert dec_k.work_division["operand_sharing"]["scheme"] == "each core loads its own operands"
    assert "K-split" in dec_k.work_division["operand_sharing"]["why"]


def test_sharing_needs_a_split_without_k_split():
    from torch_spyre.compiler.codegen.matmul import MatmulSpecError

    spec = mm(64, 4096, 64)
    plan = plan_for_split(spec, Split(1, 1, 1, 4), CFG)
    with pytest.raises(MatmulSpecError, match="without a K-split"):
        generate_plan(spec, plan.split, replace(plan.tiles, share="a"), CFG)


@pytest.mark.slow
@pytest.mark.parametrize("M,K,N,floor", [(1024, 4096, 4096, 0.85), (1024, 14336, 4096, 0.92), (2048, 4096, 4096, 0.87),
                                         (1024, 4096, 14336, 0.84)])
def test_llm_gemms_against_the_op_roofline(M, K, N, floor):
    """Measured with benchmarks/gemm_roofline.py (its --check enforces issue 13's average over all six)."""
    prog, dec = build_matmul(mm(M, K, N), CFG)
    t = time_program(prog, CFG)
    assert dec.work_division["operand_sharing"]["scheme"].startswith("A forwarded")
    assert t.roofline_fraction >= floor, t.summary()


@pytest.mark.slow
@pytest.mark.parametrize("N", [4096, 14336])
def test_decode_gemv_reaches_the_streaming_ceiling(N):
    """1 x 4096 x N: bound by streaming the weight, whose op roofline is the streaming ceiling (>= 95 %)."""
    prog, _ = build_matmul(mm(1, 4096, N), CFG)
    t = time_program(prog, CFG)
    assert t.op_memory_s > t.op_compute_s and t.roofline_fraction >= 0.95, t.summary()


# --- uneven N pieces, forwarding-only passes, the loader of a whole-ring row, a third A buffer ---------
def test_uneven_n_pieces_where_equal_ones_leave_cores_idle():
    """41 sticks over 8 cores: pieces of 6 would fill 7 cores; 6 and 5 sticks (the larger first) fill 8.
    Pieces far from equal (25 sticks over 8: 4 and 3) are not offered."""
    from torch_spyre.compiler.codegen.matmul.plan import _n_chunks

    assert _n_chunks(41, 8) == [(0, 6)] + [(6 + 5 * i, 5) for i in range(7)]
    assert len(_n_chunks(25, 8)) == 7  # 4/3.125 > UNEVEN_N_MAX: left as equal pieces, so the split is refused
    assert _n_chunks(32, 8) == [(4 * i, 4) for i in range(8)]  # equal pieces stay as they were
    work = _assign(_check(mm(64, 256, 41 * 64)), Split(1, 1, 8, 1), CFG)
    assert sorted(w.ncols[1] for w in work) == [320] * 7 + [384] and work[0].ncols[1] == 384


@pytest.fixture(scope="module")
def uneven_shared():
    """N tiles of 5 sticks: the 6-stick core has 2 N tiles, the 5-stick cores 1 (they forward the second
    pass's A tiles without using them)."""
    from torch_spyre.compiler.codegen.matmul import Tiles

    spec = mm(64, 256, 41 * 64)
    return spec, generate_plan(spec, Split(1, 1, 8, 1), Tiles(1, 64, 5, 2, False, share="a"), CFG)


def test_uneven_shared_matches_torch(uneven_shared):
    spec, prog = uneven_shared
    assert "share_notes" not in prog.metadata  # every row shared (no core fell back to its own loads)
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(64, 256, generator=g) * 0.1).half(), (torch.randn(256, 41 * 64, generator=g) * 0.1).half()
    outs, _ = run_on_card(Card(0, CFG), prog, {"a": a, "b": b})  # the checked executor: races are errors
    want = dl(a) @ dl(b)
    assert ((outs["c"].float() - want).abs().max() / want.abs().max()).item() < 2e-3


def test_narrower_cores_forward_the_a_tiles_they_lack(uneven_shared):
    spec, prog = uneven_shared
    work = _assign(_check(spec), Split(1, 1, 8, 1), CFG)
    (row,) = rows_sharing_a(work, CFG, at_memory=True)
    loader, _ = forwarding(row)
    for w in row:
        ins = prog.cores[w.core]
        got = sum(isinstance(i, RingRecv) for i in ins) + sum(isinstance(i, DmaLoad) and i.src.operand == "a" for i in ins)
        matmuls = sum(type(i).__name__ == "MatMul" for i in ins)
        assert got == 2 * 2  # 2 N passes x 2 K tiles of A for every core of the row
        assert matmuls == (2 if w.ncols[1] == 384 else 1) * 2


def test_whole_ring_row_loads_at_the_memory_stop():
    """A row of all 32 cores has no gap: its loading core is the memory stop's, its loads cross no link."""
    work = _assign(_check(mm(64, 256, 32 * 64)), Split(1, 1, 32, 1), CFG)
    (row,) = rows_sharing_a(work, CFG, at_memory=True)  # the matmul generator's rows
    loader, hops = forwarding(row)
    assert loader == CFG.memory_ring_stop and len(hops) == 31
    (mlp_row,) = rows_sharing_a(work, CFG)  # the fused MLP's: the turn from the largest gap, as before
    assert forwarding(mlp_row)[0] != CFG.memory_ring_stop
    arc = _assign(_check(mm(64, 256, 8 * 64)), Split(1, 1, 8, 1), CFG)  # an arc: its middle loads, as before
    (row8,) = rows_sharing_a(arc, CFG)
    assert forwarding(row8)[0] == row8[len(row8) // 2].core


def test_a_third_a_buffer_only_when_shared_streamed_and_room():
    from torch_spyre.compiler.codegen.matmul import Tiles
    from torch_spyre.compiler.codegen.matmul.plan import _buffers, _core_shape

    p, s = _check(mm(256, 512, 1024)), Split(1, 2, 8, 1)
    w = _assign(p, s, CFG)[0]
    for t, want in ((Tiles(1, 128, 2, 4, False, share="a"), True), (Tiles(1, 128, 2, 4, False), False),
                    (Tiles(1, 128, 2, 4, True, share="a"), False)):
        names = {b.name for b in _buffers(p, s, t, _core_shape(p, s, t, w), CFG.scratchpad_plannable_bytes)}
        assert ("a2" in names) == want, t
        assert "a2" not in {b.name for b in _buffers(p, s, t, _core_shape(p, s, t, w))}  # what _fits checks

"""Leftover N sticks split by K (``Split.leftover_k``): when N sticks do not divide equally over the cores,
every core takes q sticks and each of the r leftover sticks is split by K over n / r cores, whose partial
sums meet down a chain on the last of them. Results match torch on the card's checked executor (races
are errors), with A shared over the ring and without, and the plan records the scheme."""

from __future__ import annotations

import pytest
import torch

from benchmarks.programs import run_on_card
from torch_spyre.card import Card, StickLayout
from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.matmul import Split, Tiles, addmm_spec, generate_plan, rank_plans
from torch_spyre.compiler.codegen.matmul.plan import _assign, leftover_ways
from torch_spyre.compiler.codegen.matmul.spec import _check
from torch_spyre.program import MatMul, RingSend

from .test_matmul_share import CFG, DL, buf, dl, mm


def run(spec, prog, M, K, N, seed, bias=False):
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(M, K, generator=g) * 0.1).half(), (torch.randn(K, N, generator=g) * 0.1).half()
    inputs = {"a": a, "b": b}
    want = dl(a) @ dl(b)
    if bias:
        inputs["bias"] = (torch.randn(N, generator=g) * 0.1).half()
        want = want + dl(inputs["bias"])
    outs, _ = run_on_card(Card(0, CFG), prog, inputs)  # the checked executor: races are errors
    return ((outs["c"].float() - want).abs().max() / want.abs().max()).item()


def test_assignment_gives_every_core_the_same_work():
    """12 sticks over 8 cores: 1 each, and the 4 leftover sticks split by K over 2 cores each."""
    p = _check(mm(64, 512, 12 * 64))
    assert leftover_ways(p, Split(1, 1, 8, 1)) == 2
    assert leftover_ways(p, Split(1, 1, 4, 1)) == 0  # divides equally
    assert leftover_ways(p, Split(1, 1, 8, 2)) == 0  # not with a K-split
    work = _assign(p, Split(1, 1, 8, 1, 2), CFG)
    assert [w.ncols for w in work] == [(64 * i, 64) for i in range(8)]
    pieces = sorted((w.extra[0], w.extra[2], w.extra[3]) for w in work)
    assert pieces == sorted((64 * (8 + i // 2), 256 * (i % 2), 256) for i in range(8))
    for w in work:  # the chain of each leftover stick: its two cores, the K pieces in order
        assert w.extra[5][w.extra[4]] == w.core and len(w.extra[5]) == 2
    assert _assign(p, Split(1, 1, 8, 1, 4), CFG) is None  # 4 does not give every core one piece


@pytest.mark.parametrize("share", ["a", ""])
def test_leftover_split_matches_torch(share):
    M, K, N = 64, 512, 12 * 64
    spec = mm(M, K, N)
    prog = generate_plan(spec, Split(1, 1, 8, 1, 2), Tiles(1, 64, 1, 2, False, share=share), CFG)
    assert "share_notes" not in prog.metadata
    sends = [i for ins in prog.cores.values() for i in ins if isinstance(i, RingSend) and i.tag == 4]
    assert len(sends) == 4  # one partial sum per leftover stick
    # every core multiplies its own stick over all K (4 K tiles) and its leftover piece (2 K tiles)
    assert {sum(isinstance(i, MatMul) for i in ins) for ins in prog.cores.values()} == {6}
    assert run(spec, prog, M, K, N, 0) < 2e-3


def test_leftover_split_with_bias_partial_stick_and_resident_a():
    """N not a whole number of sticks (the leftover's last stick is short), a bias, A resident."""
    M, K, N = 48, 384, 11 * 64 + 20
    spec = addmm_spec(buf("bias", (N,)), buf("a", (M, K)), buf("b", (K, N)), buf("c", (M, N)), name="addmm_leftover")
    p = _check(spec)
    assert leftover_ways(p, Split(1, 1, 8, 1)) == 2
    prog = generate_plan(spec, Split(1, 1, 8, 1, 2), Tiles(1, 48, 1, 1, True), CFG)
    assert run(spec, prog, M, K, N, 2, bias=True) < 2e-3


def test_search_offers_the_scheme_and_records_it():
    ranked = rank_plans(mm(64, 512, 12 * 64), CFG)
    assert any(c.split.leftover_k > 1 for c in ranked)
    assert "leftover sticks split by K" in str(Split(1, 1, 8, 1, 2))


def test_switched_off_the_search_offers_only_uneven_pieces():
    from torch_spyre.compiler import optimizations

    spec = mm(64, 512, 12 * 64)
    with optimizations.disabled("matmul_leftover_split"):
        assert leftover_ways(_check(spec), Split(1, 1, 8, 1)) == 0
        ranked = rank_plans(spec, CFG)
        assert ranked and all(c.split.leftover_k == 1 for c in ranked)
    assert any(c.split.leftover_k > 1 for c in rank_plans(spec, CFG))  # on again: offered (plan cache keyed on it)


@pytest.mark.slow
def test_switched_off_512x2048x2560_takes_no_leftover_split():
    """On: 32 cores of 1 stick plus a quarter of a leftover stick (timed 159.68 us against 170.09 us for 20
    cores of 2 sticks); off: no plan splits leftover sticks."""
    from torch_spyre.compiler import optimizations
    from torch_spyre.compiler.codegen.matmul import build_matmul

    with optimizations.disabled("matmul_leftover_split"):
        prog, dec = build_matmul(mm(512, 2048, 2560), CFG)
    assert "leftover" not in prog.metadata["split"]
    record = dec.work_division.get("leftover_sticks")
    assert record is None or "switched off" in record["why"]
    prog, dec = build_matmul(mm(512, 2048, 2560), CFG)
    assert "leftover sticks split by K over 4 cores" in prog.metadata["split"]


@pytest.mark.slow
def test_512x4096x12800_splits_its_leftover_sticks_by_k():
    """200 N sticks over 32 cores: 6 each and the 8 leftover sticks split by K over 4 cores each, A shared
    along the row and within each K piece. Timed on the card against the cheapest plan without it, uneven
    pieces (8 x 7, 24 x 6 sticks: 1,018.5 us, 75.1 % of the op roofline). Deterministic simulated time."""
    from torch_spyre.card.timing import time_program
    from torch_spyre.compiler.codegen.matmul import build_matmul

    prog, dec = build_matmul(mm(512, 4096, 12800), CFG)
    t = time_program(prog, CFG)
    assert dec.work_division["split"] == {"batch": 1, "M": 1, "N_sticks": 32, "K_split": 1}
    assert "leftover sticks split by K over 4 cores" in prog.metadata["split"]
    record = dec.work_division["leftover_sticks"]
    assert record["scheme"].startswith("every core takes 6 sticks; each of the 8 leftover sticks is split by K over 4")
    assert "b1 m1 n32 k1 1018.50 us" in record["settled"]
    assert dec.work_division["operand_sharing"]["scheme"].startswith("A forwarded")
    assert "share_notes" not in prog.metadata
    assert t.total_s == pytest.approx(965.94e-6, rel=1e-4)
    assert t.roofline_fraction > 0.79


@pytest.mark.slow
def test_eager_mm_on_the_device_with_the_leftover_split(monkeypatch, tmp_path):
    """An fp16 mm on spyre whose plan splits its leftover sticks by K (512x2048x2560: 40 sticks over 32
    cores, 8 leftover sticks over 4 cores each; timed 159.68 us against 170.09 us for 20 cores of 2): the
    first launch checked, then TORCH_SPYRE_CHECK=compare (fast and checked executors, byte for byte) and
    TORCH_SPYRE_CHECK=1; each matches torch."""
    from torch_spyre.compiler import eager
    from torch_spyre.compiler.codegen.matmul import build_matmul

    M, K, N = 512, 2048, 40 * 64
    prog, _ = build_matmul(mm(M, K, N), CFG)
    assert "leftover sticks split by K over 4 cores" in prog.metadata["split"]
    g = torch.Generator().manual_seed(4)
    a, b = (torch.randn(M, K, generator=g) * 0.1).half(), (torch.randn(K, N, generator=g) * 0.1).half()
    want = dl(a) @ dl(b)
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "compile")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    eager.reset_cache()
    da, db = a.to("spyre"), b.to("spyre")
    results = []
    for mode in ("0", "compare", "1"):
        monkeypatch.setenv("TORCH_SPYRE_CHECK", mode)
        got = (da @ db).cpu().float()
        assert ((got - want).abs().max() / want.abs().max()).item() < 2e-3, mode
        results.append(got)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    texts = [p.read_text() for p in tmp_path.glob("*.decisions.txt")]
    assert any("leftover sticks split by K over 4 cores" in t for t in texts)  # the device's kernel took it


def test_leftover_split_with_an_nn_linear_weight():
    """B as an nn.Linear weight [N, K] sticked on K (transposed in scratchpad), A shared."""
    from torch_spyre.compiler.codegen.matmul import linear_spec

    M, K, N = 64, 512, 12 * 64
    w = TensorView.whole("w", StickLayout((N, K), -1, DL))
    spec = linear_spec(buf("a", (M, K)), w, buf("c", (M, N)), None)
    prog = generate_plan(spec, Split(1, 1, 8, 1, 2), Tiles(1, 64, 1, 2, False, share="a"), CFG)
    g = torch.Generator().manual_seed(5)
    a, weight = (torch.randn(M, K, generator=g) * 0.1).half(), (torch.randn(N, K, generator=g) * 0.1).half()
    outs, _ = run_on_card(Card(0, CFG), prog, {"a": a, "w": weight})
    want = dl(a) @ dl(weight).T
    assert ((outs["c"].float() - want).abs().max() / want.abs().max()).item() < 2e-3

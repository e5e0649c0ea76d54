"""The fused MLP (issue 13 §4b): one kernel for up (+gate) -> activation -> down with the intermediate in
scratchpad (compiler/codegen/mlp), the post-grad rewrite that finds MLP blocks (compiler/fused_mlp.py),
the fallback to the unfused kernels, and the ``fused_mlp`` switch."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torch_spyre.card import Card, CardConfig, StickLayout
from torch_spyre.card.timing import time_program
from torch_spyre.compiler import fused_mlp, optimizations
from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.mlp import MlpFitError, MlpSpec, MlpSpecError, build_fused_mlp, fit

from .spyre_compile_helpers import TOL, profiled_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.programs import run_on_card  # noqa: E402

ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu}


def rnd(*shape, scale=0.2, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def buf(name, shape, stick=-1):
    return TensorView.whole(name, StickLayout(tuple(shape), stick, "dlfloat16"))


def weight(name, K, N, linear=False):
    """A [K, N] weight view: sticked on N, or (``linear``) nn.Linear's [N, K] buffer transposed (sticked on K)."""
    if linear:
        return TensorView(name, StickLayout((N, K), -1, "dlfloat16"), (K, N), (1, K))
    return buf(name, (K, N))


def mlp_spec(M, H, I, gated=True, bias=False, act="silu", linear=False):
    return MlpSpec(buf("x", (M, H)), weight("wu", H, I, linear), weight("wd", I, H, linear), buf("out", (M, H)),
                   weight("wg", H, I, linear) if gated else None, buf("bu", (I,)) if bias else None,
                   buf("bg", (I,)) if bias and gated else None, buf("bd", (H,)) if bias else None, act)


def swiglu(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def ffn(act):
    return lambda x, w1, b1, w2, b2: F.linear(act(F.linear(x, w1, b1)), w2, b2)


# --- the generator, executed on the card's checked executor ----------------------------------------
@pytest.mark.parametrize("M,H,I,cores,gated,bias,act,sp,linear", [
    (64, 128, 320, 4, True, False, "silu", None, False),  # 5 sticks on 4 cores: the leftover split by tokens
    (100, 192, 200, 3, True, True, "silu", None, False),  # a partial last stick, partial leftover rows
    (64, 128, 320, 4, False, True, "gelu", None, False),  # no gate, biases
    (300, 128, 320, 4, True, True, "silu", 200 * 1024, False),  # too many tokens for one row tile: streams
    # no gate, a leftover stick over several row tiles: its forwarded weight tiles must not land in the
    # receiver's phase-2 buffers (the ring receive slots) while it still adds the last row tile's sums
    (300, 128, 320, 4, False, True, "gelu", 200 * 1024, False),
    (300, 128, 320, 4, False, True, "gelu", 200 * 1024, True),  # the same, weight tiles transposed in kernel
    (100, 192, 200, 3, True, False, "silu", None, True),  # weights in nn.Linear's layout: transposed in kernel
    (40, 100, 130, 32, True, True, "gelu_tanh", None, False),  # partial hidden sticks; 3 sticks on 3 of 32 cores
])
def test_generator_matches_torch(M, H, I, cores, gated, bias, act, sp, linear):
    cfg = CardConfig(num_cores=cores, **({"scratchpad_plannable_bytes": sp} if sp else {}))
    prog, dec = build_fused_mlp(mlp_spec(M, H, I, gated, bias, act, linear), cfg)
    ins = {"x": rnd(M, H), "wu": rnd(H, I, seed=1), "wg": rnd(H, I, seed=2), "wd": rnd(I, H, seed=3),
           "bu": rnd(I, seed=4), "bg": rnd(I, seed=5), "bd": rnd(H, seed=6)}
    stored = {k: v.t().contiguous() if linear and k in ("wu", "wg", "wd") else v for k, v in ins.items()}
    outs, _ = run_on_card(Card(0, cfg), prog, stored)
    f = {k: v.float() for k, v in ins.items()}
    u = f["x"] @ f["wu"] + (f["bu"] if bias else 0)
    h = ACTS[act](f["x"] @ f["wg"] + (f["bg"] if bias else 0)) * u if gated else ACTS[act](u)
    want = h @ f["wd"] + (f["bd"] if bias else 0)
    torch.testing.assert_close(outs["out"], want, **TOL[torch.float16])
    assert dec.kind == "fused_mlp" and dec.fusion["optimization"] == "fused_mlp"
    assert (dec.tiling["row_tiles"] > 1) == bool(sp)
    if I == 320:
        assert dec.work_division["leftover_sticks"].startswith("1 stick(s) left over")


@pytest.mark.parametrize("gated,linear", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("norm", [False, True])
def test_forwarded_tiles_never_share_bytes_with_phase_two(gated, linear, norm):
    """A tile forwarded over the ring (x, the leftover stick's weights) arrives when its sender is ready:
    with several row tiles the sender is already in the next row tile's phase 1 while the receiver is still
    in phase 2. Whatever tiling is chosen, those buffers share no byte with a phase-2 buffer. (Before the
    fix the leftover weight buffers did: the ungated kernel stopped on the checked executor, the gated one
    put its leftover gate tiles inside a receive slot of the other chain.)"""
    from torch_spyre.compiler.codegen.mlp.plan import assign, choose, row_tiles
    from torch_spyre.compiler.codegen.mlp.spec import check

    spec = mlp_spec(300, 128, 320, gated, True, "gelu", linear)
    if norm:
        spec = MlpSpec(**{**spec.__dict__, "residual": buf("res", (300, 128)), "norm_eps": 1e-12})
    cfg = CardConfig(num_cores=4, scratchpad_plannable_bytes=(300 if norm else 200) * 1024)
    p = check(spec)
    work = assign(p, cfg)
    tiles, plan, _ = choose(p, work, cfg)
    assert len(row_tiles(p, tiles.rows)) > 1 and work.leftovers
    # the bytes a forwarded tile lands in: the load's (the staging buffer when transposed in kernel)
    forwarded = [b for b in plan.buffers if re.fullmatch(r"x\d|l[ug]_t\d" if linear else r"x\d|l[ug]\d", b.name)]
    assert len(forwarded) == (6 if gated else 4)
    phase2 = [b for b in plan.buffers if b.start >= 2]
    for f in forwarded:
        for b in phase2:
            assert f.offset + f.aligned_bytes <= b.offset or b.offset + b.aligned_bytes <= f.offset, (f, b)


def test_every_core_gets_the_same_work():
    """Granite's 200 intermediate sticks over 32 cores: 6 each, the 8 left over split by tokens over 4
    cores each (not 7 on eight cores and 6 on the rest): every core's PE arrays are as busy."""
    from torch_spyre.compiler.codegen.mlp.plan import assign
    from torch_spyre.compiler.codegen.mlp.spec import check

    work = assign(check(mlp_spec(512, 4096, 12800)), CardConfig())
    assert (work.count, work.base, work.leftovers) == (32, 6, 8)
    assert all(c.leftover and c.leftover[2] == 4 for c in work.cores)
    sticks = {c.first + j for c in work.cores for j in range(work.base)} | {c.leftover[0] for c in work.cores}
    assert sticks == set(range(200))  # every stick computed, none twice


def test_fused_is_faster_than_the_unfused_kernels_it_replaces():
    """Simulated time of the fused kernel against the sum of the unfused kernels' programs (gate matmul
    with SiLU in its epilogue, up matmul, the product, down matmul)."""
    from torch_spyre.compiler.codegen.matmul import build_matmul, mm_spec
    from torch_spyre.compiler.codegen.matmul.spec import MatmulSpec

    cfg = CardConfig()
    M, H, I = 128, 384, 1536
    fused = time_program(build_fused_mlp(mlp_spec(M, H, I), cfg)[0], cfg).total_s
    gate = MatmulSpec(buf("x", (M, H)), buf("wg", (H, I)), buf("g", (M, I)), activation="silu")
    parts = [build_matmul(gate, cfg)[0], build_matmul(mm_spec(buf("x", (M, H)), buf("wu", (H, I)), buf("u", (M, I))), cfg)[0],
             build_matmul(mm_spec(buf("h", (M, I)), buf("wd", (I, H)), buf("o", (M, H))), cfg)[0]]
    unfused = sum(time_program(p, cfg).total_s for p in parts)  # the product kernel comes on top
    assert fused < unfused - 2 * cfg.kernel_fixed_cost_s


# --- fallback and bad input -------------------------------------------------------------------------
def test_a_shape_that_fits_no_tiling_says_why():
    cfg = CardConfig(num_cores=4, scratchpad_plannable_bytes=32 * 1024)
    spec = mlp_spec(64, 128, 320)
    reason = fit(spec, cfg)
    assert reason is not None and "no tiling fits the scratchpad" in reason and "run as separate kernels" in reason
    with pytest.raises(MlpFitError, match="smallest needs"):
        build_fused_mlp(spec, cfg)
    assert fit(spec, CardConfig(num_cores=4)) is None


@pytest.mark.parametrize("change,match", [
    (dict(w_down=buf("wd", (320, 64))), "shapes do not agree"),
    (dict(activation="swish"), "not a vector-unit op"),
    (dict(b_up=buf("bu", (64,))), r"b_up %bu has shape \[64\]; it must be \[320\]"),
    (dict(out=TensorView("out", StickLayout((128, 64), -1, "dlfloat16"), (64, 128), (1, 64))),
     "must be sticked on its last view dim"),
    (dict(x=TensorView.whole("x", StickLayout((64, 128), -1, "float32"))), "PE arrays multiply fp16"),
])
def test_bad_specs_are_refused_with_what_to_do(change, match):
    from dataclasses import replace

    with pytest.raises(MlpSpecError, match=match):
        build_fused_mlp(replace(mlp_spec(64, 128, 320), **change), CardConfig(num_cores=4))


# --- the rewrite, on FX graphs ----------------------------------------------------------------------
def _graph(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, decomposition_table=torch.export.default_decompositions(),
                   tracing_mode="fake")(*[a.to("spyre") for a in args])


def _swiglu_args(B=2, S=32, H=128, I=256):
    return rnd(B, S, H), rnd(I, H, seed=1), rnd(I, H, seed=2), rnd(H, I, seed=3)


def test_swiglu_and_a_gelu_ffn_are_rewritten():
    gm = _graph(swiglu, *_swiglu_args())
    [m] = fused_mlp.fuse_mlps(gm)
    assert (m.activation, m.w_gate is not None) == ("silu", True)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert fused_mlp.op() in targets and torch.ops.aten.mm.default not in targets
    gm = _graph(ffn(F.gelu), rnd(64, 128), rnd(256, 128, seed=1), rnd(256, seed=2), rnd(128, 256, seed=3),
                rnd(128, seed=4))
    [m] = fused_mlp.fuse_mlps(gm)
    assert (m.activation, m.w_gate, m.b_up is not None, m.b_down is not None) == ("gelu", None, True, True)


def test_switched_off_the_graph_is_left_as_it_is():
    gm = _graph(swiglu, *_swiglu_args())
    before = str(gm.graph)
    with optimizations.disabled("fused_mlp"):
        assert fused_mlp.fuse_mlps(gm) == []
    assert str(gm.graph) == before


@pytest.mark.parametrize("fn", [
    # another function between: x * sigmoid(2x) is not an activation the kernel has
    lambda x, wg, wu, wd: F.linear((lambda g: g * torch.sigmoid(2 * g))(F.linear(x, wg)) * F.linear(x, wu), wd),
    # the intermediate is also returned: it must reach device memory
    lambda x, wg, wu, wd: (lambda h: (F.linear(h, wd), h))(F.silu(F.linear(x, wg)) * F.linear(x, wu)),
    # the gate's output is read elsewhere too
    lambda x, wg, wu, wd: (lambda g: (F.linear(F.silu(g) * F.linear(x, wu), wd), g))(F.linear(x, wg)),
    # gate and up read different inputs
    lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wg)) * F.linear(x * 2, wu), wd),
    # a sum, not a gate product
    lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wg)) + F.linear(x, wu), wd),
])
def test_lookalikes_are_not_rewritten(fn):
    gm = _graph(fn, *_swiglu_args())
    assert fused_mlp.fuse_mlps(gm) == []


def test_the_fused_op_runs_eagerly_on_spyre():
    x, wg, wu, wd = _swiglu_args(1, 16, 64, 128)
    got = fused_mlp.op()(*(t.to("spyre") for t in (x, wu.t(), wg.t(), wd.t())), None, None, None, "silu").cpu()
    torch.testing.assert_close(got, swiglu(x.float(), wg.float(), wu.float(), wd.float()).half(), **TOL[torch.float16])


# --- compiled ---------------------------------------------------------------------------------------
def profiled(fn, args, off: bool = False):
    """(kernel records of the second call, result on the CPU) of ``fn`` compiled under ``torch.no_grad``."""
    return profiled_kernels(fn, args, ("fused_mlp",) if off else (), no_grad=True)


@pytest.mark.slow
def test_compiled_swiglu_is_one_kernel_matching_cpu_and_faster_than_unfused():
    args = _swiglu_args()
    want = swiglu(*(a.float() for a in args)).half()
    on, got_on = profiled(swiglu, args)
    off, got_off = profiled(swiglu, args, off=True)
    for got in (got_on, got_off):
        torch.testing.assert_close(got, want, **TOL[torch.float16])
    assert [k.name.rsplit("_", 1)[0] for k in on] == ["spyre_mlp_silu_gated"]
    assert len(off) >= 3  # gate + SiLU, up, product, down (the product may join a matmul's input copy)
    assert sum(k.duration for k in on) < sum(k.duration for k in off)


@pytest.mark.slow
def test_compiled_gelu_ffn_with_biases_matches_cpu():
    args = (rnd(2, 32, 128), rnd(256, 128, seed=1), rnd(256, seed=2), rnd(128, 256, seed=3), rnd(128, seed=4))
    fn = ffn(F.gelu)
    kernels, got = profiled(fn, args)
    torch.testing.assert_close(got, fn(*(a.float() for a in args)).half(), **TOL[torch.float16])
    assert [k.name.rsplit("_", 1)[0] for k in kernels] == ["spyre_mlp_gelu"]


@pytest.mark.slow
def test_compiled_fallback_when_nothing_fits_runs_the_unfused_kernels(monkeypatch, tmp_path):
    """The compiler's card configuration leaves too little scratchpad for the fused kernel: the graph
    compiles to the unfused kernels, whose decisions say why, and still matches the CPU."""
    from torch_spyre.device import cards

    small = cards.config().model_copy(update={"scratchpad_plannable_bytes": 16 * 1024})
    monkeypatch.setattr(cards, "_config", small)
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    args = _swiglu_args()
    kernels, got = profiled(swiglu, args)
    torch.testing.assert_close(got, swiglu(*(a.float() for a in args)).half(), **TOL[torch.float16])
    names = [k.name for k in kernels]
    assert not any("mlp" in n for n in names) and len(names) >= 3
    notes = [n for f in tmp_path.glob("*.program.json") for n in json.loads(f.read_text())["metadata"]["decisions"]["notes"]]
    assert sum(n.startswith("fused_mlp not used:") and "no tiling fits the scratchpad" in n for n in notes) == 3

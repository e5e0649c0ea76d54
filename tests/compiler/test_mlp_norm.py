"""The residual and LayerNorm after a fused MLP in the MLP's kernel (compiler/mlp_norm.py, codegen/mlp):
the generator against torch on the card, the rewrite and its switch, and the price rule that keeps the
separate kernel where the finisher's norm would cost more."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_spyre.card import Card, CardConfig
from torch_spyre.compiler import mlp_norm, optimizations
from torch_spyre.compiler.codegen.mlp import MlpSpec, MlpSpecError, build_fused_mlp
from torch_spyre.device import cards

from .spyre_compile_helpers import TOL
from .test_fused_mlp import ACTS, buf, mlp_spec, rnd, run_on_card


def _norm_spec(M, H, I, residual=True, affine=True, **kw) -> MlpSpec:
    base = mlp_spec(M, H, I, **kw)
    return MlpSpec(base.x, base.w_up, base.w_down, base.out, base.w_gate, base.b_up, base.b_gate, base.b_down,
                   base.activation, residual=buf("res", (M, H)) if residual else None,
                   norm_weight=buf("nw", (H,)) if affine else None, norm_bias=buf("nb", (H,)) if affine else None,
                   norm_eps=1e-12)


@pytest.mark.parametrize("M,H,I,cores,gated,bias,act,residual,affine,sp", [
    (64, 128, 320, 4, False, True, "gelu", True, True, None),  # BERT's FFN: one row tile, leftover stick
    (100, 192, 200, 3, True, False, "silu", False, False, None),  # no residual, no affine; partial sticks
    (40, 100, 130, 32, False, True, "gelu_tanh", True, True, None),  # H of partial sticks: padding lanes
    # several row tiles, gated and not (a leftover stick's forwarded weight tiles over several row tiles)
    (300, 128, 320, 4, True, True, "silu", True, True, 260 * 1024),
    (300, 128, 320, 4, False, True, "gelu", True, True, 260 * 1024),
])
def test_generator_matches_torch(M, H, I, cores, gated, bias, act, residual, affine, sp):
    cfg = CardConfig(num_cores=cores, **({"scratchpad_plannable_bytes": sp} if sp else {}))
    prog, dec = build_fused_mlp(_norm_spec(M, H, I, residual, affine, gated=gated, bias=bias, act=act), cfg)
    ins = {"x": rnd(M, H), "wu": rnd(H, I, seed=1), "wg": rnd(H, I, seed=2), "wd": rnd(I, H, seed=3),
           "bu": rnd(I, seed=4), "bg": rnd(I, seed=5), "bd": rnd(H, seed=6), "res": rnd(M, H, scale=1.0, seed=7),
           "nw": rnd(H, scale=1.0, seed=8), "nb": rnd(H, seed=9)}
    outs, _ = run_on_card(Card(0, cfg), prog, ins)
    f = {k: v.float() for k, v in ins.items()}
    u = f["x"] @ f["wu"] + (f["bu"] if bias else 0)
    h = ACTS[act](f["x"] @ f["wg"] + (f["bg"] if bias else 0)) * u if gated else ACTS[act](u)
    y = h @ f["wd"] + (f["bd"] if bias else 0) + (f["res"] if residual else 0)
    want = F.layer_norm(y, (H,), f["nw"] if affine else None, f["nb"] if affine else None, 1e-12)
    torch.testing.assert_close(outs["out"], want, **TOL[torch.float16])
    assert dec.fusion["mlp"][-1] == "layer_norm" and dec.fusion["layer_norm"]["optimization"] == "mlp_layer_norm"
    assert (dec.tiling["row_tiles"] > 1) == bool(sp)


def test_bad_norm_operands_are_refused():
    spec = _norm_spec(64, 128, 320, gated=False)
    with pytest.raises(MlpSpecError, match="residual %res has shape"):
        build_fused_mlp(MlpSpec(**{**spec.__dict__, "residual": buf("res", (32, 128))}), CardConfig(num_cores=4))
    with pytest.raises(MlpSpecError, match="come with norm_eps"):
        build_fused_mlp(MlpSpec(**{**spec.__dict__, "norm_eps": None}), CardConfig(num_cores=4))


def test_price_rule_keeps_the_separate_kernel_for_many_tokens():
    """MiniLM's hidden 384: at batch 1 (128 tokens) the finisher's norm is cheaper than a kernel; at batch
    32 (4096 tokens) one core's vector unit would take longer than the separate kernel on every core."""
    cfg = cards.config()
    assert mlp_norm.priced_reason(128, 384, 2, True, cfg) is None
    reason = mlp_norm.priced_reason(4096, 384, 2, True, cfg)
    assert reason is not None and "costs more than the separate LayerNorm kernel" in reason


def _ffn_ln(x, w1, b1, w2, b2, nw, nb):
    return F.layer_norm(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2) + x, x.shape[-1:], nw, nb, 1e-12)


def _ffn_ln_args(B=2, S=16, H=128, I=256):
    return (rnd(B, S, H), rnd(I, H, seed=1), rnd(I, seed=2), rnd(H, I, seed=3), rnd(H, seed=4),
            rnd(H, scale=1.0, seed=5), rnd(H, seed=6))


def _rewritten(fn, args):
    from torch_spyre.compiler import fused_mlp

    from .test_bert_layer_fusion import _graph

    gm = _graph(fn, *args)
    fused_mlp.fuse_mlps(gm)
    done = mlp_norm.fuse_mlp_norms(gm)
    return done, [n for n in gm.graph.nodes if n.op == "call_function"]


def test_rewrite_folds_residual_and_norm_and_the_switch_leaves_them():
    done, nodes = _rewritten(_ffn_ln, _ffn_ln_args())
    assert len(done) == 1 and done[0].eps == 1e-12
    [fused] = [n for n in nodes if str(n.target) == "spyre.fused_mlp.default"]
    assert fused.args[8] is not None and fused.args[11] == 1e-12  # residual ... eps
    assert not any("var_mean" in str(n.target) for n in nodes)
    with optimizations.disabled("mlp_layer_norm"):
        done, nodes = _rewritten(_ffn_ln, _ffn_ln_args())
    assert done == [] and any("var_mean" in str(n.target) for n in nodes)


def test_priced_out_the_norm_stays_and_the_mlp_kernel_says_why(monkeypatch):
    monkeypatch.setattr(mlp_norm, "NORM_F32_PASSES", 10 ** 6)  # the finisher's norm priced above any kernel
    done, nodes = _rewritten(_ffn_ln, _ffn_ln_args())
    [fused] = [n for n in nodes if str(n.target) == "spyre.fused_mlp.default"]
    assert done == [] and any("var_mean" in str(n.target) for n in nodes)
    assert fused.args[11] is None and "mlp_layer_norm not used" in fused.args[12]


def test_lookalike_is_not_rewritten():
    """The sum before the norm is also returned: it must reach device memory, the norm stays separate."""
    def fn(*a):
        y = F.linear(F.gelu(F.linear(a[0], a[1], a[2])), a[3], a[4]) + a[0]
        return F.layer_norm(y, y.shape[-1:], a[5], a[6], 1e-12), y
    done, _ = _rewritten(fn, _ffn_ln_args())
    assert done == []


@pytest.mark.slow
def test_compiled_block_is_one_kernel_matching_cpu():
    from .spyre_compile_helpers import profiled_kernels

    args = _ffn_ln_args()
    want = _ffn_ln(*(a.float() for a in args))
    kernels, got = profiled_kernels(_ffn_ln, list(args), no_grad=True)
    assert [k.name.rsplit("_", 1)[0] for k in kernels] == ["spyre_mlp_gelu_residual_layer_norm"]
    torch.testing.assert_close(got.float(), want, **TOL[torch.float16])

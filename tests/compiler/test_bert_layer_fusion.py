"""A BERT layer compiled on spyre: attention's output read in place, Q/K/V as one matmul group kernel, the
attention output's LayerNorm in the output projection's kernel (issue 13 §4c's fusions), each switchable,
results matching the CPU."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import transformers

from torch_spyre.compiler import epilogue, epilogue_norm, matmul_group, optimizations

from .spyre_compile_helpers import TOL, profiled_kernels

FUSED = ["spyre_addmm_x3", "spyre_sdpa", "spyre_baddbmm_residual_layer_norm", "spyre_mlp_gelu_residual_layer_norm"]


def _layer(dtype: torch.dtype) -> torch.nn.Module:
    """One BERT layer (all-MiniLM-L6-v2's shape scaled down: 4 heads of 32, hidden 128), random weights."""
    cfg = transformers.BertConfig(hidden_size=128, num_attention_heads=4, intermediate_size=256, num_hidden_layers=1,
                                  vocab_size=32, max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    layer = transformers.models.bert.modeling_bert.BertLayer(cfg).eval()
    return layer.to(dtype)


def _call(layer):
    def fn(h):
        out = layer(h)
        return out[0] if isinstance(out, tuple) else out
    return fn


def _families(kernels) -> list[str]:
    return [k.name.rsplit("_", 1)[0] for k in kernels]


def _reference(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _call(_layer(torch.float32))(x.float())


@pytest.mark.slow
def test_fp16_layer_is_four_kernels_matching_cpu():
    x = torch.randn(2, 32, 128).half()
    layer = _layer(torch.float16).to("spyre")
    kernels, got = profiled_kernels(_call(layer), [x], no_grad=True)
    assert _families(kernels) == FUSED
    torch.testing.assert_close(got.float(), _reference(x), **TOL[torch.float16])


@pytest.mark.slow
@pytest.mark.parametrize("off,extra", [("matmul_group", ["spyre_addmm", "spyre_addmm", "spyre_addmm"]),
                                       ("matmul_layer_norm", ["spyre_baddbmm_residual", "spyre_fused_native_layer_norm"]),
                                       ("mlp_layer_norm", ["spyre_mlp_gelu", "spyre_fused_add_native_layer_norm"])])
def test_each_fusion_switched_off_gives_its_unfused_kernels(off, extra):
    x = torch.randn(2, 32, 128).half()
    layer = _layer(torch.float16).to("spyre")
    kernels, got = profiled_kernels(_call(layer), [x], off=(off,), no_grad=True)
    families = _families(kernels)
    # (without the group, batch 2's [B*S, K] view of the input is copied for the plain addmms: one more)
    assert len(families) >= len(FUSED) + len(extra) - 1
    assert all(families.count(e) >= extra.count(e) for e in extra), families
    torch.testing.assert_close(got.float(), _reference(x), **TOL[torch.float16])


@pytest.mark.slow
def test_attention_output_contiguous_when_switched_off_needs_a_copy_kernel():
    x = torch.randn(2, 32, 128).half()
    layer = _layer(torch.float16).to("spyre")
    kernels, got = profiled_kernels(_call(layer), [x], off=("attention_heads_interleaved",), no_grad=True)
    families = _families(kernels)
    assert len(families) == len(FUSED) + 1 and all(f in families for f in FUSED)
    copy = families[families.index("spyre_sdpa") + 1]
    assert copy.startswith("spyre_fused_") and "transpose" in copy  # the heads merged back by a copy
    torch.testing.assert_close(got.float(), _reference(x), **TOL[torch.float16])


def test_attention_output_strides_follow_the_switch():
    q = torch.randn(1, 2, 8, 64).half().to("meta")
    assert torch.ops.spyre.flash_attention(q, q, q).stride() == (8 * 2 * 64, 64, 2 * 64, 1)
    with optimizations.disabled("attention_heads_interleaved"):
        assert torch.ops.spyre.flash_attention(q, q, q).stride() == (2 * 8 * 64, 8 * 64, 64, 1)


@pytest.mark.slow
def test_fp32_layer_matches_cpu():
    """fp32: no matmul group nor LayerNorm epilogue (16-bit only); attention writes its heads interleaved
    (heads of 32 fp32 elements are whole sticks) and the fp32 matmuls read that."""
    x = torch.randn(2, 32, 128)
    layer = _layer(torch.float32).to("spyre")
    kernels, got = profiled_kernels(_call(layer), [x], no_grad=True)
    torch.testing.assert_close(got, _reference(x), **TOL[torch.float32])
    families = _families(kernels)
    assert "spyre_sdpa" in families and "spyre_addmm_x3" not in families


# --- attention's output layout -------------------------------------------------------------------
@pytest.mark.parametrize("D,heads_in_rows", [(32, True), (64, False), (32, False)])
def test_flash_attention_output_strides_agree_eagerly_and_in_meta(D, heads_in_rows):
    """The meta kernel, eager on spyre and on the CPU return the same strides: heads interleaved ([B, L, H, D]
    underneath) where the generator can store them, else contiguous; values as torch's."""
    B, H, L = 2, 4, 16
    if heads_in_rows:  # q/k/v as heads of a [B, L, 3*H*D] projection
        qkv = torch.randn(B, L, 3 * H * D).half()
        q, k, v = (qkv[..., i * H * D:(i + 1) * H * D].view(B, L, H, D).transpose(1, 2) for i in range(3))
    else:
        q, k, v = (torch.randn(B, H, L, D).half() for _ in range(3))
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    op = torch.ops.spyre.flash_attention
    meta = op(*(t.to("meta") for t in (q, k, v)))
    interleaved = D == 64 or heads_in_rows
    assert meta.stride() == ((L * H * D, D, H * D, 1) if interleaved else (H * L * D, L * D, D, 1))
    if heads_in_rows:
        dev = torch.randn(B, L, 3 * H * D).half().to("spyre")
        dev.copy_(qkv.to("spyre"))
        qs, ks, vs = (dev[..., i * H * D:(i + 1) * H * D].view(B, L, H, D).transpose(1, 2) for i in range(3))
    else:
        qs, ks, vs = (t.to("spyre") for t in (q, k, v))
    got = op(qs, ks, vs)
    assert got.stride() == meta.stride()
    assert op(q, k, v).stride() == meta.stride()
    torch.testing.assert_close(got.cpu().float(), want, **TOL[torch.float16])


# --- the rewrites on their own -------------------------------------------------------------------
def _graph(fn, *args):
    """``fn``'s ATen graph on fake spyre tensors, LayerNorm decomposed as Inductor decomposes it."""
    from torch._decomp import get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_spyre.compiler import backend

    backend.register()
    decomp = get_decompositions([torch.ops.aten.native_layer_norm.default])
    with torch.no_grad():
        return make_fx(fn, decomp, tracing_mode="fake")(*(a.to("spyre") for a in args))


def _qkv(x, wq, wk, wv, bq, bk, bv):
    return F.linear(x, wq, bq) * 2, F.linear(x, wk, bk), F.linear(x, wv, bv)


def _qkv_args(n: int = 128, n_v: int = 128):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).half()  # noqa: E731
    return r(2, 8, 64), r(n, 64), r(n, 64), r(n_v, 64), r(n), r(n), r(n_v)


def test_qkv_projections_become_one_group():
    gm = _graph(_qkv, *_qkv_args())
    [g] = matmul_group.group_matmuls(gm)
    assert len(g.members) == 3
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert matmul_group.op() in targets and torch.ops.aten.addmm.default not in targets


def test_group_switched_off_or_off_a_stick_is_left_as_it_is():
    gm = _graph(_qkv, *_qkv_args())
    before = str(gm.graph)
    with optimizations.disabled("matmul_group"):
        assert matmul_group.group_matmuls(gm) == []
    assert str(gm.graph) == before
    gm = _graph(_qkv, *_qkv_args(n_v=96))  # V's 96 columns would end inside a stick: only Q and K group
    [g] = matmul_group.group_matmuls(gm)
    assert len(g.members) == 2


def test_different_inputs_do_not_group():
    gm = _graph(lambda x, wq, wk, wv, bq, bk, bv: (F.linear(x, wq, bq), F.linear(x * 2, wk, bk)), *_qkv_args())
    assert matmul_group.group_matmuls(gm) == []


def test_the_group_op_runs_eagerly_on_spyre():
    x, wq, wk, wv, bq, bk, bv = _qkv_args()
    a = x.reshape(16, 64)
    got = matmul_group.op()(a.to("spyre"), [w.t().to("spyre") for w in (wq, wk, wv)],
                            [b.to("spyre") for b in (bq, bk, bv)]).cpu()
    want = torch.cat([a.float() @ w.float().t() + b.float() for w, b in ((wq, bq), (wk, bk), (wv, bv))], dim=-1)
    torch.testing.assert_close(got.float(), want, **TOL[torch.float16])


def _post_ln(x, w, b, res, nw, nb):
    return F.layer_norm(F.linear(x, w, b) + res, (w.shape[0],), nw, nb, 1e-12)


def _post_ln_args(n: int = 128):
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g).half()  # noqa: E731
    return r(2, 8, 64), r(n, 64) * 0.1, r(n), r(2, 8, n), r(n), r(n)


def test_layer_norm_after_a_fused_matmul_is_folded_in():
    gm = _graph(_post_ln, *_post_ln_args())
    epilogue.fuse_matmul_epilogues(gm)
    [m] = epilogue_norm.fuse_layer_norms(gm)
    assert m.eps == 1e-12 and m.weight is not None and m.bias is not None
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.var_mean.correction not in targets


def test_unread_casts_of_the_statistics_do_not_stop_the_fold():
    """The spyre-aware decomposition casts mean and rstd to fp16 (the CPU's dtype, device/norm_stats.py);
    make_fx keeps those casts though nobody reads them, and the LayerNorm is still folded, casts and all."""
    gm = _graph(_post_ln, *_post_ln_args())
    casts = [n for n in gm.graph.nodes if n.op == "call_function" and not n.users
             and n.target in (torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default)]
    assert len(casts) == 2 and {_val_dtype(c) for c in casts} == {torch.float16}
    epilogue.fuse_matmul_epilogues(gm)
    [m] = epilogue_norm.fuse_layer_norms(gm)
    assert all(c not in gm.graph.nodes for c in casts)
    assert not [n for n in gm.graph.nodes if n.op == "call_function" and not n.users]


def _val_dtype(node):
    return node.meta["val"].dtype


@pytest.mark.parametrize("fn", [
    # the sum is also returned: it must reach device memory
    lambda x, w, b, res, nw, nb: (lambda y: (F.layer_norm(y, (w.shape[0],), nw, nb), y))(F.linear(x, w, b) + res),
    # over the last two dims, not the matmul's N alone
    lambda x, w, b, res, nw, nb: F.layer_norm(F.linear(x, w, b) + res, tuple(res.shape[-2:])),
    # the statistics are returned too: the fused kernel does not write them
    lambda x, w, b, res, nw, nb: torch.native_layer_norm(F.linear(x, w, b) + res, (w.shape[0],), nw, nb, 1e-12)[:2],
    # an RMS norm is not a LayerNorm
    lambda x, w, b, res, nw, nb: F.rms_norm(F.linear(x, w, b) + res, (w.shape[0],), nw),
])
def test_lookalikes_are_not_folded(fn):
    gm = _graph(fn, *_post_ln_args())
    epilogue.fuse_matmul_epilogues(gm)
    assert epilogue_norm.fuse_layer_norms(gm) == []


def test_layer_norm_switched_off_is_left_as_it_is():
    gm = _graph(_post_ln, *_post_ln_args())
    epilogue.fuse_matmul_epilogues(gm)
    before = str(gm.graph)
    with optimizations.disabled("matmul_layer_norm"):
        assert epilogue_norm.fuse_layer_norms(gm) == []
    assert str(gm.graph) == before


def test_the_normed_op_runs_eagerly_on_spyre():
    x, w, b, res, nw, nb = _post_ln_args()
    got = epilogue.op()(*(t.to("spyre") for t in (x, w.t(), b, res)), None, 1.0, 1.0, nw.to("spyre"),
                        nb.to("spyre"), 1e-12).cpu()
    want = _post_ln(*(t.float() for t in (x, w, b, res, nw, nb)))
    torch.testing.assert_close(got.float(), want, **TOL[torch.float16])


@pytest.mark.slow
def test_layer_norm_that_fits_no_tiling_keeps_its_kernel_and_says_why(monkeypatch, tmp_path):
    """Whole rows of N = 4096 in fp32 do not fit 48 KiB of scratchpad per core; the plain matmul does (N
    tiles): the LayerNorm stays a kernel of its own, the matmul's decisions say why, results match."""
    from torch_spyre.device import cards

    small = cards.config().model_copy(update={"scratchpad_plannable_bytes": 48 * 1024})
    monkeypatch.setattr(cards, "_config", small)
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=g).half()  # noqa: E731
    args = (r(1, 16, 64), r(4096, 64) * 0.1, r(4096), r(1, 16, 4096), r(4096), r(4096))
    kernels, got = profiled_kernels(_post_ln, args, no_grad=True)
    torch.testing.assert_close(got.float(), _post_ln(*(a.float() for a in args)), **TOL[torch.float16])
    assert not any("layer_norm" in k.name and "residual" in k.name for k in kernels)
    notes = [n for f in tmp_path.glob("*.program.json") for n in json.loads(f.read_text())["metadata"]["decisions"]["notes"]]
    assert any(n.startswith("matmul_layer_norm not used:") and "no tiling" in n for n in notes), notes


def _normed_spec(M: int, K: int, N: int, a_stick: int = -1, b_on_k: bool = False):
    """addmm + residual + LayerNorm over N, fp16 operands, the given layouts."""
    from torch_spyre.card.layout import StickLayout
    from torch_spyre.compiler.access import TensorView
    from torch_spyre.compiler.codegen.matmul import MatmulSpec

    def v(name, shape, stick=-1):
        return TensorView(name, StickLayout(shape, stick, "dlfloat16"), shape)

    b = TensorView("b", StickLayout((N, K), -1, "dlfloat16"), (K, N), (1, K)) if b_on_k else v("b", (K, N))
    return MatmulSpec(v("a", (M, K), a_stick), b, v("out", (M, N)), v("bias", (N,)), 1.0, 1.0, "addmm", "t",
                      residual=v("residual", (M, N)), norm_eps=1e-5, norm_weight=v("nw", (N,)), norm_bias=v("nb", (N,)))


def test_whole_rows_of_n_4096_fit_with_b_sticked_on_n_and_match_cpu():
    """N = 4096: one B tile of whole rows is K sticks x 4096 x 2 bytes (two of them), so only K tiles of
    one stick fit next to the rows' buffers; K = 2048's largest equal pieces (32 sticks down to 6) do
    not, the search adds K tiles of 4, 2, 1 sticks for a norm. With B sticked on K its transposed copies
    double that and nothing fits (documented: "LayerNorm epilogue")."""
    from torch_spyre.compiler.codegen.matmul import MatmulSpecError, cached_rank_plans
    from torch_spyre.device import cards

    [plan] = cached_rank_plans(_normed_spec(64, 2048, 4096), cards.config(), keep=1)[:1]
    assert plan.split.n == 1 and plan.tiles.nt == 64 and plan.tiles.kt <= 4
    with pytest.raises(MatmulSpecError, match="no tiling fits"):
        cached_rank_plans(_normed_spec(64, 2048, 4096, b_on_k=True), cards.config(), keep=1)
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g).half()  # noqa: E731
    x, w_kn, b, res, nw, nb = r(64, 2048), r(2048, 4096) * 0.05, r(4096), r(64, 4096), r(4096), r(4096)
    got = epilogue.op()(*(t.to("spyre") for t in (x, w_kn, b, res)), None, 1.0, 1.0, nw.to("spyre"),
                        nb.to("spyre"), 1e-5).cpu()
    want = F.layer_norm(x.float() @ w_kn.float() + b.float() + res.float(), (4096,), nw.float(), nb.float(), 1e-5)
    torch.testing.assert_close(got.float(), want, **TOL[torch.float16])


def test_layer_norm_is_kept_only_when_a_sticked_on_m_fits_too(monkeypatch):
    """The layout plan may give A sticked on M at run time (two more A buffers of whole 64-row sticks):
    at 96 KiB per core the 2x8x64x128 kernel fits with A sticked on K but not on M, so the LayerNorm
    keeps its own kernel and the note says which layout did not fit."""
    from torch_spyre.compiler.codegen import matmul
    from torch_spyre.device import cards

    monkeypatch.setattr(cards, "_config", cards.config().model_copy(update={"scratchpad_plannable_bytes": 96 * 1024}))
    tried = []
    real = matmul.cached_rank_plans

    def spy(spec, config, **kw):
        try:
            out = real(spec, config, **kw)
        except matmul.MatmulSpecError:
            tried.append((spec.a.layout.stick_dim, False))
            raise
        tried.append((spec.a.layout.stick_dim, True))
        return out

    monkeypatch.setattr(matmul, "cached_rank_plans", spy)
    gm = _graph(_post_ln, *_post_ln_args())
    epilogue.fuse_matmul_epilogues(gm)
    assert epilogue_norm.fuse_layer_norms(gm) == []
    assert tried == [(2, True), (1, False)]  # A [batch, M, K]: sticked on K fits, on M does not
    [node] = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is epilogue.op()]
    assert node.args[7:10] == (None, None, None)
    assert "not used: no tiling with whole rows per core fits with A sticked on M" in node.args[10]


# --- index by aranges ------------------------------------------------------------------------------
def _padding_mask(mask):
    """transformers 5's padding mask: ``mask[batch_idx, kv_idx]`` with aranges, and'ed with ``q_idx >= 0``."""
    B, S = mask.shape
    b = torch.arange(B, device=mask.device)[:, None, None, None]
    kv = (torch.arange(S, device=mask.device) + 0)[None, None, None, :]
    q = torch.arange(S, device=mask.device)[None, None, :, None]
    return (q >= 0) & mask.bool()[b, kv]


_MASK = torch.tensor([[1] * 20 + [0] * 12, [1] * 32])


def test_an_index_by_whole_aranges_becomes_views():
    from torch_spyre.compiler import index_views

    gm = _graph(_padding_mask, _MASK)
    [_] = index_views.view_indexes(gm)
    assert torch.ops.aten.index.Tensor not in [n.target for n in gm.graph.nodes]


@pytest.mark.parametrize("fn", [
    lambda m: m[torch.arange(m.shape[0], device=m.device)[:, None], torch.arange(16, device=m.device)],  # part of S
    lambda m: m[torch.arange(m.shape[0], device=m.device), torch.arange(m.shape[1], device=m.device)],  # diagonal
    lambda m: m[torch.arange(m.shape[0], device=m.device)[:, None], torch.arange(m.shape[1], device=m.device) * 2 % 32],
])
def test_other_indexes_stay_gathers(fn):
    from torch_spyre.compiler import index_views

    gm = _graph(fn, torch.arange(1024).reshape(32, 32))
    assert index_views.view_indexes(gm) == []


@pytest.mark.slow
def test_compiled_padding_mask_is_one_kernel_matching_cpu():
    on, got = profiled_kernels(_padding_mask, [_MASK])
    off, got_off = profiled_kernels(_padding_mask, [_MASK], off=("index_views",))
    assert torch.equal(got, _padding_mask(_MASK)) and torch.equal(got_off, got)
    assert len(on) == 1 < len(off)


def test_a_group_keeps_within_what_one_core_may_address(monkeypatch):
    """A core of the group's kernel may touch every member's operands: members past the address span stay
    kernels of their own."""
    from torch_spyre.device import cards

    monkeypatch.setattr(cards, "_config", cards.config().model_copy(update={"core_address_span_bytes": 60_000}))
    gm = _graph(_qkv, *_qkv_args())
    [g] = matmul_group.group_matmuls(gm)
    assert len(g.members) == 2

"""SDPA under torch.compile on spyre: one flash-attention kernel (generator "attention") instead of the
decomposed math path; unsupported and training cases keep the math path; eager keeps working."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

import torch_spyre  # noqa: F401  (the device)
from torch_spyre.compiler import wrapper
from torch_spyre.device import sdpa

from .spyre_compile_helpers import check, fresh, minilm_cosines

FMIN16 = torch.finfo(torch.float16).min


def rnd(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def kernel_kinds(path) -> list[str]:
    """The decisions' kind of every program prepared while TORCH_SPYRE_DEBUG wrote into ``path``."""
    kinds = []
    for f in sorted(os.listdir(path)):
        if f.endswith(".program.json"):
            with open(os.path.join(path, f)) as fh:
                kinds.append(json.load(fh)["metadata"]["decisions"]["kind"])
    return kinds


@pytest.fixture
def debug_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    return tmp_path


def padding_mask(B, Lk, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, Lk + 1, (B,), generator=g)
    lengths[0] = Lk
    return (torch.arange(Lk) < lengths[:, None])[:, None, None, :]  # [B, 1, 1, Lk]


def additive_mask(B, Lq, Lk, dtype, seed=2):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(B, 1, Lq, Lk, generator=g) > 0.3
    keep[..., 0] = True
    return torch.where(keep, torch.randn(B, 1, Lq, Lk, generator=g) * 0.5,
                       torch.tensor(torch.finfo(dtype).min)).to(dtype)


# (B, Hq, Hkv, Lq, Lk, D, dtype, is_causal, mask kind)
CASES = {
    "causal_fp16_d32": (1, 2, 2, 64, 64, 32, torch.float16, True, None),
    "bool_padding_fp16_d64_odd": (2, 4, 4, 50, 50, 64, torch.float16, False, "bool"),
    "additive_fp32_d32_lq_ne_lk": (2, 2, 2, 33, 47, 32, torch.float32, False, "additive"),
    "additive_fp16_d64": (3, 2, 2, 40, 40, 64, torch.float16, False, "additive"),
    "gqa_causal_fp16_d64_odd": (2, 8, 2, 65, 65, 64, torch.float16, True, None),
    "gqa_bool_fp32_d32": (2, 4, 1, 31, 31, 32, torch.float32, False, "bool"),
    "causal_fp32_d64_batch3": (3, 2, 2, 29, 29, 64, torch.float32, True, None),
    "bool_padding_bf16_d64_causal": (2, 2, 2, 40, 40, 64, torch.bfloat16, True, "bool"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_sdpa_is_one_flash_kernel(case, debug_dir):
    B, Hq, Hkv, Lq, Lk, D, dtype, causal, mk = CASES[case]
    q, k, v = rnd(B, Hq, Lq, D, dtype=dtype), rnd(B, Hkv, Lk, D, dtype=dtype, seed=1), rnd(B, Hkv, Lk, D, dtype=dtype, seed=2)
    gqa = Hq != Hkv
    if mk is None:
        check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa), q, k, v)
    else:
        m = padding_mask(B, Lk) if mk == "bool" else additive_mask(B, Lq, Lk, dtype)

        def f(q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, enable_gqa=gqa)

        ref_mask = m if mk == "bool" else m.float()
        got = check(f, q, k, v, m, ref_dtype=torch.float32)
        ref = f(q.float(), k.float(), v.float(), ref_mask)
        assert torch.isfinite(got).all() and got.shape == ref.shape
    assert kernel_kinds(debug_dir) == ["attention"]


def test_custom_scale_and_head_dims_differ(debug_dir):
    q, k, v = rnd(1, 3, 48, 64), rnd(1, 3, 80, 64, seed=1), rnd(1, 3, 80, 32, seed=2)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), q, k, v)
    assert kernel_kinds(debug_dir) == ["attention"]


def test_attention_inside_a_block_reads_projections_in_place(debug_dir):
    """q/k/v as head views of projections (as Hugging Face writes them): still one attention kernel."""
    B, L, H, Dh = 2, 24, 4, 32
    x, w = rnd(B, L, H * Dh), rnd(3 * H * Dh, H * Dh, seed=3) * 0.05

    def f(x, w):
        q, k, v = (x @ w.t()).split(H * Dh, dim=-1)
        q, k, v = (t.view(B, L, H, Dh).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, H * Dh)

    check(f, x, w, tol=dict(atol=5e-2, rtol=5e-2))
    assert kernel_kinds(debug_dir).count("attention") == 1


def test_operand_with_a_transposed_last_dim_is_copied_first(debug_dir):
    q, kt, v = rnd(1, 2, 40, 64), rnd(1, 2, 64, 40, seed=1), rnd(1, 2, 40, 64, seed=2)
    check(lambda q, kt, v: F.scaled_dot_product_attention(q, kt.transpose(-1, -2), v), q, kt, v)
    assert kernel_kinds(debug_dir).count("attention") == 1


@pytest.mark.parametrize("what", ["3d", "mask_over_keys_broadcast", "int_mask"])
def test_unsupported_cases_keep_the_math_path(what, debug_dir):
    if what == "3d":
        args = (rnd(2, 16, 32), rnd(2, 16, 32, seed=1), rnd(2, 16, 32, seed=2))
        f = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    elif what == "mask_over_keys_broadcast":
        m = torch.zeros(1, 2, 16, 1, dtype=torch.float16)
        args = (rnd(1, 2, 16, 32), rnd(1, 2, 16, 32, seed=1), rnd(1, 2, 16, 32, seed=2), m)
        f = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    else:
        # On spyre, so that each call is refused for its own reason (CPU operands are refused first).
        q, kv = rnd(1, 2, 16, 32).to("spyre"), rnd(1, 1, 16, 32).to("spyre")
        assert sdpa.supported(q, q, q, torch.ones(16, 16, dtype=torch.int32).to("spyre")) == "mask dtype"
        assert sdpa.supported(q, q, q, dropout_p=0.1) == "dropout"
        assert sdpa.supported(q, kv, kv) == "heads"  # GQA without enable_gqa
        assert sdpa.supported(q, kv, kv, enable_gqa=True) is None
        return
    check(f, *args, tol=dict(atol=5e-2, rtol=5e-2))
    assert "attention" not in kernel_kinds(debug_dir)


def test_supported_refuses_cpu_and_grad():
    q = rnd(1, 2, 16, 32)
    assert sdpa.supported(q, q, q) == "not all operands on one spyre device"  # CPU tensors: torch's own path
    qs = q.to("spyre")
    assert sdpa.supported(qs, qs, qs) is None
    qg = q.float().to("spyre").requires_grad_()
    assert sdpa.supported(qg, qg, qg) == "gradient needed (training graphs keep the math path)"
    with torch.no_grad():
        assert sdpa.supported(qg, qg, qg) is None


def test_cpu_compile_untouched():
    q, k, v = rnd(1, 2, 16, 32, dtype=torch.float32), rnd(1, 2, 16, 32, dtype=torch.float32, seed=1), \
        rnd(1, 2, 16, 32, dtype=torch.float32, seed=2)
    torch._dynamo.reset()
    f = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    torch.testing.assert_close(torch.compile(f)(q, k, v), f(q, k, v), atol=1e-5, rtol=1e-5)


def test_eager_sdpa_matches_cpu():
    q, k, v = rnd(2, 4, 33, 32), rnd(2, 2, 33, 32, seed=1), rnd(2, 2, 33, 32, seed=2)
    # Eager SDPA is routed to spyre::flash_attention too (the device's AutogradPrivateUse1 kernel).
    got = F.scaled_dot_product_attention(*(t.to("spyre") for t in (q, k, v)), is_causal=True, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got.cpu().float(), ref, atol=3e-2, rtol=2e-2)
    # spyre::flash_attention called eagerly (what a traced SDPA becomes) goes through the fallback.
    m = padding_mask(2, 33)
    got = torch.ops.spyre.flash_attention(*(t.to("spyre") for t in (q, k, v, m)), enable_gqa=True).cpu()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), m, enable_gqa=True)
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode"])
def test_eager_sdpa_routes_alike_in_inference_mode(grad_mode, monkeypatch):
    """``torch.inference_mode()`` skips the autograd keys, where the routing kernel used to be only: a
    bool-masked fp16 SDPA then took torch's decomposition, whose -inf scores DLFloat16 holds as NaN."""
    from torch_spyre.runtime import launch as runtime_launch

    q, k, v = rnd(2, 2, 16, 64), rnd(2, 2, 16, 64, seed=1), rnd(2, 2, 16, 64, seed=2)
    m = torch.ones(16, 16, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m)
    launched, launch = [], runtime_launch.launch

    def counted(prepared, *args, **kwargs):
        launched.append(prepared.program.metadata.get("decisions", {}).get("kind"))
        return launch(prepared, *args, **kwargs)

    monkeypatch.setattr(runtime_launch, "launch", counted)
    dev = [t.to("spyre") for t in (q, k, v, m)]
    with torch.no_grad() if grad_mode == "no_grad" else torch.inference_mode():
        got = F.scaled_dot_product_attention(*dev[:3], attn_mask=dev[3]).cpu()
    assert launched == ["attention"]  # one flash attention program, not the decomposition's kernels
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=2e-2)
    # A case the generator does not take keeps torch's decomposition in inference mode too.
    launched.clear()
    with torch.inference_mode():
        got = F.scaled_dot_product_attention(*(t[0] for t in dev[:3]), is_causal=True).cpu()  # 3-d
    assert len(launched) > 1 and "attention" not in launched
    ref = F.scaled_dot_product_attention(q[0].float(), k[0].float(), v[0].float(), is_causal=True)
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=2e-2)


def test_training_graph_keeps_the_math_path_and_matches_cpu_grads(debug_dir):
    torch.manual_seed(0)
    q, k, v = rnd(1, 2, 32, 32), rnd(1, 2, 32, 32, seed=1), rnd(1, 2, 32, 32, seed=2)
    go = rnd(1, 2, 32, 32, seed=3)
    m = padding_mask(1, 32)

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=False)

    refs = [t.float().requires_grad_() for t in (q, k, v)]
    f(*refs, m).backward(go.float())
    devs = [t.to("spyre").requires_grad_() for t in (q, k, v)]
    fresh()
    out = torch.compile(f)(*devs, m.to("spyre"))
    out.backward(go.to("spyre"))
    assert wrapper.host_fallback_stats() == {}
    torch.testing.assert_close(out.detach().cpu().float(), f(q.float(), k.float(), v.float(), m),
                               atol=3e-2, rtol=2e-2)
    for name, d, r in zip("qkv", devs, refs):
        torch.testing.assert_close(d.grad.cpu().float(), r.grad, atol=5e-2, rtol=5e-2, msg=name)
    assert "attention" not in kernel_kinds(debug_dir)


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_minilm_attention_is_flash(dtype, monkeypatch, debug_dir):
    """The real all-MiniLM-L6-v2 (SDPA attention): one attention kernel per layer, cosine >= 0.999."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cos = minilm_cosines(dtype)
    assert cos.min().item() >= 0.999, cos
    assert wrapper.host_fallback_stats() == {}
    kinds = kernel_kinds(debug_dir)
    import transformers

    from torch_spyre.jobs import embed

    layers = transformers.AutoConfig.from_pretrained(embed.model_path()).num_hidden_layers
    assert kinds.count("attention") == layers, kinds


@pytest.mark.slow
def test_dynamic_shapes_keep_one_flash_kernel(debug_dir):
    """dynamic=True: one symbolic graph whose attention kernel is specialized per length at run time."""
    from torch_spyre.compiler import wrapper

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    f = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    cf = torch.compile(f, dynamic=True)
    with torch.no_grad():
        for L in (40, 48, 72):  # not 32, the head dim: Dynamo would give equal sizes one symbol
            q, k, v = rnd(2, 4, L, 32), rnd(2, 4, L, 32, seed=1), rnd(2, 4, L, 32, seed=2)
            m = padding_mask(2, L)
            got = cf(*(t.to("spyre") for t in (q, k, v, m))).cpu().float()
            torch.testing.assert_close(got, f(q.float(), k.float(), v.float(), m), atol=3e-2, rtol=2e-2)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert kernel_kinds(debug_dir).count("attention") == 3  # one program per length
    assert wrapper.host_fallback_stats() == {}

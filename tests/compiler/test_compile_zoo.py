"""The correctness zoo (first entries): torch.compile on spyre tensors vs CPU eager.

Each case compiles with the default backend (Inductor with the Spyre scheduling), runs on the simulated
card, and checks: results within DLFloat16/fp16 tolerances of CPU fp32, no host fallback inside the
compiled graph, every program validated (``prepare`` validates before the first launch).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.zoo import tiny

from .spyre_compile_helpers import check

torch.manual_seed(0)


def rnd(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_pointwise_chain(dtype):
    check(lambda a, b: torch.tanh(a * b + 1.0) - torch.exp(-a.abs()), rnd(64, 96, dtype=dtype), rnd(64, 96, dtype=dtype))


def test_broadcast_row_and_column():
    check(lambda a, r, c: a * r + c, rnd(48, 200), rnd(200), rnd(48, 1))


def test_transpose_add():
    check(lambda a, b: a.t() + b, rnd(128, 96), rnd(96, 128))


def test_permute_3d():
    check(lambda a: (a.permute(2, 0, 1) * 2.0).contiguous(), rnd(4, 40, 70))


def test_slicing():
    check(lambda a: a[3:50, 5:133] * 3.0, rnd(64, 200))


def test_cat():
    check(lambda a, b: torch.cat([a * 2, b + 1], dim=1), rnd(32, 64), rnd(32, 100))


def test_cat_dim0():
    check(lambda a, b: torch.cat([a, b], dim=0) - 1.0, rnd(30, 64), rnd(20, 64))


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "max", "min"])
def test_reduction_last_dim(op):
    fns = {"sum": lambda a: a.sum(-1), "mean": lambda a: a.mean(-1), "amax": lambda a: a.amax(-1),
           "max": lambda a: a.max(-1).values if False else a.max(), "min": lambda a: a.amin(0)}
    tol = dict(atol=0.3, rtol=2e-2) if op == "sum" else None
    check(fns[op], rnd(64, 300).float() if op == "sum" else rnd(64, 300), tol=tol)


def test_reduction_first_dim():
    check(lambda a: a.sum(0), rnd(100, 96, dtype=torch.float32), tol=dict(atol=1e-3, rtol=1e-4))


def test_var():
    check(lambda a: torch.var(a, dim=-1), rnd(32, 256, dtype=torch.float32), tol=dict(atol=1e-3, rtol=1e-3))


def test_softmax():
    check(lambda a: torch.softmax(a, dim=-1), rnd(64, 256))


def test_layer_norm():
    w, b = rnd(384), rnd(384)
    check(lambda x, w, b: F.layer_norm(x, (384,), w, b), rnd(2, 16, 384), w, b, tol=dict(atol=6e-2, rtol=3e-2))


def test_rms_norm():
    w = rnd(256)
    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    check(rms, rnd(8, 32, 256), w, tol=dict(atol=6e-2, rtol=3e-2))


def test_gelu_silu():
    check(lambda a: F.gelu(a) + F.silu(a), rnd(64, 128))
    check(lambda a: F.gelu(a, approximate="tanh"), rnd(64, 128))


def test_causal_masked_softmax():
    def f(a):
        n = a.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=a.device).triu(1)
        return torch.softmax(a.masked_fill(mask, torch.finfo(a.dtype).min), -1)

    check(f, rnd(64, 64, dtype=torch.float32))
    check(f, rnd(64, 64))


def test_large_pointwise_is_tiled_over_cores():
    check(lambda a, b: a * b + 1, rnd(512, 1024), rnd(512, 1024))


def test_long_rows_reduce_in_chunks():
    # 300k fp32 per row does not fit a scratchpad: the reduction runs in chunks with accumulation,
    # and softmax re-reads the row in a second and third pass.
    check(lambda a: a.sum(-1), rnd(4, 300_000, dtype=torch.float32), tol=dict(atol=0.1, rtol=1e-3))
    check(lambda a: torch.softmax(a, -1), rnd(2, 200_000), tol=dict(atol=1e-3, rtol=3e-2))


def test_full_reduction_to_scalar():
    check(lambda a: a.sum() * 2, rnd(100, 100, dtype=torch.float32), tol=dict(atol=1e-2, rtol=1e-3))


def test_integer_and_bool_ops():
    check(lambda a, b: a + b * 3, torch.randint(0, 100, (64, 64)), torch.randint(0, 100, (64, 64)))
    check(lambda a: (a > 0) & (a < 1), rnd(64, 128, dtype=torch.float32))


def test_where_relu_compare():
    # Inputs as the card holds them (DLFloat16): a fp16 near-tie that DLFloat16 rounds to equal values
    # would flip `a > b` against the CPU reference (it did, for some orders of the tests before this one).
    a, b = (rnd(64, 64).to("spyre").cpu() for _ in range(2))
    check(lambda a, b: torch.where(a > b, a.relu(), b * 0.5), a, b)


def test_input_with_non_default_stick_dim_and_offset():
    import torch_spyre

    from .spyre_compile_helpers import fresh

    fresh()
    x = torch.randn(96, 160)
    xs = torch_spyre.to_spyre(x.half(), stick_dim=0)  # sticks along rows
    view = xs[7:90, 3:150]  # a view with a storage offset
    got = torch.compile(lambda a: a * 2 + 1)(view).cpu().float()
    torch.testing.assert_close(got, x.half().float()[7:90, 3:150] * 2 + 1, atol=3e-2, rtol=2e-2)


# --- the matmul family through the matmul generator ------------------------------------------------
MM_TOL = dict(atol=0.1, rtol=0.02)


def test_mm_bmm_addmm():
    check(lambda a, b: a @ b, rnd(32, 64), rnd(64, 48), tol=MM_TOL)
    check(lambda a, b: torch.bmm(a, b), rnd(4, 32, 64), rnd(4, 64, 48), tol=MM_TOL)
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), rnd(48), rnd(32, 64), rnd(64, 48), tol=MM_TOL)


@pytest.mark.parametrize("shape", [(16, 64), (2, 16, 64)])
def test_mlp_forward(shape):
    import torch.nn as nn

    import torch_spyre
    from torch_spyre.compiler import wrapper

    from .spyre_compile_helpers import fresh

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32), nn.SiLU())
    x = torch.randn(*shape)
    ref = mlp(x)
    dev = mlp.half().to("spyre")
    fresh()
    f = torch.compile(dev)
    with torch.no_grad():
        f(x.half().to("spyre"))
        wrapper.reset_host_fallback_stats()
        torch_spyre.reset_fallback_stats()
        got = f(x.half().to("spyre")).cpu().float()
    torch.testing.assert_close(got, ref.detach(), atol=3e-2, rtol=3e-2)
    assert wrapper.host_fallback_stats() == {}
    assert dict(torch_spyre.fallback_stats()) == {}


# --- gathers through the gather generator ---------------------------------------------------------
def test_embedding_and_index_select():
    w = rnd(1000, 128)
    check(lambda w, i: F.embedding(i, w) * 2, w, torch.randint(0, 1000, (4, 16)))
    check(lambda x, i: torch.index_select(x, 0, i) + 1, rnd(50, 64), torch.randint(0, 50, (10,)))
    check(lambda x, i: x[i] - 1, rnd(50, 64), torch.randint(0, 50, (3, 5)))


def test_embedding_layer_norm_block():
    emb = torch.nn.Embedding(500, 96)
    ln = torch.nn.LayerNorm(96)
    w, g, b = emb.weight.detach().half(), ln.weight.detach().half(), ln.bias.detach().half()

    def f(w, g, b, ids):
        return F.layer_norm(F.embedding(ids, w).float(), (96,), g.float(), b.float())

    check(f, w, g, b, torch.randint(0, 500, (2, 24)), tol=dict(atol=6e-2, rtol=3e-2))


def test_fp32_matmul_rounds_operands_for_the_pe_arrays():
    check(lambda a, b: a @ b, rnd(32, 64, dtype=torch.float32), rnd(64, 48, dtype=torch.float32), tol=MM_TOL)


def test_attention_math_path_causal():
    # SDPA reaches Inductor decomposed (bmm, masked softmax, bmm): every piece runs on the card.
    q, k, v = rnd(1, 2, 64, 32), rnd(1, 2, 64, 32), rnd(1, 2, 64, 32)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v,
          tol=dict(atol=5e-2, rtol=5e-2))


def test_transformer_block():
    import torch.nn as nn

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, d=64, h=2):
            super().__init__()
            self.h = h
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (t.reshape(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
            x = x + self.proj(a)
            return x + self.mlp(self.ln2(x))

    block = Block()
    x = torch.randn(2, 32, 64)
    ref = block(x).detach()
    dev = block.half().to("spyre")

    def run(m, inp):
        return m(inp)

    import torch_spyre
    from torch_spyre.compiler import wrapper

    from .spyre_compile_helpers import fresh

    fresh()
    f = torch.compile(dev)
    with torch.no_grad():
        f(x.half().to("spyre"))
        wrapper.reset_host_fallback_stats()
        torch_spyre.reset_fallback_stats()
        got = f(x.half().to("spyre")).cpu().float()
    torch.testing.assert_close(got, ref, atol=6e-2, rtol=5e-2)
    assert wrapper.host_fallback_stats() == {} and dict(torch_spyre.fallback_stats()) == {}


def test_mlp_forward_backward():
    import torch.nn as nn

    from torch_spyre.compiler import wrapper

    from .spyre_compile_helpers import fresh

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    ref = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    ref.load_state_dict(mlp.state_dict())
    x, y = torch.randn(16, 64), torch.randn(16, 32)

    def loss_fn(m, x, y):
        return ((m(x) - y) ** 2).mean()

    loss_fn(ref, x, y).backward()
    dev = mlp.half().to("spyre")
    fresh()
    loss = torch.compile(loss_fn)(dev, x.half().to("spyre"), y.half().to("spyre"))
    loss.backward()  # AOT autograd's backward graph, compiled by the same backend
    assert wrapper.host_fallback_stats() == {}
    for (name, p), (_, q) in zip(dev.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad.cpu().float(), q.grad, atol=2e-3, rtol=5e-2, msg=name)


# --- tiny random-weight models from configs (tests/zoo.py) ----------------------------------------
@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("name", ["llama", "qwen3", "granite", "bert"])
def test_tiny_models(name):
    import torch_spyre
    from torch_spyre.compiler import wrapper

    from .spyre_compile_helpers import fresh

    torch.manual_seed(0)
    cfg, cls = tiny(name)
    model = cls(cfg).eval()
    ids = torch.randint(0, 256, (2, 16))
    # Pass Bert's token_type_ids, as tokenizers do (its default path, a torch.gather along a buffer's
    # stick dim, is tested in test_lowerings_more.py::test_bert_default_token_type_ids).
    kw = {"token_type_ids": torch.zeros(2, 16, dtype=torch.long)} if name == "bert" else {}
    with torch.no_grad():
        ref = model(ids, **kw).last_hidden_state
        dev = model.half().to("spyre")
        fresh()
        f = torch.compile(dev)
        f(ids.to("spyre"), **{k: v.to("spyre") for k, v in kw.items()})
        wrapper.reset_host_fallback_stats()
        torch_spyre.reset_fallback_stats()
        got = f(ids.to("spyre"), **{k: v.to("spyre") for k, v in kw.items()}).last_hidden_state.cpu().float()
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
    assert wrapper.host_fallback_stats() == {}


def test_static_indirect_index():
    check(lambda a: a[torch.arange(8, device=a.device) * 2] + 1, rnd(16, 64))


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_minilm_sentence_embeddings(dtype, monkeypatch):
    """The real all-MiniLM-L6-v2: sentence embeddings on the card vs CPU fp32, cosine >= 0.999."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from torch_spyre.compiler import wrapper

    from .spyre_compile_helpers import minilm_cosines

    cos = minilm_cosines(dtype)
    assert cos.min().item() >= 0.999, cos
    assert wrapper.host_fallback_stats() == {}


def test_odd_shapes_and_padding():
    check(lambda a: a.permute(1, 2, 0) * 2 - 1, rnd(3, 65, 33))
    check(lambda a, b: a + b, rnd(1, 70, 1), rnd(5, 1, 9))
    check(lambda a: a.mean((0, 2)), rnd(6, 40, 70))
    check(lambda a: a[::2, 1::3] + 1, rnd(64, 200))
    check(lambda a: F.pad(a, (3, 5, 1, 0), value=2.0), rnd(20, 30, dtype=torch.float32))
    check(lambda a, b, c: torch.cat([a, b, c], -1).relu(), rnd(8, 10), rnd(8, 70), rnd(8, 1))
    check(lambda a: torch.log_softmax(a, -1), rnd(32, 130, dtype=torch.float32), tol=dict(atol=1e-3, rtol=1e-3))
    check(lambda a: a.std(-1), rnd(16, 300, dtype=torch.float32), tol=dict(atol=1e-3, rtol=1e-3))


def test_integer_bitwise_ops_run_eagerly_not_miscomputed():
    """The vector unit has logical, not bitwise, operations: the op falls back to the eager op
    (compiler/fallback.py) and gives torch's answer."""
    import torch_spyre

    from .spyre_compile_helpers import run_compiled

    a, b = torch.randint(0, 8, (8, 8)), torch.randint(0, 8, (8, 8))
    assert torch.equal(run_compiled(lambda x, y: x & y, a, b), a & b)
    assert list(torch_spyre.fallback_stats().compile_fallbacks) == ["aten.bitwise_and.Tensor"]


@pytest.mark.parametrize("case", ["mm_merged", "bmm_split"])
def test_graph_input_view_that_merges_allocation_dims_is_copied_for_the_matmul(case):
    """Only the bound tensor shows that a graph input is a view merging (or splitting) dims of its
    allocation; the kernel copies it before the matmul reads it as one stride per dim."""
    import torch_spyre
    from torch_spyre.compiler import wrapper

    from .spyre_compile_helpers import fresh

    fresh()
    if case == "mm_merged":
        base, w = rnd(4, 8, 64), rnd(64, 16)
        view = lambda t: t.view(32, 64)  # noqa: E731
        f = torch.compile(lambda x, w: x @ w)
    else:
        base, w = rnd(32, 64), rnd(4, 64, 16)
        view = lambda t: t.view(4, 8, 64)  # noqa: E731
        f = torch.compile(lambda x, w: torch.bmm(x, w))
    got = f(view(base.to("spyre")), w.to("spyre")).cpu().float()
    ref = view(base).float() @ w.float()
    torch.testing.assert_close(got, ref, atol=5e-2, rtol=2e-2)
    assert wrapper.host_fallback_stats() == {} and dict(torch_spyre.fallback_stats()) == {}

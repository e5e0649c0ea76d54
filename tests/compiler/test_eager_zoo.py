"""The correctness zoo run eagerly on spyre (issue 4 §6: "eager spyre runs of the same zoo match too").

Every op runs as it would for a user: a cached single-op program (the default eager mode), results
compared with CPU fp32 at DLFloat16 tolerances, and every repeated program's fast run compared byte for
byte with the checked executor's (``TORCH_SPYRE_CHECK=compare``). ``fallback_stats().host`` names any op that ran on the
host instead; the cases allow only the host work that is by design (docs/compiler.md, "Eager mode"):
factories such as ``arange`` (no device data in, so nothing for a program to compute) and ops given a
tensor of no elements (a KV cache's empty first ``past`` in ``cat``). Anything refused by the compiler
fails the case.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_spyre
from torch_spyre.compiler import eager

FP16_TOL = dict(atol=3e-2, rtol=2e-2)


@pytest.fixture(autouse=True)
def default_eager_mode(monkeypatch):
    monkeypatch.delenv("TORCH_SPYRE_EAGER", raising=False)
    # Every cached op's later launches run on the fast executor *and* the checked one, from the same
    # memory: any byte that differs fails the case (FastExecutionMismatch).
    monkeypatch.setenv("TORCH_SPYRE_CHECK", "compare")
    assert eager.mode() == "compile"
    torch_spyre.reset_fallback_stats()
    eager.reset_warnings()  # and the host reasons
    yield


def on_spyre(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.to("spyre") for x in xs]


BY_DESIGN = ("no spyre tensor input", "a tensor of no elements")


def assert_all_programs():
    stats = torch_spyre.fallback_stats()
    assert stats.compiled, "nothing ran as a program"
    reasons = eager.host_reasons()
    refused = {op: reasons.get(op, "?") for op in stats.host if not reasons.get(op, "").startswith(BY_DESIGN)}
    assert refused == {}, f"ops the compiler refused, run on the host: {refused}"


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm", "gelu", "silu"])
def test_normalizations_and_activations(name):
    x = rnd(4, 96) * 3
    w, b = rnd(96, seed=1), rnd(96, seed=2)
    fns = {
        "softmax": lambda x, w, b: x.softmax(-1),
        "layer_norm": lambda x, w, b: F.layer_norm(x, (96,), w, b),
        "rms_norm": lambda x, w, b: F.rms_norm(x, (96,), w),
        "gelu": lambda x, w, b: F.gelu(x),
        "silu": lambda x, w, b: F.silu(x),
    }
    got = fns[name](*on_spyre(x.half(), w.half(), b.half()))
    torch.testing.assert_close(got.cpu().float(), fns[name](x, w, b), **FP16_TOL)
    assert_all_programs()


@pytest.mark.parametrize("gqa", [False, True])
def test_causal_attention(gqa):
    q = rnd(1, 4, 32, 32)
    k, v = rnd(1, 2 if gqa else 4, 32, 32, seed=1), rnd(1, 2 if gqa else 4, 32, 32, seed=2)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    got = F.scaled_dot_product_attention(*on_spyre(q.half(), k.half(), v.half()), is_causal=True, enable_gqa=gqa)
    torch.testing.assert_close(got.cpu().float(), ref, **FP16_TOL)
    assert_all_programs()


def test_embedding_and_mlp():
    torch.manual_seed(0)
    emb, mlp = nn.Embedding(100, 64), nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        ref = mlp(emb(ids))
        emb, mlp = emb.half().to("spyre"), mlp.half().to("spyre")
        got = mlp(emb(ids.to("spyre")))
    torch.testing.assert_close(got.cpu().float(), ref, atol=5e-2, rtol=5e-2)
    assert_all_programs()


@pytest.mark.slow
def test_mlp_training_step():

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    ref = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    ref.load_state_dict(mlp.state_dict())
    x, y = rnd(16, 64), rnd(16, 32, seed=1)
    ((ref(x) - y) ** 2).mean().backward()
    dev = mlp.to("spyre")
    ((dev(x.to("spyre")) - y.to("spyre")) ** 2).mean().backward()
    for (name, p), (_, q) in zip(dev.named_parameters(), ref.named_parameters()):
        # fp32 matmuls multiply DLFloat16-rounded operands on the PE arrays
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=2e-3, rtol=5e-2, msg=name)
    assert_all_programs()


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("name", ["llama", "qwen3", "granite", "bert"])
def test_tiny_models(name):
    from tests.zoo import tiny

    torch.manual_seed(0)
    cfg, cls = tiny(name)
    model = cls(cfg).eval()
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        ref = model(ids).last_hidden_state
        got = model.half().to("spyre")(ids.to("spyre")).last_hidden_state.cpu().float()
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
    assert_all_programs()


@pytest.mark.slow
def test_transformer_block():
    torch.manual_seed(0)
    d, h = 64, 2
    ln1, ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
    qkv, proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
    mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    layers = nn.ModuleList([ln1, ln2, qkv, proj, mlp])

    def block(x):
        b, s, _ = x.shape
        q, k, v = qkv(ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + proj(a)
        return x + mlp(ln2(x))

    x = rnd(2, 32, d)
    with torch.no_grad():
        ref = block(x)
        layers.half().to("spyre")
        got = block(x.half().to("spyre")).cpu().float()
    torch.testing.assert_close(got, ref, atol=6e-2, rtol=5e-2)
    assert_all_programs()


def test_index_select_with_an_index_view_merging_dims():
    """A [2, 12] index seen as [24] crosses from one row's sticks to the next: read one stride per dim,
    rows 12..23 picked the wrong rows once a gather chunk held more than one index (the gather now
    refuses such views, and eager copies them first)."""
    w, ids = rnd(100, 64).half(), torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    got = torch.index_select(w.to("spyre"), 0, ids.to("spyre").reshape(-1))
    torch.testing.assert_close(got.cpu().float(), w.float()[ids.reshape(-1)], **FP16_TOL)
    assert_all_programs()

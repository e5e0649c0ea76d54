"""Compiled on spyre, as a model developer runs them: ``model.generate()`` of a decoder with a compiled forward,
and a SentenceTransformer compiled with ``.compile()``; both against the CPU (docs/coverage.md, "Compiled
generate and SentenceTransformer")."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.models, pytest.mark.slow]

import torch_spyre  # noqa: E402
from torch_spyre.profiler import profile  # noqa: E402

NEW_TOKENS = 4


def _compiled_kernels(prof) -> set[str]:
    """Names of the compiled graphs' kernels that ran (Inductor's fused kernels are named spyre_fused_*)."""
    return {r.name for r in prof.events() if r.kind == "kernel" and r.name.startswith("spyre_fused")}


def _tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.timeout(1800)
def test_generate_compiled_greedy_tokens_equal_cpu():
    """``model.forward = torch.compile(model.forward)`` (Hugging Face's recipe) on spyre: the prefill and the
    decode steps run as compiled graphs on the card, and greedy decoding picks the CPU's tokens."""
    model = _tiny_llama()
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        ref = copy.deepcopy(model).generate(ids, attention_mask=torch.ones_like(ids), **kw)
    torch.compiler.reset()
    model.to("spyre")
    model.forward = torch.compile(model.forward)
    with torch.no_grad(), profile() as prof:
        got = model.generate(ids.to("spyre"), attention_mask=torch.ones_like(ids).to("spyre"), **kw)
    assert got.device.type == "spyre"
    assert torch.equal(got.cpu(), ref), (got.cpu()[:, 8:], ref[:, 8:])
    assert _compiled_kernels(prof), "no compiled kernel ran: generate did not use the compiled forward"


@pytest.mark.timeout(1800)
def test_generate_compiled_with_a_static_cache_greedy_tokens_equal_cpu():
    """``cache_implementation="static"``: the KV cache is preallocated and updated in place with
    ``index_copy_`` at ``cache_position`` (compiler/index_put.py); the decode step is one graph of fixed
    shapes, and every op of the compiled graphs runs on the card."""
    from torch_spyre.compiler import wrapper

    model = _tiny_llama()
    ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        ref = copy.deepcopy(model).generate(ids, attention_mask=torch.ones_like(ids), **kw)
    torch.compiler.reset()
    model.to("spyre")
    model.forward = torch.compile(model.forward)
    wrapper.reset_host_fallback_stats()
    torch_spyre.reset_fallback_stats()
    with torch.no_grad(), profile() as prof:
        got = model.generate(ids.to("spyre"), attention_mask=torch.ones_like(ids).to("spyre"), **kw)
    assert torch.equal(got.cpu(), ref), (got.cpu()[:, 8:], ref[:, 8:])
    assert _compiled_kernels(prof)
    assert wrapper.host_fallback_stats() == {}  # the cache update too: no host kernel in the graphs
    assert dict(torch_spyre.fallback_stats().compile_fallbacks) == {}


@pytest.mark.timeout(1800)
def test_sentence_transformer_compiled_matches_cpu(monkeypatch):
    """``SentenceTransformer(path, device="spyre").compile(dynamic=False)``: the whole module (transformer and
    pooling) is one compiled graph per input shape, every op on the card, embeddings equal to the CPU's."""
    st = pytest.importorskip("sentence_transformers")
    from torch_spyre.compiler import wrapper
    from torch_spyre.jobs.embed import model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sentences = ["The cat sits on the mat.", "Spyre is an AI accelerator."]
    ref = st.SentenceTransformer(str(model_path()), device="cpu").encode(sentences, convert_to_tensor=True)
    torch.compiler.reset()
    model = st.SentenceTransformer(str(model_path()), device="spyre")
    model.compile(dynamic=False)
    wrapper.reset_host_fallback_stats()
    with profile() as prof:
        got = model.encode(sentences, convert_to_tensor=True)
    assert got.device.type == "spyre"
    cos = torch.nn.functional.cosine_similarity(got.cpu().float(), ref, dim=-1)
    assert cos.min() >= 0.999, cos
    assert _compiled_kernels(prof)
    assert wrapper.host_fallback_stats() == {}  # every op of the graph ran on the card

"""Tiny random-weight transformers run eagerly on spyre and match the CPU."""

from __future__ import annotations

import pytest
import torch

import torch_spyre  # noqa: F401

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.models, pytest.mark.slow]


def tiny(name):
    torch.manual_seed(0)
    if name == "bert":
        cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=100)
        return transformers.BertModel(cfg).eval()
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=100)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_forward_matches_cpu(name):
    model = tiny(name)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        ref = model(ids)[0]
        out = model.to("spyre")(ids.to("spyre"))[0]
    assert out.device.type == "spyre"
    assert torch.allclose(out.cpu(), ref, atol=1e-5)


def test_greedy_generation_matches_cpu():
    model = tiny("llama")
    ids = torch.randint(0, 100, (1, 6))
    mask = torch.ones_like(ids)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    out = model.to("spyre").generate(ids.to("spyre"), attention_mask=mask.to("spyre"), max_new_tokens=4,
                                     do_sample=False, pad_token_id=0)
    assert out.device.type == "spyre" and torch.equal(out.cpu(), ref)


def test_fp16_forward_is_close_to_cpu():
    model = tiny("bert").half()
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        ref = model.float()(ids)[0]
        out = model.half().to("spyre")(ids.to("spyre"))[0]
    assert out.dtype == torch.float16
    assert torch.allclose(out.cpu().float(), ref, atol=0.05, rtol=0.05)

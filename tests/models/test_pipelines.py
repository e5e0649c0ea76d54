"""``transformers.pipeline(task, model=..., device="spyre")``: feature extraction, text classification and
text generation on the card give the CPU's answers (eager; the tokenizer is MiniLM's, shipped with the
package, so nothing is downloaded)."""

from __future__ import annotations

import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.models, pytest.mark.slow]

import torch_spyre  # noqa: E402,F401
from torch_spyre.jobs.embed import model_path  # noqa: E402

SENTENCES = ["The cat sits on the mat.", "Spyre is an AI accelerator."]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _tokenizer():
    return transformers.AutoTokenizer.from_pretrained(model_path())


def test_feature_extraction():
    path = model_path()
    ref = transformers.pipeline("feature-extraction", model=path, device="cpu")(SENTENCES)
    pipe = transformers.pipeline("feature-extraction", model=path, device="spyre")
    assert pipe.model.device.type == "spyre"
    for r, g in zip(ref, pipe(SENTENCES)):
        r, g = torch.tensor(r).flatten(), torch.tensor(g).flatten()
        assert torch.nn.functional.cosine_similarity(r, g, dim=0) >= 0.999


def test_text_classification():
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_path(), num_labels=3).eval()
    ref = transformers.pipeline("text-classification", model=copy.deepcopy(model), tokenizer=_tokenizer(),
                                device="cpu", top_k=None)(SENTENCES)
    got = transformers.pipeline("text-classification", model=model, tokenizer=_tokenizer(), device="spyre",
                                top_k=None)(SENTENCES)
    for r, g in zip(ref, got):
        assert [x["label"] for x in r] == [x["label"] for x in g]
        torch.testing.assert_close(torch.tensor([x["score"] for x in g]), torch.tensor([x["score"] for x in r]),
                                   atol=2e-3, rtol=1e-2)


@pytest.fixture
def sixteen_bit_matmuls():
    """fp32 matmuls at precision "high" (one 16-bit pass; "highest" takes six): what is tested is the pipeline on
    the card, and the 30k-token LM head's eager decode took 340 s of host time at "highest", 190 s at "high"."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.timeout(1800)  # eager decode with a 30k-token LM head: ~3 minutes of host time
def test_text_generation_greedy_tokens_equal_cpu(sixteen_bit_matmuls):
    tok = _tokenizer()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                                   eos_token_id=tok.sep_token_id)
    model = transformers.LlamaForCausalLM(cfg).eval()
    kw = dict(max_new_tokens=2, do_sample=False, return_full_text=False)
    ref = transformers.pipeline("text-generation", model=copy.deepcopy(model), tokenizer=tok, device="cpu")(
        SENTENCES[0], **kw)
    got = transformers.pipeline("text-generation", model=model, tokenizer=tok, device="spyre")(SENTENCES[0], **kw)
    assert got[0]["generated_text"] == ref[0]["generated_text"]

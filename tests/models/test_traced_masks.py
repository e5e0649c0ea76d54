"""Why aimv2 (and paligemma) fail the coverage sweep compiled: not a spyre kernel, transformers' masks.

Aimv2's text attention has ``is_causal = False`` yet its model builds a causal mask. Eagerly, with an all-ones
attention mask, ``create_causal_mask`` returns None (the causal-skip for sdpa) and the attention is then
bidirectional; traced (any ``torch.compile``, CPU included) the skip is off and the causal mask is applied. So
the compiled program is a different function from the eager one, and the sweep compares it with CPU eager.
Spyre's compiled output matches the CPU running the same traced program (docs/coverage.md, "aimv2 and
paligemma compiled")."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.models, pytest.mark.slow]

import torch_spyre  # noqa: E402,F401


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def _tiny_aimv2_text():
    torch.manual_seed(0)
    cfg = transformers.Aimv2TextConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, max_position_embeddings=16, eos_token_id=2)
    cfg._attn_implementation = "sdpa"
    model = transformers.Aimv2TextModel(cfg).eval()
    ids = torch.randint(3, 256, (2, 8))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _traced_cpu(model, inputs) -> torch.Tensor:
    torch.compiler.reset()
    with torch.no_grad():
        return torch.compile(model, backend="aot_eager")(**inputs).last_hidden_state


def test_aimv2_text_eager_and_traced_differ_on_the_cpu():
    # The cause, on the CPU alone: eager with an all-ones mask is the unmasked (bidirectional) model, traced is
    # causal. If transformers makes the two agree, this fails: rerun aimv2/paligemma in the sweep.
    model, inputs = _tiny_aimv2_text()
    with torch.no_grad():
        eager = model(**inputs).last_hidden_state
        unmasked = model(input_ids=inputs["input_ids"]).last_hidden_state
    traced = _traced_cpu(model, inputs)
    torch.testing.assert_close(eager, unmasked)
    assert _cos(traced, eager) < 0.999


def test_aimv2_text_compiled_on_spyre_matches_the_cpu_traced():
    model, inputs = _tiny_aimv2_text()
    ref = _traced_cpu(model, inputs)
    spyre_model = copy.deepcopy(model).to("spyre")
    torch.compiler.reset()
    with torch.no_grad():
        got = torch.compile(spyre_model)(**{k: v.to("spyre") for k, v in inputs.items()}).last_hidden_state.cpu()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_aimv2_text_compiled_on_spyre_matches_eager_with_a_padded_mask():
    # With a mask that is not all ones eager materializes the causal mask too: the two paths agree.
    model, inputs = _tiny_aimv2_text()
    inputs["attention_mask"][0, -2:] = 0
    with torch.no_grad():
        ref = model(**inputs).last_hidden_state
    spyre_model = copy.deepcopy(model).to("spyre")
    torch.compiler.reset()
    with torch.no_grad():
        got = torch.compile(spyre_model)(**{k: v.to("spyre") for k, v in inputs.items()}).last_hidden_state.cpu()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

"""Module conversion keeps Parameter objects, so tied weights stay tied (torch_patches.py, item 3).

Before the fix ``model.to("spyre")`` gave each module holding a shared Parameter its own copy: the tie
was lost, the weight sat on the card twice and an optimizer step updated the copies separately.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torch_spyre
from torch_spyre.device import torch_patches
from tests.zoo import tiny


class _SharedLM(nn.Module):
    """An embedding and an output projection sharing one weight, plus an untied layer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.mid = nn.Linear(32, 32)
        self.head = nn.Linear(32, 64, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids))))


def _tied_llama():
    import transformers

    cfg, _ = tiny("llama", tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg)


def _ties(model) -> list[tuple[nn.Parameter, nn.Parameter]]:
    if isinstance(model, _SharedLM):
        return [(model.head.weight, model.emb.weight)]
    return [(model.lm_head.weight, model.model.embed_tokens.weight)]


def _card_bytes_of_unique(model) -> int:
    """What the model's distinct tensors cost on the card (each shared Parameter once)."""
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(torch_spyre.get_layout(t).nbytes for t in tensors.values())


def _loss(model, ids):
    out = model(ids)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return nn.functional.cross_entropy(logits.flatten(0, -2).float(), ids.flatten())


MODELS = {"shared_parameter": _SharedLM, "llama_tied_embeddings": _tied_llama}


def test_the_patch_answers_dense_cpu_and_spyre_only():
    cpu, dev = torch.zeros(2), torch.zeros(2, device="spyre")
    assert torch._has_compatible_shallow_copy_type(cpu, dev)
    assert torch._has_compatible_shallow_copy_type(dev, cpu)
    assert torch._has_compatible_shallow_copy_type(dev, dev.half())
    assert not torch._has_compatible_shallow_copy_type(dev, torch.zeros(2, device="meta"))
    assert not torch._has_compatible_shallow_copy_type(dev, torch.zeros(2).to_sparse())
    assert torch_patches._libraries  # the kernel's torch.library registration is held


@pytest.mark.parametrize("name", sorted(MODELS))
def test_to_spyre_keeps_ties_and_counts_the_weight_once(settled, name):
    torch.manual_seed(0)
    model = MODELS[name]()
    params_before = list(model.parameters())
    assert all(a is b for a, b in _ties(model))
    base = settled()
    assert model.to("spyre") is model
    assert all(a is b for a, b in _ties(model))
    assert all(p.device.type == "spyre" and isinstance(p, nn.Parameter) for p in model.parameters())
    # The same Parameter objects (as on CUDA): optimizers built before the move still hold them.
    assert [id(p) for p in model.parameters()] == [id(p) for p in params_before]
    used = settled() - base
    assert used == _card_bytes_of_unique(model)
    tied = _ties(model)[0][0]
    model.cpu()
    assert all(a is b for a, b in _ties(model)) and tied.device.type == "cpu"
    assert settled() == base


@pytest.mark.parametrize("name", sorted(MODELS))
def test_sgd_step_on_spyre_keeps_ties_and_matches_cpu(name):
    torch.manual_seed(0)
    ref = MODELS[name]()
    model = copy.deepcopy(ref).to("spyre")
    ids = torch.randint(0, 64, (2, 8))
    for m, x in ((ref, ids), (model, ids.to("spyre"))):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        _loss(m, x).backward()
        opt.step()
    (dev_head, dev_emb), = _ties(model)
    (ref_head, _), = _ties(ref)
    assert dev_head is dev_emb and dev_head.grad is dev_emb.grad
    # One update with the summed gradient of both uses (an untied copy would get only its own half).
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4, msg=n)
    torch.testing.assert_close(dev_head.detach().cpu(), ref_head.detach(), atol=1e-5, rtol=1e-4)
    # Back to the CPU with gradients: the tie and the shared gradient survive.
    model.cpu()
    (head, emb), = _ties(model)
    assert head is emb and head.device.type == "cpu" and head.grad.device.type == "cpu"
    torch.testing.assert_close(head.grad, ref_head.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("convert", [lambda m: m.half(), lambda m: m.to(torch.float16), lambda m: m.to("spyre", torch.bfloat16)],
                         ids=["half", "to_dtype", "to_device_and_dtype"])
def test_dtype_conversion_on_spyre_keeps_ties(settled, convert):
    torch.manual_seed(0)
    ref = _SharedLM()
    base = settled()
    model = copy.deepcopy(ref).to("spyre")
    convert(model)
    head, emb = _ties(model)[0]
    assert head is emb and head.device.type == "spyre" and head.dtype in (torch.float16, torch.bfloat16)
    assert settled() - base == _card_bytes_of_unique(model)  # the fp32 copies are freed, each tensor once
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        got = model(ids.to("spyre")).cpu().float()
    torch.testing.assert_close(got, ref(ids), atol=3e-2, rtol=3e-2)


@pytest.mark.slow
@pytest.mark.models
def test_tied_llama_sgd_in_half_on_spyre_matches_cpu():
    torch.manual_seed(0)
    ref = _tied_llama()
    model = copy.deepcopy(ref).half().to("spyre")
    ids = torch.randint(0, 64, (2, 8))
    for m, x in ((ref, ids), (model, ids.to("spyre"))):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        _loss(m, x).backward()
        opt.step()
    (head, emb), = _ties(model)
    assert head is emb and head.dtype == torch.float16
    torch.testing.assert_close(head.detach().cpu().float(), ref.lm_head.weight.detach(), atol=3e-3, rtol=2e-2)

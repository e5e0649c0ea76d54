"""Adapters: the registry, automatic application on .to("spyre"), opting out, and each adapter's
equivalence with the stock model on the CPU and on spyre."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.models

import torch_spyre  # noqa: E402
from torch_spyre import adapters  # noqa: E402
from torch_spyre.coverage import catalog  # noqa: E402

MOE = "mixtral"  # a grouped_mm MoE decoder (transformers' default experts implementation)


def moe_model():
    built = catalog.build(MOE)
    assert built.model.get_experts_implementation()[""] == "grouped_mm"
    return built


def test_unknown_adapter_name_is_a_clear_error():
    with pytest.raises(ValueError, match="no adapter named .nope.; the adapters are: moe_batched_mm, complex_rope_real, fourier_real_dft"):
        adapters.adapt(torch.nn.Linear(2, 2), ["nope"])


def test_non_moe_model_gets_no_adapter():
    model = catalog.build("llama").model.to("spyre")
    assert model.spyre_adapters == ()


def test_applied_automatically_on_to_spyre_and_opt_out():
    model = moe_model().model
    assert getattr(model, "spyre_adapters", ()) == ()  # nothing happens on the CPU
    model.to("spyre")
    assert model.spyre_adapters == ("moe_batched_mm",)
    assert model.get_experts_implementation()[""] == "batched_mm"
    stock = torch_spyre.adapt(moe_model().model, adapters=[])
    stock.to("spyre")
    assert stock.spyre_adapters == () and stock.get_experts_implementation()[""] == "grouped_mm"


def test_install_works_when_transformers_is_imported_later():
    code = ("import sys, torch, torch_spyre; assert 'transformers.modeling_utils' not in sys.modules; "
            "from transformers import PreTrainedModel; "
            "print(PreTrainedModel.from_pretrained._spyre_adapts, torch.nn.Module.to.__spyre_original__ is not None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "True True", done.stderr[-2000:]


def test_a_container_moved_to_spyre_adapts_the_model_inside():
    """SentenceTransformer(path, device="spyre") moves its nn.Sequential: the transformers model inside never
    sees its own .to (it was not adapted before). The outermost model is adapted, once."""
    model = moe_model().model
    container = torch.nn.Sequential(torch.nn.ModuleDict({"auto_model": model}), torch.nn.Identity())
    container.to("spyre")
    assert model.spyre_adapters == ("moe_batched_mm",)
    assert not hasattr(model.model, "spyre_adapters")  # the inner MixtralModel is the outer model's business
    opted_out = torch_spyre.adapt(moe_model().model, adapters=[])
    torch.nn.Sequential(opted_out).to("spyre")
    assert opted_out.get_experts_implementation()[""] == "grouped_mm"


def test_loaded_straight_onto_spyre_is_adapted(tmp_path):
    """from_pretrained(..., device_map="spyre") puts the weights on the card without a .to()."""
    pytest.importorskip("accelerate")  # transformers needs it for a device_map
    moe_model().model.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="spyre")
    assert next(model.parameters()).device.type == "spyre"
    assert model.spyre_adapters == ("moe_batched_mm",)


def test_moe_batched_mm_is_equivalent_on_cpu():
    built = moe_model()
    ref = catalog.reference(built)
    adapters.adapt(built.model, ["moe_batched_mm"])
    assert built.model.spyre_adapters == ("moe_batched_mm",)
    torch.testing.assert_close(catalog.reference(built), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_moe_batched_mm_fixes_the_eager_spyre_forward():
    """Before: the stock model fails on spyre (int32 histc on the host). After: it matches the CPU."""
    built = moe_model()
    ref = catalog.reference(built)
    inputs = {k: v.to("spyre") for k, v in built.inputs.items()}
    stock = torch_spyre.adapt(moe_model().model, adapters=[]).to("spyre")
    with torch.no_grad(), pytest.raises(NotImplementedError, match="histogram_cpu"):
        stock(**inputs)
    with torch.no_grad():
        out = built.model.to("spyre")(**inputs).logits.cpu()
    assert built.model.spyre_adapters == ("moe_batched_mm",)
    # fp32 matmuls on the card round their operands for the PE arrays (docs/numerics.md): a few 1e-4.
    torch.testing.assert_close(out, ref, atol=3e-3, rtol=1e-2)
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) >= 0.9999


@pytest.mark.parametrize("model_type", ["deepseek_v2", "llama4_text"])
def test_complex_rope_real_is_equivalent_on_cpu(model_type):
    built = catalog.build(model_type)
    ref = catalog.reference(built)
    adapters.adapt(built.model, ["complex_rope_real"])
    assert built.model.spyre_adapters == ("complex_rope_real",)
    torch.testing.assert_close(catalog.reference(built), ref, atol=1e-5, rtol=1e-5)
    stock = catalog.build(model_type)  # the module's apply_rotary_emb is wrapped, a stock model is unchanged
    torch.testing.assert_close(catalog.reference(stock), ref, atol=0, rtol=0)


@pytest.mark.slow
def test_complex_rope_real_fixes_llama4_text_on_spyre():
    """Before: llama4_text fails on spyre (no complex64 on the card). After: it matches the CPU (both sides get
    moe_batched_mm, Llama 4 being a MoE model: what differs is the rotary embedding alone)."""
    built = catalog.build("llama4_text")
    ref = catalog.reference(built)
    inputs = {k: v.to("spyre") for k, v in built.inputs.items()}
    stock = torch_spyre.adapt(catalog.build("llama4_text").model, adapters=["moe_batched_mm"]).to("spyre")
    with torch.no_grad(), pytest.raises(Exception, match="cannot hold complex64"):
        stock(**inputs)
    with torch.no_grad():
        out = built.model.to("spyre")(**inputs).logits.cpu()
    assert "complex_rope_real" in built.model.spyre_adapters
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) >= 0.9999


@pytest.mark.slow
def test_complex_rope_real_fixes_the_eager_spyre_forward():
    """Before: the model fails on spyre (no complex64 on the card). After: it matches the CPU. (DeepSeek-V2 is
    a MoE model too: both sides get moe_batched_mm, so what differs is the rotary embedding alone.)"""
    built = catalog.build("deepseek_v2")
    ref = catalog.reference(built)
    inputs = {k: v.to("spyre") for k, v in built.inputs.items()}
    stock = torch_spyre.adapt(catalog.build("deepseek_v2").model, adapters=["moe_batched_mm"]).to("spyre")
    with torch.no_grad(), pytest.raises(Exception, match="cannot hold complex64"):
        stock(**inputs)
    with torch.no_grad():
        out = built.model.to("spyre")(**inputs).logits.cpu()
    assert built.model.spyre_adapters == ("moe_batched_mm", "complex_rope_real")
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) >= 0.9999


def test_real_fft2_equals_the_real_part_of_fftn():
    from torch_spyre.adapters.fourier import real_fft2

    x = torch.randn(2, 7, 12)
    torch.testing.assert_close(real_fft2(x), torch.fft.fftn(x, dim=(1, 2)).real, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="longer than 4096"):
        real_fft2(torch.zeros(1, 4097, 1))


def test_fourier_real_dft_is_equivalent_on_cpu():
    built = catalog.build("fnet")
    ref = catalog.reference(built)
    adapters.adapt(built.model, ["fourier_real_dft"])
    assert built.model.spyre_adapters == ("fourier_real_dft",)
    torch.testing.assert_close(catalog.reference(built), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_fourier_real_dft_fixes_fnet_on_spyre():
    """Before: FNet fails on spyre (its FFT makes complex64). After: eager and compiled match the CPU."""
    built = catalog.build("fnet")
    ref = catalog.reference(built)
    inputs = {k: v.to("spyre") for k, v in built.inputs.items()}
    stock = torch_spyre.adapt(catalog.build("fnet").model, adapters=[]).to("spyre")
    with torch.no_grad(), pytest.raises(Exception, match="cannot hold complex64"):
        stock(**inputs)
    model = built.model.to("spyre")
    assert model.spyre_adapters == ("fourier_real_dft",)
    with torch.no_grad():
        for fn in (model, torch.compile(model)):
            out = catalog.compared(built, fn(**inputs)).cpu()
            assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) >= 0.999

"""The DLFloat16 switch and the conversions back to the host dtypes (the bit-exact sweep is tests/test_dlfloat16.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_spyre
from torch_spyre.card import dlfloat16
from torch_spyre.device import storage


@pytest.fixture
def emulation_off():
    torch_spyre.set_dlfloat16_emulation(False)
    yield
    torch_spyre.set_dlfloat16_emulation(True)


def raw_bits(t):
    alloc = storage.allocation_of(t)
    layout = alloc.meta["layout"]
    return layout.unpack(alloc.view(np.uint16, 0, layout.device_numel))


def test_emulation_is_on_by_default_and_device_holds_dlfloat16():
    assert torch_spyre.dlfloat16_emulation()
    x = torch.tensor([1.0, -0.1, 3.0e4], dtype=torch.float16)
    t = x.to("spyre")
    assert raw_bits(t).tolist() == dlfloat16.from_float32(x.float().numpy()).tolist()


def test_switch_off_stores_ieee_bits(emulation_off):
    x = torch.tensor([1 + 2**-10, 65504.0, float("inf")], dtype=torch.float16)
    t = x.to("spyre")
    assert raw_bits(t).tolist() == x.view(torch.int16).numpy().view(np.uint16).tolist()
    assert torch.equal(t.cpu(), x)  # exact, inf kept
    assert torch.equal((t * 1).cpu(), x)


def test_switch_applies_to_new_allocations_only(emulation_off):
    torch_spyre.set_dlfloat16_emulation(True)
    a = torch.tensor([1 + 2**-10], dtype=torch.float16).to("spyre")
    torch_spyre.set_dlfloat16_emulation(False)
    b = torch.tensor([1 + 2**-10], dtype=torch.float16).to("spyre")
    assert a.cpu().item() == 1 + 2**-9 and b.cpu().item() == 1 + 2**-10


def test_env_switch(run_python):
    r = run_python("import torch, torch_spyre; print(torch.tensor([1 + 2**-10], dtype=torch.float16).to('spyre').cpu().item())",
                   env={"TORCH_SPYRE_DLFLOAT16": "0"})
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == 1 + 2**-10


def test_bf16_comes_back_through_fp32_round_to_nearest_even():
    # bf16 has fewer fraction bits than DLFloat16: values in range come back exactly.
    x = torch.tensor([1.0078125, -3.140625, 1e-5, 1e9], dtype=torch.bfloat16)
    assert torch.equal(x.to("spyre").cpu(), x)
    # beyond DLFloat16's range: overflow gives the NaN/Inf code (NaN), underflow gives signed zero
    big = torch.tensor([1e10, -1e30, 1e-12, -1e-12], dtype=torch.bfloat16).to("spyre").cpu()
    assert big[0].isnan() and big[1].isnan()
    assert big[2].item() == 0.0 and big[3].item() == 0.0 and torch.signbit(big[3])


def test_fp32_is_stored_exactly():
    x = torch.tensor([1e-40, 3.4e38, float("inf"), -0.0])
    assert torch.equal(x.to("spyre").cpu(), x)

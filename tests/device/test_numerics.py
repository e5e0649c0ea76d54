"""The DLFloat16 switch and the conversions back to the host dtypes (the bit-exact sweep is tests/test_dlfloat16.py)."""

from __future__ import annotations

import math
from fractions import Fraction

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


def _dlfloat16_value(bits: int) -> Fraction | None:
    """Independent reference: the exact value of a DLFloat16 bit pattern (None for the NaN/Inf code)."""
    sign = -1 if bits & 0x8000 else 1
    e, m = (bits >> 9) & 63, bits & 511
    if e == 63 and m == 511:
        return None
    if bits & 0x7FFF == 0:
        return Fraction(0)
    return sign * Fraction(2) ** (e - 31) * (1 + Fraction(m, 512))


def _bf16_round_to_nearest_even(v: Fraction) -> float:
    """Independent reference: ``v`` rounded to bf16 (8 significant bits), ties to even, in exact arithmetic."""
    if v == 0:
        return 0.0
    a = abs(v)
    exp = a.numerator.bit_length() - a.denominator.bit_length()  # 2**exp <= a < 2**(exp + 2)
    if a < Fraction(2) ** exp:
        exp -= 1
    if a >= Fraction(2) ** (exp + 1):
        exp += 1
    ulp = Fraction(2) ** (exp - 7)
    q = a / ulp
    n = q.numerator // q.denominator
    rest = q - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    return float((1 if v > 0 else -1) * n * ulp)


def test_bf16_comes_back_through_fp32_round_to_nearest_even():
    # bf16 has fewer fraction bits than DLFloat16: values that went in as bf16 come back exactly.
    x = torch.tensor([1.0078125, -3.140625, 1e-5, 1e9], dtype=torch.bfloat16)
    assert torch.equal(x.to("spyre").cpu(), x)
    # beyond DLFloat16's range: overflow gives the NaN/Inf code (NaN), underflow gives signed zero
    big = torch.tensor([1e10, -1e30, 1e-12, -1e-12], dtype=torch.bfloat16).to("spyre").cpu()
    assert big[0].isnan() and big[1].isnan()
    assert big[2].item() == 0.0 and big[3].item() == 0.0 and torch.signbit(big[3])


def test_bf16_result_of_a_card_op_rounds_to_nearest_even():
    """A DLFloat16 value that is not a bf16, made on the card, comes back rounded to nearest even.

    Every fp16 normal value with a zero last fraction bit is exactly a DLFloat16 number, so it reaches the
    card unchanged; converting it to bf16 there (an op on the card) must round its 9 fraction bits to
    bf16's 7, ties to even, as an independent exact computation says.
    """
    bits = np.arange(0, 1 << 16, 2, dtype=np.uint16)
    exp = (bits >> 10) & 31
    bits = bits[(exp > 0) & (exp < 31)]  # normal fp16 values
    x16 = torch.from_numpy(bits.view(np.int16)).view(torch.float16)
    d16 = x16.to("spyre")
    assert torch.equal(d16.cpu(), x16)  # exactly DLFloat16 numbers: nothing rounded on the way in
    out = d16.to(torch.bfloat16)
    assert out.device.type == "spyre" and out.dtype == torch.bfloat16
    got = out.cpu().float().tolist()
    expected = [_bf16_round_to_nearest_even(Fraction(v)) for v in x16.float().tolist()]
    assert got == expected
    # the sample is not trivial: many values are not bf16 numbers, ties go both ways, some carry
    truncated = x16.float().view(torch.int32).bitwise_and(~0xFFFF).view(torch.float32).tolist()
    ups = sum(g != t for g, t in zip(got, truncated))
    assert ups > 5000 and sum(g == t for g, t in zip(got, x16.float().tolist())) > 5000
    assert _bf16_round_to_nearest_even(Fraction(1) + Fraction(1, 256)) == 1.0                   # tie, even below
    assert _bf16_round_to_nearest_even(Fraction(1) + Fraction(3, 256)) == 1.0 + 2 ** -6        # tie, even above
    assert 1.0 + 2 ** -6 in [g for g, v in zip(got, x16.float().tolist()) if v == 1.0 + 3 / 256]


def test_every_dlfloat16_pattern_comes_back_to_bf16_rounded_to_nearest_even():
    """All 65,536 DLFloat16 patterns, as a card kernel would write them into a bf16 tensor's memory."""
    patterns = np.arange(1 << 16, dtype=np.uint16)
    t = torch.empty(1 << 16, dtype=torch.bfloat16, device="spyre")
    alloc = storage.allocation_of(t)
    layout = alloc.meta["layout"]
    assert alloc.meta["encoding"] == "dlfloat16"
    alloc.view(np.uint16, 0, layout.device_numel)[:] = layout.pack(patterns)
    got = t.cpu().float()
    for bits, g in zip(patterns.tolist(), got.tolist()):
        v = _dlfloat16_value(bits)
        if v is None:
            assert math.isnan(g), hex(bits)
        elif v == 0:
            assert g == 0.0 and math.copysign(1, g) == (-1 if bits & 0x8000 else 1), hex(bits)
        else:
            assert g == _bf16_round_to_nearest_even(v), (hex(bits), float(v), g)


def test_fp32_is_stored_exactly():
    x = torch.tensor([1e-40, 3.4e38, float("inf"), -0.0])
    assert torch.equal(x.to("spyre").cpu(), x)


def test_host_fallback_computes_16_bit_ops_in_fp32():
    """finfo(float16).min is -65536 in DLFloat16. Read as fp16 it would be -inf, and -inf stored back is the
    NaN/Inf code: Hugging Face's fp16 padding mask would turn every padded row into NaN. The host path reads
    DLFloat16 as fp32, computes in fp32 and encodes the fp32 result once, as the card does."""
    lo = torch.finfo(torch.float16).min
    x = torch.randn(4, 80, dtype=torch.float16)
    keep = torch.rand(4, 80) > 0.5
    keep[:, 0] = True
    mask = torch.where(keep.to("spyre"), torch.tensor(0.0, dtype=torch.float16).to("spyre"), lo)
    out = (x.to("spyre") + mask).softmax(-1)
    assert out.dtype == torch.float16
    ref = (x.float() + torch.where(keep, 0.0, lo)).softmax(-1)
    assert not out.cpu().isnan().any()
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-3, rtol=1e-2)
    assert set(torch_spyre.fallback_stats()) >= {"where.self", "add.out", "_softmax.out"}
    # One rounding: -2.11328125 * 1.427734375 = -3.0172043 (fp32) is nearest -3.015625 in DLFloat16; through
    # fp16 it would first become -3.017578, the midpoint of two DLFloat16 values, which rounds away to -3.0195.
    a, b = torch.tensor([-2.11328125], dtype=torch.float16), torch.tensor([1.427734375], dtype=torch.float16)
    assert (a.to("spyre") * b.to("spyre")).cpu().item() == -3.015625


def test_host_fallback_keeps_the_cpu_dtype_rules():
    a = torch.randn(3, 5, dtype=torch.float16).to("spyre")
    assert (a + torch.randn(3, 5).to("spyre")).dtype == torch.float32  # promotion as on the CPU
    assert a.sum(dtype=torch.float32).dtype == torch.float32
    assert (a > 0).dtype == torch.bool and a.argmax().dtype == torch.int64
    v, i = a.max(-1)
    assert v.dtype == torch.float16 and i.dtype == torch.int64


def test_fp32_to_fp16_on_the_card_rounds_once():
    """``x.half()`` of a spyre fp32 tensor converts on the card: fp32 straight to DLFloat16 (one rounding,
    ties away from zero). Through IEEE fp16 first, a value rounded onto a DLFloat16 tie would round again
    (-1.12583983 -> fp16 -1.1259765625, a DLFloat16 tie -> -1.126953125; the card gives -1.125), and
    1e6 (beyond fp16, inside DLFloat16's range) would become inf."""
    dtype = torch.float16
    x = torch.tensor([-1.1258398294448853, 2.0 + 3 * 2**-11, 1e6, -3.0e-5] * 16)
    on_card = x.to("spyre").to(dtype)
    assert on_card.dtype == dtype
    held = on_card.float().cpu()  # DLFloat16 -> fp32 is exact
    torch.testing.assert_close(held, torch.from_numpy(dlfloat16.round_float32(x.numpy())), rtol=0, atol=0)
    assert held[0].item() == -1.125


@pytest.mark.parametrize("mode", ["host", "compile"])
def test_a_conversion_to_bf16_on_the_card_gives_the_cpus_bf16(mode, monkeypatch):
    """``x.bfloat16()`` of a spyre fp32 (or fp16) tensor rounds as torch does, to nearest even at 8 bits, and
    DLFloat16 holds the bf16 value exactly. fp32 straight to DLFloat16 rounds twice (9 bits ties away, then
    bf16 when read): 6.92009163 would become 6.9375 instead of the CPU's 6.90625, about 1 value in 8."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    x = torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 10
    x[0] = 6.92009162902832
    got = x.to("spyre").bfloat16()
    assert got.dtype == torch.bfloat16 and got.device.type == "spyre"
    assert torch.equal(got.cpu(), x.bfloat16())
    assert got.cpu()[0].item() == 6.90625
    assert int((torch.from_numpy(dlfloat16.round_float32(x.numpy())).bfloat16() != x.bfloat16()).sum()) > 1000
    h = x.half()  # fp16 -> bf16: the fp16 value the card holds (DLFloat16), rounded to bf16 as on the CPU
    held = h.to("spyre")
    assert torch.equal(held.bfloat16().cpu(), held.cpu().bfloat16())


def test_host_fallback_honours_an_op_told_its_dtype():
    """An op with an explicit dtype computes in it on the host: its out= must have that dtype
    (masked.cumprod on fp16 reached ``cumprod.out(dtype=float16)`` with an fp32 out and raised)."""
    x = torch.rand(4, 8, dtype=torch.float16, generator=torch.Generator().manual_seed(0)) + 0.5
    mask = torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) > 0.3
    got = torch.masked.cumprod(x.to("spyre"), 1, mask=mask.to("spyre"))
    assert got.dtype == torch.float16
    card_x = torch.from_numpy(dlfloat16.round_float32(x.float().numpy())).half()
    torch.testing.assert_close(got.cpu(), torch.masked.cumprod(card_x, 1, mask=mask), atol=3e-2, rtol=2e-2)
    out = torch.empty(4, 8, dtype=torch.float16).to("spyre")
    torch.cumprod(x.to("spyre"), 0, dtype=torch.float16, out=out)
    torch.testing.assert_close(out.cpu(), torch.cumprod(card_x, 0), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("mode", ["host", "compile"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_soft_margin_loss_intermediate_beyond_dlfloat16_range(dtype, mode, monkeypatch):
    """soft_margin_loss's composite kernel stores exp(-target * input) in the input's dtype before its
    log1p: exp(67) is beyond DLFloat16's largest finite (8.573e9) and the loss came back NaN, where the
    result (67) is representable. The op runs as one program (or on the host in fp32) instead
    (registration.ONE_PROGRAM_OPS): forward and backward match float64."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    x = torch.tensor([-0.369, 3.53, 8.125, 1.83, -8.8125]).to(dtype).to("spyre").cpu()
    y = torch.tensor([-8.5625, 5.4375, -8.25, -4.375, 5.25]).to(dtype).to("spyre").cpu()
    for reduction in ("none", "mean", "sum"):
        want = torch.nn.functional.soft_margin_loss(x.double(), y.double(), reduction=reduction)
        xd = x.to("spyre").requires_grad_()
        got = torch.nn.functional.soft_margin_loss(xd, y.to("spyre"), reduction=reduction)
        torch.testing.assert_close(got.cpu().double(), want, atol=2e-2, rtol=2e-2, msg=reduction)
        xw = x.double().requires_grad_()
        torch.nn.functional.soft_margin_loss(xw, y.double(), reduction=reduction).sum().backward()
        got.sum().backward()
        torch.testing.assert_close(xd.grad.cpu().double(), xw.grad, atol=2e-2, rtol=2e-2, msg=reduction)

"""DLFloat16 bit for bit: all 65,536 fp16 and bf16 bit patterns through the spyre device.

The reference here is independent of torch_spyre/card/dlfloat16.py: exact rational arithmetic
(fractions.Fraction) on the formats' definitions (IBM ARITH 2019 for DLFloat16, IEEE 754 for fp16/bf16).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import torch_spyre  # noqa: F401
from torch_spyre.device import storage

NAN = "nan"
INF = "inf"


# --- independent reference -------------------------------------------------------------------------
def ieee_decode(bits: int, exp_bits: int, frac_bits: int):
    """(sign, value) with value a Fraction, INF or NAN."""
    sign = bits >> (exp_bits + frac_bits) & 1
    e = bits >> frac_bits & ((1 << exp_bits) - 1)
    f = bits & ((1 << frac_bits) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    if e == (1 << exp_bits) - 1:
        return sign, (NAN if f else INF)
    if e == 0:
        return sign, Fraction(f, 1 << frac_bits) * Fraction(2) ** (1 - bias)
    return sign, (1 + Fraction(f, 1 << frac_bits)) * Fraction(2) ** (e - bias)


def floor_log2(v: Fraction) -> int:
    e = v.numerator.bit_length() - v.denominator.bit_length()
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    return e


def dlf_encode(sign: int, value) -> int:
    """DLFloat16 bits: round to nearest, ties away from zero; overflow, inf and NaN -> the special code."""
    s = sign << 15
    if value in (NAN, INF):
        return s | 0x7FFF
    if value == 0:
        return s
    e = floor_log2(value)
    q = math.floor((value / Fraction(2) ** e - 1) * 512 + Fraction(1, 2))  # ties away (value > 0)
    if q == 512:
        q, e = 0, e + 1
    biased = e + 31
    if biased > 63 or (biased == 63 and q == 511):
        return s | 0x7FFF
    if biased < 0 or (biased == 0 and q == 0):
        return s
    return s | biased << 9 | q


def dlf_decode(bits: int):
    sign = bits >> 15
    mag = bits & 0x7FFF
    if mag == 0x7FFF:
        return sign, NAN
    if mag == 0:
        return sign, Fraction(0)
    return sign, (1 + Fraction(mag & 0x1FF, 512)) * Fraction(2) ** ((mag >> 9) - 31)


def ieee_encode_rne(sign: int, value, exp_bits: int, frac_bits: int) -> int:
    """IEEE bits of ``value`` rounded to nearest even; magnitudes beyond the largest finite become inf."""
    s = sign << (exp_bits + frac_bits)
    top = (1 << exp_bits) - 1
    if value == NAN:
        return s | top << frac_bits | 1 << (frac_bits - 1)
    if value == 0:
        return s
    bias = (1 << (exp_bits - 1)) - 1
    e = max(floor_log2(value), 1 - bias)  # subnormals share the smallest exponent
    ulp = Fraction(2) ** (e - frac_bits)
    n = round(value / ulp)  # Fraction.__round__ rounds half to even
    rounded = n * ulp
    largest = (2 - Fraction(1, 1 << frac_bits)) * Fraction(2) ** bias
    if rounded > largest:
        return s | top << frac_bits
    if n >= 1 << (frac_bits + 1):  # carried into the next binade
        n //= 2
        e += 1
    if n < 1 << frac_bits:  # subnormal
        return s | n
    return s | (e + bias) << frac_bits | (n - (1 << frac_bits))


def is_nan_bits(bits: np.ndarray, exp_bits: int, frac_bits: int) -> np.ndarray:
    top = (1 << exp_bits) - 1
    return ((bits.astype(np.int64) >> frac_bits) & top == top) & (bits.astype(np.int64) & ((1 << frac_bits) - 1) != 0)


FORMATS = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}


def device_bits(t: torch.Tensor) -> np.ndarray:
    """The DLFloat16 bits the card holds for a whole, contiguous spyre tensor, in host order."""
    alloc = storage.allocation_of(t)
    layout = alloc.meta["layout"]
    return layout.unpack(alloc.view(np.uint16, 0, layout.device_numel))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_every_bit_pattern(dtype):
    exp_bits, frac_bits = FORMATS[dtype]
    patterns = np.arange(1 << 16, dtype=np.uint32)
    host = torch.from_numpy(patterns.astype(np.uint16).view(np.int16)).view(dtype)

    expected_device = np.empty(1 << 16, dtype=np.uint16)
    expected_back = np.empty(1 << 16, dtype=np.uint16)
    for b in range(1 << 16):
        sign, value = ieee_decode(b, exp_bits, frac_bits)
        d = dlf_encode(sign, value)
        expected_device[b] = d
        expected_back[b] = ieee_encode_rne(*dlf_decode(d), exp_bits, frac_bits)

    on_card = host.to("spyre")
    assert np.array_equal(device_bits(on_card), expected_device), "device memory differs from DLFloat16"

    back = on_card.cpu().view(torch.int16).numpy().view(np.uint16)
    nan_expected = is_nan_bits(expected_back, exp_bits, frac_bits)
    nan_got = is_nan_bits(back, exp_bits, frac_bits)
    assert np.array_equal(nan_got, nan_expected)
    assert np.array_equal(back[~nan_expected], expected_back[~nan_expected])


def test_documented_edge_cases():
    x = torch.tensor([65504.0, 1 + 2**-10, 1 + 3 * 2**-10, float("inf"), -float("inf"), 2**-24], dtype=torch.float16)
    y = x.to("spyre").cpu()
    assert y[0].item() == math.inf  # 65504 rounds to 65536 in DLFloat16 (9-bit fraction) and overflows fp16
    assert y[1].item() == 1 + 2**-9  # a tie of the 9-bit fraction rounds away from zero
    assert y[2].item() == 1 + 4 * 2**-10  # and away again (not to even)
    assert math.isnan(y[3].item()) and math.isnan(y[4].item())  # one NaN/Inf code: inf comes back NaN
    assert y[5].item() == 2**-24  # fp16 subnormals are normal numbers in DLFloat16


def test_float32_is_not_rounded():
    x = torch.randn(1000) * 1e6
    assert torch.equal(x.to("spyre").cpu(), x)


def test_reference_agrees_with_card_module_on_fp32_samples():
    from torch_spyre.card import dlfloat16

    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=4000, dtype=np.uint64).astype(np.uint32)
    vals = bits.view(np.float32)
    got = dlfloat16.from_float32(vals)
    for b, g in zip(bits.tolist(), got.tolist()):
        sign, value = ieee_decode(b, 8, 23)
        assert g == dlf_encode(sign, value), hex(b)


def test_65504_is_the_only_finite_fp16_that_comes_back_infinite():
    x = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    x = x[torch.isfinite(x)]
    y = x.to("spyre").cpu()
    assert x[torch.isinf(y)].tolist() == [65504.0]


def _from_float32_step_by_step(values: np.ndarray) -> np.ndarray:
    """DLFloat16 rounding written out field by field (the card module fuses it into one integer formula)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    sign = ((bits >> 16) & 0x8000).astype(np.uint16)
    mag = bits & 0x7FFFFFFF
    rounded = mag + np.uint32(1 << 13)  # half an ulp of the 9-bit fraction: ties away from zero
    exp6 = (rounded >> 23).astype(np.int32) - (127 - 31)
    frac = ((rounded >> 14) & 0x1FF).astype(np.uint16)
    out = (np.clip(exp6, 0, 63).astype(np.uint16) << 9) | frac
    overflow = (exp6 > 63) | ((exp6 == 63) & (frac == 0x1FF)) | (mag >= 0x7F800000)
    underflow = (exp6 < 0) | (mag < 0x00800000) | ((exp6 == 0) & (frac == 0))
    out = np.where(underflow, np.uint16(0), np.where(overflow, np.uint16(0x7FFF), out))
    return out | sign


def test_from_float32_on_every_rounding_class():
    """The result depends only on the sign, the exponent and the top 10 fraction bits (9 kept, 1 for
    rounding): every combination of those 19 bits, with the 13 bits below all clear and all set."""
    from torch_spyre.card import dlfloat16

    top = np.arange(1 << 19, dtype=np.uint32) << np.uint32(13)
    bits = np.concatenate([top, top | np.uint32(0x1FFF)])
    values = bits.view(np.float32)
    np.testing.assert_array_equal(dlfloat16.from_float32(values), _from_float32_step_by_step(values))


def test_from_float32_table_is_the_formula():
    """``from_float32`` gathers from a table of the formula's codes: any fp32 bits give the formula's code."""
    from torch_spyre.card import dlfloat16

    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    np.testing.assert_array_equal(dlfloat16.from_float32(values), dlfloat16._from_float32_arith(values))

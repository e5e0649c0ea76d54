"""The transcendental family and friends as vector-unit ops (card/vector_ops.py), compiled: acos, asin,
atan, sinh, cosh, tan, asinh, acosh, atanh, erfc, atan2, fmod, copysign, hypot, signbit, logical_xor and
``div`` with ``rounding_mode`` floor/trunc. Each is compared with torch on the CPU (fp32, and fp16 at
DLFloat16 tolerances on the inputs as the card holds them) with nothing run eagerly or on the host.
"""

from __future__ import annotations

import pytest
import torch

import torch_spyre
from torch_spyre.card import dlfloat16
from torch_spyre.compiler import wrapper

from .spyre_compile_helpers import TOL, run_compiled

DTYPES = [torch.float32, torch.float16]


def dl_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the card holds it, in fp32 (fp16 is DLFloat16 on the card)."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return x.float()
    return torch.from_numpy(dlfloat16.round_float32(x.float().numpy()))


def uniform(lo, hi, *shape, seed=0):
    return lo + (hi - lo) * torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


# name -> (fn, input ranges); the ranges keep the results well-conditioned (no poles, no branch cuts)
UNARY = {
    "acos": (torch.acos, (-0.9, 0.9)), "asin": (torch.asin, (-0.9, 0.9)), "atan": (torch.atan, (-5, 5)),
    "sinh": (torch.sinh, (-3, 3)), "cosh": (torch.cosh, (-3, 3)), "tan": (torch.tan, (-1.2, 1.2)),
    "asinh": (torch.asinh, (-5, 5)), "acosh": (torch.acosh, (1.1, 6)), "atanh": (torch.atanh, (-0.9, 0.9)),
    "erfc": (torch.special.erfc, (-2, 2)),
}
BINARY = {
    "atan2": (torch.atan2, (-3, 3), (-3, 3)),
    "fmod": (torch.fmod, (-9, 9), (0.5, 2)),
    "copysign": (torch.copysign, (0, 4), (-1, 1)),
    "hypot": (torch.hypot, (-4, 4), (-4, 4)),
    "div_floor": (lambda a, b: torch.div(a, b, rounding_mode="floor"), (-9, 9), (0.5, 2)),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), (-9, 9), (0.5, 2)),
}


def check_on_card(fn, *args):
    got = run_compiled(fn, *args)
    ref = fn(*[dl_round(a) if a.is_floating_point() else a for a in args])
    assert wrapper.host_fallback_stats() == {}
    stats = torch_spyre.fallback_stats()
    assert dict(stats) == {} and stats.compile_fallbacks == {}, (dict(stats), stats.compile_fallbacks)
    return got, ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    fn, (lo, hi) = UNARY[name]
    x = uniform(lo, hi, 12, 100).to(dtype)
    got, ref = check_on_card(lambda a: fn(a) * 0.5 + 1, x)  # fused with other pointwise ops
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    fn, ra, rb = BINARY[name]
    a, b = uniform(*ra, 10, 70, seed=1).to(dtype), uniform(*rb, 10, 70, seed=2).to(dtype)
    if name == "copysign":
        b[0, :8] = torch.tensor([0.0, -0.0] * 4, dtype=dtype)  # the sign of zeros too
    got, ref = check_on_card(fn, a, b)
    torch.testing.assert_close(got.float(), ref.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_signbit_and_logical_xor(dtype):
    a = uniform(-2, 2, 9, 64, seed=3).to(dtype)
    a[0, :4] = torch.tensor([0.0, -0.0, 1.0, -1.0], dtype=dtype)
    b = uniform(-2, 2, 9, 64, seed=4).to(dtype)
    b[1, :6] = 0
    got, ref = check_on_card(lambda x, y: (torch.signbit(x), torch.logical_xor(x > 0.5, y)), a, b)
    for g, r in zip(got, ref):
        assert g.dtype == torch.bool and torch.equal(g, r)


def test_integer_fmod_has_the_sign_of_the_dividend():
    a = torch.tensor([[-7, 7, -8, 8, 5, -5] * 11])
    b = torch.tensor([[3, -3, 3, -3, 5, 2] * 11])
    got, ref = check_on_card(torch.fmod, a, b)
    assert torch.equal(got, ref)

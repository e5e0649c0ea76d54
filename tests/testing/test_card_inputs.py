"""How the templates compare 16-bit results with the CPU (testing/card_inputs.py)."""

from __future__ import annotations

import pytest
import torch

from torch_spyre.testing.card_inputs import as_card_result

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_infinity_the_card_returns_as_nan_or_as_itself_matches(dtype):
    expected = torch.tensor([INF, -INF, 1.0, INF, 2.0], dtype=dtype)
    # the card's one NaN/Inf code reads back as NaN; a value beyond fp16's range held finite reads back as inf
    card = torch.tensor([NAN, NAN, 1.0, INF, 2.0], dtype=dtype)
    torch.testing.assert_close(card, as_card_result(expected, card), equal_nan=True)
    assert as_card_result(expected, card)[3].item() == INF  # the same infinity stays an infinity
    nested = as_card_result((expected, [expected]), (card, [card]))
    torch.testing.assert_close(nested, (card, [card]), equal_nan=True)


def test_a_nan_or_a_finite_value_where_the_cpu_gives_something_else_still_fails():
    expected = torch.tensor([INF, 3.0, -INF], dtype=torch.float16)
    wrong = torch.tensor([5.0, NAN, INF], dtype=torch.float16)  # finite for inf, NaN for 3, +inf for -inf
    held = as_card_result(expected, wrong)
    assert torch.equal(held, expected)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wrong, held, equal_nan=True)
    f32 = torch.tensor([INF])  # float32 holds infinities on the card: nothing changes
    assert as_card_result(f32, torch.tensor([NAN])).item() == INF


def test_a_bf16_value_beyond_dlfloat16s_range_matches_the_nan_the_card_returns():
    """bf16 reaches 3.4e38, DLFloat16 8.573e9: the card stores a larger result as its NaN/Inf code (overflow,
    docs/numerics.md), which reads back as NaN (polygamma near a pole gives 5.6e12 on the CPU in bf16)."""
    expected = torch.tensor([5.6e12, -1e10, 8.0e9, 3.0], dtype=torch.bfloat16)
    card = torch.tensor([NAN, NAN, NAN, 3.0], dtype=torch.bfloat16)
    held = as_card_result(expected, card)
    assert held[:2].isnan().all()  # beyond the range: the card's overflow
    assert held[2].item() == expected[2].item()  # 8.0e9 is finite in DLFloat16: NaN there is wrong
    with pytest.raises(AssertionError):
        torch.testing.assert_close(card, held, equal_nan=True)
    scalar = as_card_result(torch.tensor(2.0, dtype=torch.bfloat16), torch.tensor(2.0, dtype=torch.bfloat16))
    assert scalar.shape == () and scalar.item() == 2.0  # a 0-dim reference keeps its shape
    finite = torch.tensor([1.0, 1.0, 8.0e9, 3.0], dtype=torch.bfloat16)  # a finite result for 5.6e12 is wrong
    with pytest.raises(AssertionError):
        torch.testing.assert_close(finite, as_card_result(expected, finite), equal_nan=True)


def _raised(outer, inner):
    try:
        try:
            raise inner
        except Exception as e:
            raise outer from e
    except Exception as e:  # noqa: BLE001
        return e


def test_a_compile_that_refuses_a_dtype_is_a_refusal_not_a_failure():
    """torch.compile wraps the compiler's UnsupportedDtypeError (log_softmax with dtype=float64) in Dynamo's
    errors: the templates find it in the chain of causes and skip the sample, as eager refusals are."""
    from torch_spyre.compiler.kernel_spec import UnsupportedDtypeError
    from torch_spyre.device.dtypes import UnsupportedDtypeError as DeviceUnsupportedDtypeError
    from torch_spyre.testing.card_inputs import refused

    wrapped = _raised(RuntimeError("backend compiler failed"), UnsupportedDtypeError("computes in float64"))
    assert refused(wrapped)
    assert refused(DeviceUnsupportedDtypeError("the Spyre card cannot hold float64 tensors"))
    assert refused(_raised(RuntimeError("backend compiler failed"), DeviceUnsupportedDtypeError("cannot hold")))
    assert not refused(_raised(RuntimeError("backend compiler failed"), ValueError("float64")))
    assert not refused(TypeError("unsupported operand"))

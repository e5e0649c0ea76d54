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

"""fp32 matmuls at PyTorch's ``torch.get_float32_matmul_precision()``.

The PE arrays multiply 16-bit floats (DLFloat16 on the card: 10 significant bits) and accumulate in fp32;
they have no fp32 multiply. PyTorch's convention for fp32 matmuls is the precision setting:

- ``"highest"`` (PyTorch's default): fp32-accurate results. Each fp32 operand is split into three
  DLFloat16 parts, ``x = hi + mid + lo`` (each part the DLFloat16 rounding of what the previous ones left,
  so 30 significant bits cover fp32's 24), and the product is the sum of the six part products above
  2^-30 of the result's scale: hi·hi, hi·mid, mid·hi, hi·lo, lo·hi, mid·mid. Each is one 16-bit matmul
  with fp32 accumulation; they are summed smallest first. Cost: six matmul passes plus the split (a
  pointwise pass per operand), all on the card and all in the timing model.
- ``"high"`` and ``"medium"``: one pass on the operands rounded once to 16 bits (about 3 decimal digits
  per product, fp32 accumulation): the PE arrays' full rate.

Operands whose magnitude is below DLFloat16's range (about 4.7e-10) lose their low parts to underflow
there, as every DLFloat16 value does.
"""

from __future__ import annotations

import torch

from .._torch import inductor as torch_inductor

# Part index pairs (0 = hi, 1 = mid, 2 = lo) of the products each precision sums, largest first.
PASSES: dict[str, tuple[tuple[int, int], ...]] = {
    "highest": ((0, 0), (0, 1), (1, 0), (0, 2), (2, 0), (1, 1)),
    "high": ((0, 0),),
    "medium": ((0, 0),),
}


def precision() -> str:
    """The precision fp32 matmuls are compiled for now (``torch.get_float32_matmul_precision()``)."""
    return torch.get_float32_matmul_precision()


def passes() -> tuple[tuple[int, int], ...]:
    return PASSES[precision()]


def dlfloat16_parts(x, count: int) -> list:
    """``count`` 16-bit IR nodes whose fp32 sum is ``x`` to ``10 * count`` significant bits: each part is
    realized (stored, so it holds exactly what the PE arrays will read) before the next one is taken
    from the remainder."""
    sub = torch_inductor.lowering_for(torch.ops.aten.sub.Tensor)
    parts, rest = [], x
    for i in range(count):
        part = torch_inductor.realize_input(torch_inductor.to_dtype(rest, torch.float16))
        parts.append(part)
        if i + 1 < count:
            rest = sub(rest, torch_inductor.to_dtype(part, torch.float32))
    return parts


def sum_smallest_first(terms: list) -> object:
    """The sum of fp32 IR nodes ``terms`` (largest first), added from the smallest."""
    add = torch_inductor.lowering_for(torch.ops.aten.add.Tensor)
    total = terms[-1]
    for term in reversed(terms[:-1]):
        total = add(term, total)
    return total

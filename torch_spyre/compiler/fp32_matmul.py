"""fp32 matmuls at PyTorch's ``torch.get_float32_matmul_precision()``.

The PE arrays multiply 16-bit floats (DLFloat16 on the card: 10 significant bits) and accumulate in fp32;
they have no fp32 multiply. PyTorch's convention for fp32 matmuls is the precision setting:

- ``"highest"`` (PyTorch's default): fp32-accurate results. Each fp32 operand is split into three
  DLFloat16 parts, ``x = hi + mid + lo`` (each part the DLFloat16 rounding of what the previous ones left,
  so 30 significant bits cover fp32's 24), and the product is the sum of the six part products above
  2^-30 of the result's scale: hi·hi, hi·mid, mid·hi, hi·lo, lo·hi, mid·mid. The six products are one
  16-bit matmul over a K six times as long (:func:`k_concatenated`): A's parts side by side along K,
  B's stacked along K in the matching order, smallest products first, all accumulated in fp32 by the PE
  arrays of one kernel, whose epilogue (bias, activation, residual) then applies once. Cost: six times
  the PE work and operand traffic of one pass plus the split (pointwise kernels writing the parts), all
  on the card and in the timing model; what one kernel saves over six is the five kernels' launches and
  their fp32 partial results' round trips through device memory, and the kernel summing them.
- ``"high"`` and ``"medium"``: one pass on the operands rounded once to 16 bits (about 3 decimal digits
  per product, fp32 accumulation): the PE arrays' full rate.

Operands whose magnitude is below DLFloat16's range (about 4.7e-10) lose their low parts to underflow
there, as every DLFloat16 value does.
"""

from __future__ import annotations

import torch

from .._torch import inductor as torch_inductor

STICK_ELEMENTS = 64  # 16-bit values in one 128-byte stick

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


def k_concatenated(a, b, passes: tuple[tuple[int, int], ...]) -> tuple:
    """16-bit IR nodes ``(a2, b2)`` whose product is the sum of ``passes``' part products of fp32 ``a``
    (``[..., M, K]``) and ``b`` (``[..., K, N]``): ``a2`` is ``[..., M, len(passes) * K]`` with A's part of
    each pass side by side, ``b2`` ``[..., len(passes) * K, N]`` with B's matching parts stacked. The
    passes go smallest first along K so that the small products are summed before the large ones. A K
    that is not a whole number of 16-bit sticks (64 elements) is padded with zeros to one in each pass,
    so that every part starts on a stick (the concatenation moves whole sticks) and the padding adds
    only 0 * 0 products; the PE arrays work on K in whole sticks anyway (``codegen/matmul``). Each side
    is also available alone (:func:`a_concatenated`, :func:`b_concatenated`): an eager matmul reuses a
    weight's B side across calls (``weight_parts.py``)."""
    return a_concatenated(a, passes), b_concatenated(b, passes)


def _part_count(passes: tuple[tuple[int, int], ...]) -> int:
    return 1 + max(max(p) for p in passes)


def _k_pad(k) -> int:
    return int(-k % STICK_ELEMENTS) if isinstance(k, int) or getattr(k, "is_number", False) else 0


def a_concatenated(a, passes: tuple[tuple[int, int], ...]):
    """:func:`k_concatenated`'s ``a2``: A's parts side by side along K in the passes' order."""
    return _concatenated(a, passes, 0)


def b_concatenated(b, passes: tuple[tuple[int, int], ...]):
    """:func:`k_concatenated`'s ``b2``: B's parts stacked along K in the passes' order."""
    return _concatenated(b, passes, 1)


def _concatenated(x, passes: tuple[tuple[int, int], ...], side: int):
    """The parts of operand ``side`` (0: A, K its last dim; 1: B, K its second last) concatenated along K."""
    parts = dlfloat16_parts(x, _part_count(passes))
    if len(passes) == 1:
        return parts[passes[0][side]]
    k_dim = -1 if side == 0 else -2
    pad = _k_pad(x.get_size()[k_dim])
    if pad:
        pad_nd = torch_inductor.lowering_for(torch.ops.aten.constant_pad_nd.default)
        parts = [pad_nd(p, [0, pad] if side == 0 else [0, 0, 0, pad], 0.0) for p in parts]
    cat = torch_inductor.lowering_for(torch.ops.aten.cat.default)
    return cat([parts[p[side]] for p in reversed(passes)], k_dim)


def b_parts_rows(k: int, passes: tuple[tuple[int, int], ...]) -> int:
    """The K of :func:`b_concatenated`'s result for an operand of K rows."""
    return k if len(passes) == 1 else len(passes) * (k + -k % STICK_ELEMENTS)

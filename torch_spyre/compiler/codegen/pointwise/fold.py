"""Constant folding with the card's own arithmetic: values the compiler computes itself (index-only
values, ops on constants) must equal what the simulated vector unit would compute, so they are computed
by the vector unit's own op tables (``card/vector_ops.py``, which the card's executor runs too), here and
nowhere else in the generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....card import vector_ops
from ....program import Scalar
from ...kernel_ir import LoweringError
from .values import Value


def card_op(op: str, args: list[np.ndarray], promote: bool = False) -> Any:
    """``op`` of numpy ``args`` as the card computes it (``promote``: first bring the inputs to the card's
    computation type, fp32 or int64, as the vector unit does), or None when the card has no such op."""
    fn = vector_ops.ELEMENTWISE.get(op)
    if fn is None:
        return None
    with np.errstate(all="ignore"):
        return fn(*(vector_ops.promote(op, args) if promote else args))


def fold_scalar(v: Value, ins: list[Scalar]) -> float | int | bool:
    """Value ``v`` of constant inputs ``ins``, as a Python scalar of the value's scratchpad dtype."""
    vals = [np.asarray(x.value) for x in ins]
    op = "copy" if v.op in ("to_dtype", "cast") else v.op
    r = card_op(op, [np.asarray(a, dtype=np.float32) if np.asarray(a).dtype.kind == "f" else a for a in vals],
                promote=True)
    if r is None:
        raise LoweringError(f"cannot fold {v.op} on constants")
    r = np.asarray(r).item()
    if v.sp_dtype in ("float32", "dlfloat16"):
        return float(r)
    if v.sp_dtype == "bool":
        return bool(r)
    return int(r)

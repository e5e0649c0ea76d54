"""What the vector unit computes: the semantics of every elementwise and reduce op, public so that the
executor and the compiler's constant folding compute one thing the same way.

Values are computed on decoded numbers (:func:`decode`): fp32 for floats (dlfloat16 included), int64 for
integers, bool for bool. :func:`promote` brings an op's inputs to one computation type as torch would,
the tables below compute, and :func:`encode` rounds the result to the scratchpad dtype. The op names
(by arity) are the program's: :mod:`torch_spyre.program.ops`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .dlfloat16 import from_float32, to_float32

# How each scratchpad dtype is held in numpy (dlfloat16 as its raw bits).
NP_DTYPES: dict[str, np.dtype] = {
    "dlfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
FLOAT_DTYPES = frozenset({"dlfloat16", "float32"})

# Ops whose result is floating point whatever the inputs (torch promotes integers for them).
FLOAT_RESULT_OPS = frozenset(
    {"exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "sin", "cos", "gelu",
     "gelu_tanh", "silu", "div", "acos", "asin", "atan", "sinh", "cosh", "tan", "asinh", "acosh", "atanh", "erfc",
     "atan2", "copysign", "hypot"}
)
# Ops computed by torch's CPU kernels that take a vectorized path for the bulk of an array and a scalar
# one for its tail: an element's bits depend on where it sits in the array. Whoever must reproduce the
# executor's bits (the fast executor) computes these on arrays of the very same shape.
# tests/card/test_vector_ops.py checks that every other op is position-independent.
POSITION_DEPENDENT_OPS = frozenset({"sigmoid", "erf", "gelu", "gelu_tanh", "silu"})
# Ops whose result is 0/1.
BOOL_RESULT_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not",
                             "signbit"})


# torch computes these (numpy has no erf/gelu, and its sigmoid would round differently).
def _erf(x: np.ndarray) -> np.ndarray:
    return torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _erfc(x: np.ndarray) -> np.ndarray:
    return torch.special.erfc(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    return torch.nn.functional.gelu(torch.from_numpy(np.ascontiguousarray(x)), approximate=approximate).numpy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return torch.sigmoid(torch.from_numpy(np.ascontiguousarray(x))).numpy()


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "abs": np.abs,
    "relu": lambda x: np.maximum(x, x.dtype.type(0)),  # NaN propagates, like torch.relu
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "reciprocal": lambda x: np.float32(1) / x,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "erf": _erf,
    "sin": np.sin,
    "cos": np.cos,
    "floor": lambda x: x if x.dtype.kind == "i" else np.floor(x),
    "ceil": lambda x: x if x.dtype.kind == "i" else np.ceil(x),
    "round": lambda x: x if x.dtype.kind == "i" else np.round(x),  # half to even, like torch.round
    "sign": np.sign,
    "logical_not": lambda x: x == 0,
    "square": np.square,
    "gelu": lambda x: _gelu(x, "none"),
    "gelu_tanh": lambda x: _gelu(x, "tanh"),
    "silu": lambda x: x * _sigmoid(x),
    "copy": lambda x: x,
    "cast": lambda x: x,
    "acos": np.arccos,
    "asin": np.arcsin,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tan": np.tan,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "erfc": _erfc,
    "signbit": np.signbit,  # -0.0 and negative NaNs too, like torch.signbit
}

BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,  # NaN propagates, like torch.maximum
    "minimum": np.minimum,
    "pow": np.power,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "logical_and": lambda a, b: (a != 0) & (b != 0),
    "logical_or": lambda a, b: (a != 0) | (b != 0),
    "remainder": np.mod,  # sign of the divisor, like torch.remainder / Python's %
    "floordiv": np.floor_divide,
    "atan2": np.arctan2,
    "fmod": np.fmod,  # sign of the dividend, like torch.fmod / C's fmod
    "copysign": np.copysign,
    "hypot": np.hypot,
}

TERNARY: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "where": lambda c, a, b: np.where(c != 0, a, b),
    "fma": lambda a, b, c: a * b + c,
}

# Every elementwise op, whatever its arity (the three tables share no name).
ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {**UNARY, **BINARY, **TERNARY}

REDUCE: dict[str, tuple[Callable[..., np.ndarray], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    # op -> (reduction over an axis, how to combine with the previous value when accumulating). The
    # ufuncs' own reduce is what np.sum/max/min/prod call on an ndarray, without their Python wrapper
    # (a few microseconds, and the fast executor runs thousands of small reductions per forward).
    "sum": (np.add.reduce, np.add),
    "max": (np.maximum.reduce, np.maximum),
    "min": (np.minimum.reduce, np.minimum),
    "prod": (np.multiply.reduce, np.multiply),
}


def promote(op: str, values: list[np.ndarray]) -> list[np.ndarray]:
    """Bring inputs to one computation type: fp32 if any is floating point (or the op always gives a
    float), else int64. ``where``'s condition keeps its own type."""
    typed = values[1:] if op == "where" else values
    is_float = op in FLOAT_RESULT_OPS or any(v.dtype.kind == "f" for v in typed)
    target = np.float32 if is_float else np.int64
    if op == "cast":
        return values
    if op == "where":
        return [values[0]] + [np.asarray(v, dtype=target) for v in typed]
    return [np.asarray(v, dtype=target) for v in values]


def integer_operand_error(op: str, a: np.ndarray, b: np.ndarray) -> str | None:
    """Why a binary op cannot run on these (promoted) integer operands, or None: the cases where
    torch raises instead of returning a value."""
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        if op in ("remainder", "floordiv", "fmod") and np.any(b == 0):
            return f"integer {op} by zero"
        if op == "pow" and np.any(b < 0):
            return "integers to negative integer powers are not allowed (cast to float first)"
    return None


def compute(op: str, values: list[np.ndarray]) -> np.ndarray:
    """``op`` on decoded values as the vector unit computes it (promoted, IEEE specials silent), before
    rounding to the output dtype. Does not check :func:`integer_operand_error`."""
    values = promote(op, values)
    with np.errstate(all="ignore"):
        return ELEMENTWISE[op](*values)


def scalar(value: float | int | bool) -> np.ndarray:
    """An immediate operand, like a Python scalar in torch: an int keeps integer math, a float makes it fp32."""
    if isinstance(value, (bool, int, np.integer)):
        return np.array(int(value), dtype=np.int64)
    return np.array(value, dtype=np.float32)


def decode(view: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Scratchpad values of ``dtype`` as computed on: fp32 for floats, int64 for integers, bool for bool
    (always a copy; DLFloat16 may be decoded into ``out``, an fp32 array of the view's shape)."""
    if dtype == "dlfloat16":
        return to_float32(view, out)
    if out is not None:
        raise ValueError(f"decode into an array is for dlfloat16 only, not {dtype}")
    if dtype == "float32" or dtype == "bool":
        return np.array(view)
    return view.astype(np.int64)


DEFAULT_NAN = np.float32(np.nan)  # fp32's default quiet NaN, 0x7FC00000


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """Computed values (fp32, int64 or bool) in the scratchpad representation of ``dtype``.

    Every computed NaN is written as one NaN (DLFloat16's special code with the sign clear, fp32's default
    quiet NaN). Which of several NaN operands an operation returns, and so its sign, depends on how the
    host's SIMD loops happen to walk an array; one NaN makes results reproducible bit for bit whatever
    the walk (the fast executor computes several cores' tensors in one array)."""
    if dtype in FLOAT_DTYPES:
        values = np.asarray(values, dtype=np.float32)
        if values.size and np.isnan(values.min()):  # min propagates NaN: one pass, no mask, when none
            values = np.where(np.isnan(values), DEFAULT_NAN, values)
        return from_float32(values) if dtype == "dlfloat16" else values
    if dtype == "bool":
        return np.asarray(values) != 0
    values = np.asarray(values)
    if values.dtype.kind == "f":
        # Float to integer truncates toward zero, like torch's .to(int).
        with np.errstate(invalid="ignore"):
            return np.trunc(values).astype(NP_DTYPES[dtype])
    return values.astype(NP_DTYPES[dtype])

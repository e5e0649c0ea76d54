"""The pointwise generator's vocabulary: the values of a kernel's DAG, the dtypes they are computed in and
the tables that lower Inductor's ops to the card's elementwise ops.

A value of the kernel (:class:`Value`) is one op over the kernel's iteration space; its *extent* says
over which part of that space it varies (every element, the outer dims only, a scalar, or a static
index-only value the compiler evaluates itself) and its *phase* in which pass over a reduction chunk
it is computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ....errors import SpyreError
from ....program import SP_DTYPES
from ...kernel_ir import UnsupportedDtypeError, check_computable


class AddressSpanError(SpyreError, ValueError):
    """A core would address more device memory than ``core_address_span_bytes`` allows."""


# Inductor dtype name -> scratchpad dtype of computed values.
COMPUTE_DTYPES = {
    "float16": "dlfloat16", "bfloat16": "dlfloat16", "float32": "float32", "int64": "int64", "int32": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}
# Inductor op -> program op (direct).
DIRECT_OPS = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "div": "div", "int_truediv": "div",
    "neg": "neg", "abs": "abs", "relu": "relu", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "reciprocal": "reciprocal", "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf", "sin": "sin", "cos": "cos",
    "floor": "floor", "ceil": "ceil", "round": "round", "sign": "sign", "logical_not": "logical_not",
    "square": "square", "maximum": "maximum", "minimum": "minimum", "pow": "pow", "lt": "lt", "le": "le",
    "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne", "logical_and": "logical_and", "logical_or": "logical_or",
    "remainder": "remainder", "mod": "fmod",  # ops.mod is C's % (sign of the dividend)
    "floordiv": "floordiv", "where": "where", "fma": "fma",
    "libdevice_exp": "exp", "libdevice_sqrt": "sqrt", "libdevice_abs": "abs", "libdevice_log": "log",
    "floor_to_int": "floor", "ceil_to_int": "ceil", "round_to_int": "round",
    "acos": "acos", "asin": "asin", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tan": "tan", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "erfc": "erfc", "atan2": "atan2", "fmod": "fmod", "copysign": "copysign",
    "hypot": "hypot", "signbit": "signbit", "div_rn": "div",  # div_rn: IEEE division, which the card's div is
    "logical_xor": "ne",  # Inductor converts logical_xor's operands to bool first
}
# Bit operations the card has only as logical operations: right for bool operands only.
BOOL_ONLY_OPS = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_not": "logical_not",
                 "and_": "logical_and", "or_": "logical_or", "xor": "ne", "bitwise_xor": "ne"}
def bool_only_refusal(op: str, operand_dtypes: set) -> str | None:
    """Why a bit operation cannot run on these operands (the card has logical operations only), or None."""
    kinds = {d for d in operand_dtypes if d}
    if op in BOOL_ONLY_OPS and kinds - {"bool"}:
        return (f"{op} on {sorted(kinds)} has no Spyre lowering: the vector unit has logical, not bitwise, "
                "operations (bool operands only)")
    return None


REDUCE_IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}
MAX_BOXES_PER_TILE = 4096

@dataclass
class Value:
    gid: int
    op: str  # "load", "store", "const", "static", "iindex", "reduction", "alias", or a program op
    args: list[Any]  # gids of inputs (ints) or literals
    dtype: str | None  # Inductor dtype name
    node: int
    attrs: dict[str, Any] = field(default_factory=dict)
    extent: str = "full"  # "full", "outer", "scalar", "static"
    guards: set = field(default_factory=set)  # static masks that must hold where the value is used
    phase: int = 0  # full values: the pass that computes them; outer values: the stage after which they exist

    @property
    def sp_dtype(self) -> str:
        """Scratchpad dtype of the value. 16-bit float values are kept in fp32 between ops (the vector
        unit computes in fp32; Inductor's GPU backends upcast the same way); only an explicit
        ``to_dtype`` rounds to DLFloat16 (which has no infinities: -inf becomes its NaN code)."""
        dt = compute_dtype(self.dtype)
        if dt == "dlfloat16" and self.op != "to_dtype":
            return "float32"
        return dt


def compute_dtype(name: str | None) -> str:
    if name is None:
        return "float32"
    check_computable(name, "the kernel")
    try:
        return COMPUTE_DTYPES[name]
    except KeyError:
        raise UnsupportedDtypeError(f"the Spyre card cannot compute in {name}; use float16 or float32") from None


def literal(v: Any) -> float | int | bool:
    if isinstance(v, str):
        return float(v)
    return v


def acc_dtype(v: Value) -> str:
    """Accumulators: fp32 for floating values, int64 for integers."""
    dt = v.sp_dtype
    if dt == "dlfloat16":
        return "float32"
    if dt in ("int32", "int16", "int8", "uint8", "bool"):
        return "int64"
    return dt


def itemsize(dt: str) -> int:
    """Bytes of one element of scratchpad dtype ``dt``."""
    return SP_DTYPES[dt]


def is_ref(a: Any) -> bool:
    """Whether an op argument is a value (a gid) rather than a literal."""
    return isinstance(a, int) and not isinstance(a, bool)

"""The names of the vector unit's operations, by arity: what an ``Elementwise`` or ``Reduce`` may ask for.

Their semantics (what each computes) live with the card, in :mod:`torch_spyre.card.vector_ops`.
"""

from __future__ import annotations

UNARY_OPS = frozenset(
    {
        "copy", "cast", "neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh",
        "sigmoid", "erf", "sin", "cos", "floor", "ceil", "round", "sign", "logical_not", "square",
        "gelu", "gelu_tanh", "silu", "acos", "asin", "atan", "sinh", "cosh", "tan", "asinh", "acosh", "atanh",
        "erfc", "signbit",
    }
)
BINARY_OPS = frozenset(
    {
        "add", "sub", "mul", "div", "maximum", "minimum", "pow", "lt", "le", "gt", "ge", "eq", "ne",
        "logical_and", "logical_or", "remainder", "floordiv", "atan2", "fmod", "copysign", "hypot",
    }
)
TERNARY_OPS = frozenset({"where", "fma"})
# Ops the vector unit computes with its slower transcendental path (timing only).
TRANSCENDENTAL_OPS = frozenset(
    {"exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "sin", "cos", "pow", "div",
     "gelu", "gelu_tanh", "silu", "acos", "asin", "atan", "sinh", "cosh", "tan", "asinh", "acosh", "atanh", "erfc",
     "atan2", "fmod", "hypot"}
)
REDUCE_OPS = frozenset({"sum", "max", "min", "prod"})

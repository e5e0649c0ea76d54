"""The vector unit's public op semantics (card/vector_ops.py): the tables cover exactly the program's op
names, the executor's private names still reach the same tables, and the helpers compute as torch does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_spyre.card import vector_ops
from torch_spyre.card.dlfloat16 import round_float32
from torch_spyre.program import BINARY_OPS, REDUCE_OPS, TERNARY_OPS, UNARY_OPS


def test_tables_cover_the_program_op_names():
    assert set(vector_ops.UNARY) == UNARY_OPS
    assert set(vector_ops.BINARY) == BINARY_OPS
    assert set(vector_ops.TERNARY) == TERNARY_OPS
    assert set(vector_ops.REDUCE) == REDUCE_OPS
    assert set(vector_ops.ELEMENTWISE) == UNARY_OPS | BINARY_OPS | TERNARY_OPS


def test_promote_and_compute_follow_torch():
    ints = [np.array([7, -7]), np.array([2, 2])]
    assert vector_ops.compute("floordiv", ints).tolist() == torch.tensor([7, -7]).div(2, rounding_mode="floor").tolist()
    assert vector_ops.compute("div", ints).dtype == np.float32  # div always gives a float
    assert vector_ops.compute("add", [np.array([1]), vector_ops.scalar(0.5)]).tolist() == [1.5]
    assert vector_ops.scalar(2).dtype == np.int64 and vector_ops.scalar(2.0).dtype == np.float32


def test_integer_operand_errors():
    assert vector_ops.integer_operand_error("remainder", np.array([1]), np.array([0])) == "integer remainder by zero"
    assert "negative integer powers" in vector_ops.integer_operand_error("pow", np.array([2]), np.array([-1]))
    assert vector_ops.integer_operand_error("remainder", np.array([1.0]), np.array([0.0])) is None


@pytest.mark.parametrize("dtype", ["dlfloat16", "float32", "int32", "bool"])
def test_encode_decode_round_trip(dtype):
    values = np.array([0.0, 1.0, -3.0, 2.5], dtype=np.float32)
    decoded = vector_ops.decode(vector_ops.encode(values, dtype), dtype)
    expected = {"dlfloat16": round_float32(values), "float32": values,
                "int32": np.trunc(values), "bool": values != 0}[dtype]
    assert np.array_equal(decoded, expected)


@pytest.mark.parametrize("op", sorted(set(vector_ops.ELEMENTWISE) - vector_ops.POSITION_DEPENDENT_OPS))
def test_ops_not_listed_position_dependent_give_the_same_bits_anywhere_in_an_array(op):
    """The fast executor computes these over several cores' tensors at once: an element's result must
    not depend on where it sits in the array (torch's kernels, e.g. sigmoid, round a tail differently)."""
    rng = np.random.default_rng(1)
    arity = 1 if op in vector_ops.UNARY else 2 if op in vector_ops.BINARY else 3
    values = [(rng.standard_normal(4099) * 4).astype(np.float32) for _ in range(arity)]
    for v in values:  # NaNs of both signs and infinities too: which NaN comes out must not move either
        v[rng.choice(v.size, 400, replace=False)] = rng.choice(np.array([np.nan, -np.nan, np.inf, -np.inf], np.float32), 400)
    whole = vector_ops.compute(op, values)
    for start in range(0, 200, 13):
        part = vector_ops.compute(op, [v[start:start + 19].copy() for v in values])
        np.testing.assert_array_equal(part.view(np.uint8), whole[start:start + 19].view(np.uint8), err_msg=op)


def test_position_dependent_list_is_needed():
    """At least one listed op really does give other bits in an array's tail (else drop the list)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4099) * 4).astype(np.float32)
    differs = []
    for op in sorted(vector_ops.POSITION_DEPENDENT_OPS):
        whole = vector_ops.compute(op, [x])
        parts = np.concatenate([vector_ops.compute(op, [x[s:s + 19].copy()]) for s in range(0, 4080, 19)])
        differs.append(not np.array_equal(parts.view(np.uint32), whole[:parts.size].view(np.uint32)))
    assert any(differs)


def test_computed_nans_are_written_as_one_nan_and_infinities_keep_their_sign():
    v = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.5], np.float32)
    assert vector_ops.encode(v, "dlfloat16").tolist() == [0x7FFF, 0x7FFF, 0x7FFF, 0xFFFF, 0x3F00]
    assert vector_ops.encode(v, "float32").view(np.uint32).tolist()[:4] == [0x7FC00000, 0x7FC00000, 0x7F800000, 0xFF800000]


def test_decode_into_an_array_matches_decode():
    bits = np.random.default_rng(0).integers(0, 1 << 16, (3, 64), dtype=np.uint64).astype(np.uint16)
    view = bits[:, ::2]  # a strided view, as the chains' device tiles are
    out = np.empty(view.shape, np.float32)
    got = vector_ops.decode(view, "dlfloat16", out=out)
    assert got is out
    np.testing.assert_array_equal(out.view(np.uint32), vector_ops.decode(view, "dlfloat16").view(np.uint32))
    with pytest.raises(ValueError, match="dlfloat16 only"):
        vector_ops.decode(np.zeros(4, np.float32), "float32", out=np.empty(4, np.float32))

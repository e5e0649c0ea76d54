"""kernel_ir.py: Inductor scheduler nodes -> KernelSpec (ops, indices, placements, provenance)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_spyre.compiler.kernel_ir import DynamicShapeError, KernelSpec, RecordingHandler, check_computable

from .spyre_compile_helpers import fresh, specs_of


def test_pointwise_spec_has_loads_stores_and_provenance():
    (spec,) = specs_of(lambda a, b: torch.relu(a + b), torch.randn(16, 32), torch.randn(16, 32))
    ops = [o.op for n in spec.nodes for o in n.ops]
    assert ops.count("load") == 2 and "store" in ops and "relu" in ops
    assert spec.kind == "pointwise" and spec.r_sizes == []
    assert any("aten.add" in s for s in spec.source_ops) and any("relu" in s for s in spec.source_ops)
    assert any("test_kernel_ir.py" in line for line in spec.source_lines)
    assert {b.role for b in spec.buffers} == {"input", "output"}
    # JSON round trip
    again = KernelSpec.from_json(spec.to_json())
    assert again.describe() == spec.describe()


def test_softmax_is_one_fused_reduction_kernel():
    specs = specs_of(lambda a: torch.softmax(a, -1), torch.randn(8, 64))
    assert len(specs) == 1
    spec = specs[0]
    assert spec.kind == "reduction" and spec.r_sizes == [64]
    reductions = [o.attrs["reduction"] for n in spec.nodes for o in n.ops if o.op == "reduction"]
    assert reductions == ["max", "sum"]


def test_welford_becomes_mean_and_centred_sum():
    (spec,) = specs_of(lambda a: torch.var_mean(a, -1), torch.randn(8, 64))
    reductions = [o.attrs["reduction"] for n in spec.nodes for o in n.ops if o.op == "reduction"]
    assert reductions.count("sum") >= 2


def test_masked_loads_carry_their_guards():
    (spec,) = specs_of(lambda a, b: torch.cat([a, b]), torch.randn(4, 8), torch.randn(3, 8))
    guarded = [o for n in spec.nodes for o in n.ops if o.op == "load" and o.attrs.get("guards")]
    assert len(guarded) == 2


def test_dynamic_shapes_give_a_symbolic_spec_that_specializes():
    (spec,) = specs_of(lambda a: a * 2, torch.randn(8, 16), dynamic=True)
    assert spec.symbols and all(isinstance(s, str) for s in spec.symbols)
    assert any(isinstance(d, str) for d in spec.x_sizes + spec.buffers[0].size)
    values = {s: 8 if i == 0 else 16 for i, s in enumerate(spec.symbols)}
    static = KernelSpec.from_json(spec.to_json()).specialize(values)
    assert static.symbols == [] and all(isinstance(d, int) for d in static.x_sizes + static.buffers[0].size)
    with pytest.raises(DynamicShapeError, match="needs the values of shape symbols"):
        spec.specialize({})


def test_dtype_check():
    check_computable("float16", "x")
    with pytest.raises(TypeError, match="float64"):
        check_computable("float64", "op add")


def test_indirect_indexing_is_recorded_and_resolved_when_static():
    import sympy

    from torch_spyre.compiler.kernel_ir import LoweringError

    h = RecordingHandler({"x0"})
    i = h.index_expr(sympy.Symbol("x0"), torch.int64)
    sym = h.indirect_indexing(i, 10)
    assert str(sym) == "ind0" and h.ops[-1].op == "indirect" and h.ops[-1].attrs["size"] == 10
    assert h.check_bounds(sym, 10, True, True) is None
    assert issubclass(DynamicShapeError, LoweringError)
    # x[arange(n) * 2]: the index is computed by a pointwise kernel, the rows by the gather generator
    specs = specs_of(lambda a: a[torch.arange(8, device=a.device) * 2] + 1, torch.randn(16, 4).half())
    assert [s.generator for s in specs].count("gather") == 1

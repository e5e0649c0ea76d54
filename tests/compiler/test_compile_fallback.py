"""Ops the compiler cannot lower never fail the compile (compiler/fallback.py): they run as the eager op
on the device, are counted (``torch_spyre.fallback_stats().compile_fallbacks``, the profiler's
``compile_fallbacks()``), warned about once per op, and give torch's answer.

The ops used here have no lowering for the card: if one gets a lowering, pick another for the test.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_spyre
import torch_spyre.profiler
from torch_spyre.card import dlfloat16
from torch_spyre.compiler import wrapper
from torch_spyre.compiler.kernel_ir import UnsupportedDtypeError

from .spyre_compile_helpers import TOL, fresh

DTYPES = [torch.float32, torch.float16]


def dl_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the card holds it (fp16 is DLFloat16 on the card), in fp32: the CPU reference's input."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return x.float()
    return torch.from_numpy(dlfloat16.round_float32(x.float().numpy()))


def compiled_with_warnings(fn, *args):
    """fn compiled on spyre copies of ``args``, called twice: (CPU results of the second call, the
    compile-fallback warnings of each call, the fallback counters of the second call)."""
    fresh()
    wrapper.reset_compile_fallback_warnings()
    dev = [a.to("spyre") for a in args]
    compiled = torch.compile(fn)
    calls = []
    for _ in range(2):
        torch_spyre.reset_fallback_stats()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = compiled(*dev)
        calls.append([str(w.message) for w in caught if "has no lowering for the card" in str(w.message)])
    stats = torch_spyre.fallback_stats()
    return out.cpu(), calls, stats


def lgamma_digamma(x):
    return torch.lgamma(x + 2) * 0.5 + torch.special.digamma(x + 2)


def index_add_then_scale(x, idx, src):
    return x.index_add(0, idx, src) * 2 + 1


def scatter_add_relu(x, idx, src):
    return torch.relu(x.scatter_add(1, idx, src) - 0.5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_missing_pointwise_ops_fall_back_with_right_results(dtype):
    x = torch.rand(16, 80, generator=torch.Generator().manual_seed(0)).to(dtype)
    got, calls, stats = compiled_with_warnings(lgamma_digamma, x)
    ref = lgamma_digamma(dl_round(x))
    torch.testing.assert_close(got.float(), ref, **TOL[dtype])
    assert stats.compile_fallbacks == {"aten.digamma.default": 1, "aten.lgamma.default": 1}
    # Warned at the first call, once per op, naming the op and why; not again.
    assert len(calls[0]) == 2 and calls[1] == []
    assert any("aten.lgamma.default" in m and "'lgamma' has no Spyre lowering" in m for m in calls[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulating_store_falls_back(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 64, generator=g).to(dtype)
    src = torch.randn(6, 64, generator=g).to(dtype)
    idx = torch.tensor([0, 3, 3, 9, 0, 5])
    got, calls, stats = compiled_with_warnings(index_add_then_scale, x, idx, src)
    ref = index_add_then_scale(dl_round(x), idx, dl_round(src))
    torch.testing.assert_close(got.float(), ref, **TOL[dtype])
    assert list(stats.compile_fallbacks) == ["aten.index_put.default"]
    assert len(calls[0]) == 1 and "atomic_add" in calls[0][0]


def test_scatter_add_falls_back_and_the_rest_stays_on_the_card():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 96, generator=g)
    src = torch.randn(4, 32, generator=g)
    idx = torch.randint(0, 96, (4, 32), generator=g)
    got, calls, stats = compiled_with_warnings(scatter_add_relu, x, idx, src)
    torch.testing.assert_close(got, scatter_add_relu(x, idx, src), **TOL[torch.float32])
    assert len(stats.compile_fallbacks) == 1 and len(calls[0]) == 1
    assert wrapper.host_fallback_stats() == {}  # the relu and the subtraction ran as card kernels


def test_profiler_counts_compile_fallbacks():
    x = torch.rand(8, 64, generator=torch.Generator().manual_seed(3))
    fresh()
    dev = x.to("spyre")
    compiled = torch.compile(lgamma_digamma)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(dev)
        with torch_spyre.profiler.profile() as prof:
            compiled(dev)
            compiled(dev)
    assert prof.compile_fallbacks() == {"aten.digamma.default": 2, "aten.lgamma.default": 2}
    tagged = [r for r in prof.events() if "compile_fallback" in r.details]
    assert tagged and all(r.end >= r.start for r in tagged)


def test_dtype_refusals_are_not_fallbacks():
    """A dtype the card cannot compute in keeps its clear error (nothing would make it right)."""
    x = torch.rand(4, 64)
    fresh()
    with pytest.raises(Exception) as info:
        torch.compile(lambda a: (a.double() + 1).float())(x.to("spyre"))
    assert isinstance(info.value, UnsupportedDtypeError) or "float64" in str(info.value)


def test_a_kernel_refused_at_code_generation_falls_back_too():
    """Without the check at lowering, the kernel spec refuses lgamma at code generation: the ops of that
    fused node are marked and the graph compiled again with them as fallback kernels."""
    from torch_spyre._torch import inductor as torch_inductor
    from torch_spyre.compiler.fallback import lowering_refusal

    x = torch.rand(8, 64, generator=torch.Generator().manual_seed(4))
    torch_inductor.guard_lowerings(lambda *args: None)
    try:
        got, calls, stats = compiled_with_warnings(lambda a: torch.lgamma(a + 2) * 0.5, x)
    finally:
        torch_inductor.guard_lowerings(lowering_refusal)
    torch.testing.assert_close(got, torch.lgamma(x + 2) * 0.5, **TOL[torch.float32])
    # The whole fused node's ops fell back (add, lgamma, mul): over-cautious, still right.
    assert "aten.lgamma.default" in stats.compile_fallbacks
    assert any("aten.lgamma.default" in m for m in calls[0])


@pytest.mark.parametrize("error", ["LoweringError", "CodegenError"])
def test_a_kernel_whose_program_cannot_be_generated_falls_back(error):
    """Programs are generated at run time, where nothing can fall back: the compile generates each fused
    pointwise/reduction kernel's program for the placements the wrapper allocates, and a kernel whose
    generator refuses (as the batch norm backward's did, "load ... has no view in this box") has its ops
    marked and the graph compiled again with them as fallback kernels: a warning once per op, counted,
    torch's answer. Kernels that do generate keep their program for their first call."""
    from torch_spyre.compiler import access, kernel_ir, kernel_runtime

    refusal = access.CodegenError if error == "CodegenError" else kernel_ir.LoweringError

    def refuse_sums(spec):
        make = real(spec)
        if spec.generator or not any("sum" in op for op in spec.source_ops):
            return make

        def generate(*args, **kwargs):
            raise refusal(f"kernel {spec.name}: refused by the test")
        return generate

    def fn(a):
        return torch.relu((a * 2.375).sum(-1)) + 1.625  # constants no other test uses: a kernel of this content
        # generated before in the process would not be generated again (kernel_runtime.check_program)

    x = torch.rand(8, 64, generator=torch.Generator().manual_seed(5))
    real = kernel_runtime.generator_for
    kernel_runtime.generator_for = refuse_sums
    try:
        got, calls, stats = compiled_with_warnings(fn, x)
    finally:
        kernel_runtime.generator_for = real
    torch.testing.assert_close(got, fn(x), **TOL[torch.float32])
    assert stats.compile_fallbacks.get("aten.sum.dim_IntList") == 1, stats.compile_fallbacks
    assert any("aten.sum.dim_IntList" in m and "refused by the test" in m for m in calls[0]), calls[0]
    assert calls[1] == []  # warned once


def test_kernels_that_generate_use_the_program_the_compile_made():
    x = torch.rand(8, 64, generator=torch.Generator().manual_seed(6))
    wrapper.reset_shape_cache_stats()
    # (constants no other test uses, as above)
    got, calls, stats = compiled_with_warnings(lambda a: torch.softmax(a * 3.125, -1) + a, x)
    torch.testing.assert_close(got, torch.softmax(x * 3.125, -1) + x, **TOL[torch.float32])
    assert not stats.compile_fallbacks and calls == [[], []]
    counts = wrapper.shape_cache_stats()
    assert counts["checked"] >= 1 and counts["checked"] <= counts["programs"], counts

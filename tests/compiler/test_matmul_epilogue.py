"""Matmul epilogue fusion from compiled graphs (compiler/epilogue.py): bias, activation and residual folded
into the matmul kernel, its results against the CPU, and what the ``matmul_epilogue`` switch changes."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from torch_spyre.compiler import epilogue, optimizations

from .spyre_compile_helpers import TOL, profiled_kernels, run_compiled

ACTS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


def rnd(*shape, dtype=torch.float16, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def linear_act_residual(act):
    return lambda x, w, b, r: act(F.linear(x, w, b)) + r


def linear_inputs(dtype):
    # x [B, S, K]: the Linear's addmm works on [B*S, K] and is viewed back; bias [N] broadcasts over rows.
    return rnd(2, 64, 128, dtype=dtype), rnd(192, 128, dtype=dtype, scale=0.1, seed=1), \
        rnd(192, dtype=dtype, seed=2), rnd(2, 64, 192, dtype=dtype, seed=3)


@pytest.fixture
def debug_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    return tmp_path


def decisions_in(path) -> list[dict]:
    out = []
    for f in sorted(os.listdir(path)):
        if f.endswith(".program.json"):
            with open(os.path.join(path, f)) as fh:
                out.append(json.load(fh)["metadata"]["decisions"])
    return out


def expect(fn, args, dtype):
    """CPU eager in fp32 (fp64 for fp32 inputs), cast to the compiled result's dtype."""
    ref_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    return fn(*[a.to(ref_dtype) for a in args]).to(dtype)


def profiled(fn, args, off: bool = False):
    """(kernel records of the second call, result on the CPU) of ``fn`` compiled with the epilogue switch."""
    return profiled_kernels(fn, args, ("matmul_epilogue",) if off else ())


# --- correctness against the CPU -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("act", sorted(ACTS))
def test_fp16_linear_activation_residual_matches_cpu(act, debug_dir):
    fn, args = linear_act_residual(ACTS[act]), linear_inputs(torch.float16)
    got = run_compiled(fn, *args)
    torch.testing.assert_close(got, expect(fn, args, torch.float16), **TOL[torch.float16])
    fused = [d for d in decisions_in(debug_dir) if d.get("fusion")]
    assert fused and all(d["kind"] == "matmul" for d in fused)
    assert fused[0]["fusion"]["epilogue"] == ["bias", act, "residual"]
    assert fused[0]["fusion"]["optimization"] == "matmul_epilogue"


@pytest.mark.slow
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_fp32_linear_activation_residual_matches_cpu(act, precision, debug_dir):
    fn, args = linear_act_residual(ACTS[act]), linear_inputs(torch.float32)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        got = run_compiled(fn, *args)
    finally:
        torch.set_float32_matmul_precision(before)
    # "high": one pass on operands rounded to DLFloat16, so DLFloat16's tolerance; "highest": fp32's.
    tol = TOL[torch.float32] if precision == "highest" else TOL[torch.float16]
    torch.testing.assert_close(got, expect(fn, args, torch.float32), **tol)
    # One pass or six (one matmul over the parts concatenated along K): the epilogue is in the kernel.
    fused = [d["fusion"]["epilogue"] for d in decisions_in(debug_dir) if d.get("fusion")]
    assert fused == [["bias", act, "residual"]]


@pytest.mark.slow
def test_dynamic_shapes_fuse_and_match_cpu(debug_dir):
    """Symbolic batch and sequence sizes: the rewrite adds no reshape with a symbolic size of its own."""
    fn = linear_act_residual(ACTS["gelu"])
    args = linear_inputs(torch.float16)
    got = run_compiled(fn, *args, dynamic=True)
    torch.testing.assert_close(got, expect(fn, args, torch.float16), **TOL[torch.float16])
    assert [d["fusion"]["epilogue"] for d in decisions_in(debug_dir) if d.get("fusion")][:1] == \
        [["bias", "gelu", "residual"]]


@pytest.mark.slow
def test_mm_then_bias_add_and_relu_fold_in(debug_dir):
    """A bias added after a plain mm (not an addmm) rides the epilogue as the bias, before the activation."""
    fn = lambda a, w, b: torch.relu(torch.mm(a, w) + b)  # noqa: E731
    args = (rnd(96, 128), rnd(128, 256, scale=0.1, seed=1), rnd(1, 256, seed=2))
    got = run_compiled(fn, *args)
    torch.testing.assert_close(got, expect(fn, args, torch.float16), **TOL[torch.float16])
    fused = [d["fusion"]["epilogue"] for d in decisions_in(debug_dir) if d.get("fusion")]
    assert fused == [["bias", "relu"]]


@pytest.mark.slow
def test_bmm_with_a_residual_folds_in():
    fn = lambda a, b, r: F.silu(torch.bmm(a, b)) + r  # noqa: E731
    args = (rnd(3, 64, 128), rnd(3, 128, 128, scale=0.1, seed=1), rnd(3, 64, 128, seed=2))
    kernels, got = profiled(fn, args)
    torch.testing.assert_close(got, expect(fn, args, torch.float16), **TOL[torch.float16])
    assert [k.name.rsplit("_", 1)[0] for k in kernels] == ["spyre_bmm_silu_residual"]


# --- what the switch changes ---------------------------------------------------------------------
@pytest.mark.slow
def test_fused_graph_has_fewer_kernels_and_less_simulated_time():
    fn, args = linear_act_residual(F.gelu), linear_inputs(torch.float16)
    on, got_on = profiled(fn, args)
    off, got_off = profiled(fn, args, off=True)
    ref = expect(fn, args, torch.float16)
    for got in (got_on, got_off):
        torch.testing.assert_close(got, ref, **TOL[torch.float16])
    assert len(on) == 1 < len(off)
    assert sum(k.duration for k in on) < 0.6 * sum(k.duration for k in off)
    assert not any("gelu" in k.name for k in off[:-1])  # off: the matmul, then pointwise kernels
    assert on[0].name.startswith("spyre_baddbmm_gelu_residual")


@pytest.mark.slow
def test_switched_off_the_graph_keeps_its_unfused_kernels(debug_dir):
    fn, args = linear_act_residual(F.silu), linear_inputs(torch.float16)
    kernels, _ = profiled(fn, args, off=True)
    assert not any(d.get("fusion") for d in decisions_in(debug_dir))
    assert any(k.name.startswith("spyre_addmm_") for k in kernels)


# --- the rewrite, on FX graphs (no compile) --------------------------------------------------------
def _graph(fn, *args):
    """The functional ATen graph of ``fn`` with its fake values, on spyre, as the post-grad pass sees it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*[a.to("spyre") for a in args])


@pytest.mark.parametrize("act", sorted(ACTS))
def test_each_activation_is_recognized_in_its_decomposed_form(act):
    from torch.fx.experimental.proxy_tensor import make_fx

    fn = linear_act_residual(ACTS[act])
    args = [a.to("spyre") for a in linear_inputs(torch.float16)]
    # Inductor decomposes the activations (GELU: upcast, erf or tanh formula, downcast): so do we here.
    gm = make_fx(fn, decomposition_table=torch.export.default_decompositions(), tracing_mode="fake")(*args)
    chains = epilogue.fuse_matmul_epilogues(gm)
    assert [(c.activation, c.fused) for c in chains] == [(act, [act, "residual"])]
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert epilogue.op() in targets and torch.ops.aten.addmm.default not in targets


def test_switched_off_the_rewrite_leaves_the_graph_as_it_is():
    gm = _graph(linear_act_residual(F.relu), *linear_inputs(torch.float16))
    before = str(gm.graph)
    with optimizations.disabled("matmul_epilogue"):
        assert epilogue.fuse_matmul_epilogues(gm) == []
    assert str(gm.graph) == before
    assert [c.fused for c in epilogue.fuse_matmul_epilogues(gm)] == [["relu", "residual"]]


def test_an_intermediate_read_elsewhere_stays_unfused():
    """The matmul's output is also returned: it must be stored as it is, so nothing folds into it."""
    gm = _graph(lambda a, w, r: (lambda y: (y, torch.relu(y) + r))(torch.mm(a, w)),
                rnd(64, 128), rnd(128, 64), rnd(64, 64))
    assert epilogue.fuse_matmul_epilogues(gm) == []


def test_a_non_activation_is_not_taken_for_one():
    """``x * sigmoid(2x)`` is built from the same ops as SiLU but is not SiLU: the chain stops there."""
    gm = _graph(lambda a, w: (lambda y: y * torch.sigmoid(y * 2))(torch.mm(a, w)), rnd(64, 128), rnd(128, 64))
    assert epilogue.fuse_matmul_epilogues(gm) == []


def test_an_add_that_changes_the_dtype_is_not_folded():
    gm = _graph(lambda a, w, r: torch.mm(a, w) + r, rnd(64, 128), rnd(128, 64), rnd(64, 64, dtype=torch.float32))
    assert epilogue.fuse_matmul_epilogues(gm) == []


def test_reference_rejects_an_unknown_activation():
    x = torch.ones(2, 2)
    with pytest.raises(ValueError, match="unknown matmul epilogue activation 'swish'.*known: gelu"):
        epilogue.reference(x, x, None, None, "swish", 1.0, 1.0)


def test_the_fused_op_runs_eagerly_on_spyre():
    """A graph that falls back to eager still computes the fused op (its eager kernel is torch ops)."""
    a, w, b, r = rnd(32, 64), rnd(64, 64, scale=0.1, seed=1), rnd(64, seed=2), rnd(32, 64, seed=3)
    got = epilogue.op()(a.to("spyre"), w.to("spyre"), b.to("spyre"), r.to("spyre"), "gelu", 1.0, 1.0).cpu()
    want = (F.gelu(a.float() @ w.float() + b.float()) + r.float()).half()
    torch.testing.assert_close(got, want, **TOL[torch.float16])

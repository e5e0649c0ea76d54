"""Batch and layer norm statistics on spyre come back as the CPU returns them (device/norm_stats.py)."""

from __future__ import annotations

import pytest
import torch

aten = torch.ops.aten
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2),
       torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


def _stored(t):
    return None if t is None else t.to("spyre").cpu()


def _cases(dtype, param_dtype=None):
    """The ops with ``dtype`` input; parameters and running statistics in ``param_dtype`` (default: the same;
    fp32 with a 16-bit input is mixed precision, whose statistics the CPU returns in fp32)."""
    param_dtype = param_dtype or dtype
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, generator=g).to(dtype)
    w, b = torch.rand(3, generator=g).to(param_dtype) + 0.5, torch.randn(3, generator=g).to(param_dtype)
    rm, rv = torch.randn(3, generator=g).to(param_dtype), torch.rand(3, generator=g).to(param_dtype) + 0.5
    return [
        ("native_batch_norm train", aten.native_batch_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5)),
        ("native_batch_norm eval", aten.native_batch_norm.default, (x, w, b, rm, rv, False, 0.1, 1e-5)),
        ("_native_batch_norm_legit eval", aten._native_batch_norm_legit.default, (x, w, b, rm, rv, False, 0.1, 1e-5)),
        ("_native_batch_norm_legit no_stats", aten._native_batch_norm_legit.no_stats, (x, w, b, True, 0.1, 1e-5)),
        ("_batch_norm_with_update", aten._batch_norm_with_update.default, (x, w, b, rm, rv, 0.1, 1e-5)),
        ("_batch_norm_with_update_functional", aten._batch_norm_with_update_functional.default,
         (x, w, b, rm, rv, 0.1, 1e-5)),
        ("_batch_norm_no_update", aten._batch_norm_no_update.default, (x, w, b, rm, rv, 0.1, 1e-5)),
        ("native_layer_norm", aten.native_layer_norm.default, (x, [5], w.new_ones(5), None, 1e-5)),
        ("native_layer_norm with bias", aten.native_layer_norm.default, (x, [5], w.new_ones(5), w.new_zeros(5), 1e-5)),
    ]


@pytest.mark.parametrize("mode", ["host", "compile"])
@pytest.mark.parametrize("dtype,param_dtype", [(torch.float32, None), (torch.float16, None), (torch.bfloat16, None),
                                               (torch.float16, torch.float32), (torch.bfloat16, torch.float32)])
def test_statistics_have_the_cpus_dtype_and_shape(dtype, param_dtype, mode, monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    for name, op, args in _cases(dtype, param_dtype):
        stored = [_stored(a) if isinstance(a, torch.Tensor) else a for a in args]
        expected = op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in stored])
        got = op(*[a.to("spyre") if isinstance(a, torch.Tensor) else a for a in stored])
        assert len(got) == len(expected), name
        for i, (g, e) in enumerate(zip(got, expected)):
            assert (g.dtype, g.shape) == (e.dtype, e.shape), (name, i)
            torch.testing.assert_close(g.cpu(), e, **TOL[dtype], msg=f"{name}: result {i}")


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_backward_reads_the_statistics_like_the_cpu(training):
    torch.manual_seed(0)
    cpu = torch.nn.BatchNorm1d(3).to(torch.float16).train(training)
    with torch.no_grad():
        cpu.running_var.fill_(2.0)
    dev = torch.nn.BatchNorm1d(3).to(torch.float16).train(training)
    dev.load_state_dict(cpu.state_dict())
    dev.to("spyre")
    x = _stored(torch.randn(6, 3, 4).to(torch.float16))
    xc, xd = x.clone().requires_grad_(), x.to("spyre").requires_grad_()
    cpu(xc).float().sum().backward()
    dev(xd).float().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **TOL[torch.float16])
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, **TOL[torch.float16])


def _compiled_cases(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 5, generator=g).to(dtype)
    w, b = torch.rand(3, generator=g).to(dtype) + 0.5, torch.randn(3, generator=g).to(dtype)
    rm, rv = torch.randn(3, generator=g).to(dtype), torch.rand(3, generator=g).to(dtype) + 0.5
    return [
        ("native_batch_norm train", lambda x, w, b, rm, rv: aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)),
        ("native_batch_norm train no running stats",
         lambda x, w, b, rm, rv: aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)),
        ("native_batch_norm eval", lambda x, w, b, rm, rv: aten.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)),
        ("_native_batch_norm_legit train",
         lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5)),
        ("_native_batch_norm_legit eval",
         lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, False, 0.1, 1e-5)),
        ("_native_batch_norm_legit no_stats",
         lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, True, 0.1, 1e-5)),
        ("_batch_norm_with_update", lambda x, w, b, rm, rv: aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)),
        ("_batch_norm_no_update", lambda x, w, b, rm, rv: aten._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5)),
        ("native_layer_norm", lambda x, w, b, rm, rv: aten.native_layer_norm(x, [5], None, None, 1e-5)),
        ("native_layer_norm affine",
         lambda x, w, b, rm, rv: aten.native_layer_norm(x, [3, 5], x.new_ones(3, 5), x.new_zeros(3, 5), 1e-5)),
    ], [x, w, b, rm, rv]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_statistics_have_the_cpus_dtype_and_shape(dtype):
    torch._dynamo.reset()
    cases, args = _compiled_cases(dtype)
    stored = [_stored(a) for a in args]
    for name, fn in cases:
        cpu = [a.clone() for a in stored]
        expected = fn(*cpu)
        dev = [a.to("spyre") for a in stored]
        got = torch.compile(fn, dynamic=False)(*dev)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert (g.dtype, g.shape) == (e.dtype, e.shape), (name, i)
            torch.testing.assert_close(g.cpu(), e, **TOL[dtype], msg=f"{name}: result {i}")
        # the running statistics the training op updates, as on the CPU
        for j, stat in ((3, "running_mean"), (4, "running_var")):
            torch.testing.assert_close(dev[j].cpu(), cpu[j], **TOL[dtype], msg=f"{name}: {stat}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("module,training", [("LayerNorm", True), ("BatchNorm1d", True), ("BatchNorm1d", False)])
def test_compiled_backward_reads_16bit_statistics_and_matches_the_cpu(module, training, dtype):
    """An input that requires grad: the compiled forward saves the 16-bit statistics, as the CPU's op
    returns them, and the backward reads them (the fused kernel reading 16-bit (C,) statistics in its
    epilogue once failed to generate, "load ... has no view in this box"): no kernel falls back, and the
    input's and weight's gradients and the running statistics match the CPU's."""
    import torch_spyre

    torch._dynamo.reset()
    torch.manual_seed(0)
    make = (lambda: torch.nn.LayerNorm(5)) if module == "LayerNorm" else (lambda: torch.nn.BatchNorm1d(3))
    cpu = make().to(dtype).train(training)
    with torch.no_grad():
        cpu.weight.uniform_(0.5, 1.5)
    cpu.load_state_dict({k: _stored(v) for k, v in cpu.state_dict().items()})
    dev = make().to(dtype).train(training)
    dev.load_state_dict(cpu.state_dict())
    dev.to("spyre")
    x = _stored(torch.randn(4, 3, 5).to(dtype))
    xc, xd = x.clone().requires_grad_(), x.to("spyre").requires_grad_()
    cpu(xc).float().sum().backward()
    torch_spyre.reset_fallback_stats()
    torch.compile(dev, dynamic=False)(xd).float().sum().backward()
    assert not torch_spyre.fallback_stats().compile_fallbacks
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **TOL[dtype])
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, **TOL[dtype])
    for name, buf in cpu.named_buffers():
        torch.testing.assert_close(dict(dev.named_buffers())[name].cpu(), buf, **TOL[dtype], msg=name)


@pytest.mark.parametrize("mode", ["host", "compile"])
@pytest.mark.parametrize("op", [aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
                                aten._batch_norm_with_update.default])
def test_training_op_updates_running_statistics_without_a_version_bump(op, mode, monkeypatch):
    """The CPU's kernels write the running statistics without bumping their version counters, and
    autograd saves them for the backward before the op runs: on spyre the backward through the training
    op once failed with "modified by an inplace operation" (the eager program's write-back bumped them).
    On the host path ``native_batch_norm`` did not update them at all (its schema does not declare the
    write; op_call._UNDECLARED_WRITES)."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    g = torch.Generator().manual_seed(3)
    x = _stored(torch.randn(5, 5, 5, generator=g))
    w, b = torch.rand(5, generator=g) + 0.5, torch.randn(5, generator=g)
    rm, rv = torch.randn(5, generator=g), torch.rand(5, generator=g) + 0.5
    results = []
    for device in ("cpu", "spyre"):
        leaves = [t.clone().to(device).requires_grad_() for t in (x, w, b)]
        running = [t.clone().to(device) for t in (rm, rv)]  # (the CPU op writes them in place)
        versions = [t._version for t in running]
        training = () if op is aten._batch_norm_with_update.default else (True,)  # (always training)
        out = op(*leaves, *running, *training, 0.5, 0.6)
        assert [t._version for t in running] == versions, device
        grads = torch.autograd.grad(out[0].sum(), leaves)
        results.append([t.cpu() for t in (*grads, *running)])
    for got, want, name in zip(results[1], results[0], ["input grad", "weight grad", "bias grad", "running_mean",
                                                         "running_var"]):
        torch.testing.assert_close(got, want, **TOL[torch.float32], msg=name)

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

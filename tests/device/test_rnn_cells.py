"""GRU and LSTM on spyre: torch's fused-cell ops (CUDA-only kernels) run as pointwise ops (device/rnn_cells.py)."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_spyre
from torch_spyre.device import rnn_cells

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-2, rtol=2e-2)}
MODULES = {"GRUCell": (torch.nn.GRUCell, (3, 4)), "LSTMCell": (torch.nn.LSTMCell, (3, 4)),
           "GRU": (torch.nn.GRU, (5, 3, 4)), "LSTM": (torch.nn.LSTM, (5, 3, 4))}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _stored(t: torch.Tensor) -> torch.Tensor:
    return t.to("spyre").cpu()  # the values the card holds (DLFloat16 for 16-bit dtypes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(MODULES))
def test_rnn_modules_run_and_differentiate_on_spyre_like_the_cpu(name, dtype):
    cls, shape = MODULES[name]
    torch.manual_seed(0)
    cpu = cls(4, 8).to(dtype)
    with torch.no_grad():
        for p in cpu.parameters():
            p.copy_(_stored(p))
    dev = copy.deepcopy(cpu).to("spyre")
    x = _stored(torch.randn(shape, dtype=dtype))
    xc, xd = x.clone().requires_grad_(), x.to("spyre").requires_grad_()
    expected, got = _first(cpu(xc)), _first(dev(xd))
    torch.testing.assert_close(got.cpu(), expected.detach(), **TOL[dtype])
    expected.float().sum().backward()
    got.float().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **TOL[dtype])
    for pd, pc in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad, **TOL[dtype])
    with torch.inference_mode():  # no autograd key: the PrivateUse1 kernel
        torch.testing.assert_close(_first(dev(x.to("spyre"))).cpu(), expected.detach(), **TOL[dtype])
    assert not any(op.startswith("_thnn") for op in torch_spyre.fallback_stats().host)


def test_the_cells_compute_torchs_cell_math_with_cudas_workspace():
    torch.manual_seed(1)
    x, h, c = torch.randn(3, 4), torch.randn(3, 8), torch.randn(3, 8)
    w_ih, w_hh, b_ih, b_hh = torch.randn(24, 4), torch.randn(24, 8), torch.randn(24), torch.randn(24)
    hy, workspace = rnn_cells.fused_gru_cell(x @ w_ih.T, h @ w_hh.T, h, b_ih, b_hh)
    torch.testing.assert_close(hy, torch.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh))
    assert workspace.shape == (3, 40)
    torch.testing.assert_close(workspace[:, 24:32], h)  # the CUDA kernel keeps hx for its backward
    w_ih, w_hh, b_ih, b_hh = torch.randn(32, 4), torch.randn(32, 8), torch.randn(32), torch.randn(32)
    hy, cy, workspace = rnn_cells.fused_lstm_cell(x @ w_ih.T, h @ w_hh.T, c, b_ih, b_hh)
    ref_h, ref_c = torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
    torch.testing.assert_close((hy, cy), (ref_h, ref_c))
    assert workspace.shape == (3, 32) and bool(((workspace[:, 16:24] >= -1) & (workspace[:, 16:24] <= 1)).all())

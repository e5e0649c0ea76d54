"""GRU and LSTM cells on spyre: ``aten::_thnn_fused_gru_cell`` / ``_thnn_fused_lstm_cell`` as ordinary ops.

torch's RNN code (``gru_cell``, ``lstm_cell``, and ``nn.GRU``/``nn.LSTM`` through them) takes the fused
cell ops for any tensor off the CPU (CUDA, XPU, PrivateUse1). Those ops have CUDA kernels only, so the
device's host fallback cannot run them (the CPU has no kernel either). Here they are their math, the
same as the CUDA kernels compute, in aten ops on the spyre tensors (pointwise ops: programs on the card):

- registered for ``AutogradPrivateUse1``, so autograd records the pointwise ops and differentiates them
  (the fused ops' own backward, ``_thnn_fused_*_cell_backward*``, has no kernel off CUDA either);
- and for ``PrivateUse1``, reached when autograd is off (``torch.inference_mode``).

The workspace each returns holds what the CUDA kernel stores for its backward (the activated gates), so
the results have the CUDA kernels' shapes; torch's RNN code only reads the hidden (and cell) state.
"""

from __future__ import annotations

import torch

def _with_bias(gates: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return gates if bias is None else gates + bias


def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """(hy, workspace [B, 5H]: r, z, n, hx, the hidden gates' n part with its bias), as CUDA's kernel."""
    i_r, i_z, i_n = _with_bias(input_gates, input_bias).chunk(3, 1)
    h_r, h_z, h_n = _with_bias(hidden_gates, hidden_bias).chunk(3, 1)
    reset = torch.sigmoid(i_r + h_r)
    update = torch.sigmoid(i_z + h_z)
    new = torch.tanh(i_n + reset * h_n)
    hy = new + update * (hx - new)
    return hy, torch.cat([reset, update, new, hx, h_n], 1)


def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """(hy, cy, workspace [B, 4H]: the activated input, forget, cell and output gates), as CUDA's kernel."""
    gates = _with_bias(_with_bias(input_gates + hidden_gates, input_bias), hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    hy = o * torch.tanh(cy)
    return hy, cy, torch.cat([i, f, g, o], 1)


def kernels() -> list[tuple[str, object, str]]:
    """(aten op, kernel, dispatch key) for each cell, for the device's registration (registration.py)."""
    return [(name, fn, key)
            for name, fn in (("_thnn_fused_gru_cell", fused_gru_cell), ("_thnn_fused_lstm_cell", fused_lstm_cell))
            for key in ("AutogradPrivateUse1", "PrivateUse1")]

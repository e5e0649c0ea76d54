"""``fourier_real_dft``: FNet's Fourier token mixing as real DFT matmuls.

FNet mixes tokens with ``torch.fft.fftn(x, dim=(1, 2)).real``. The FFT's result is complex64, which the card
cannot hold: fnet failed eagerly and compiled with ``UnsupportedDtypeError: the Spyre card cannot hold
complex64 tensors`` (``spyre coverage --models fnet``, the shrunken model).

Only the real part is used, and for a real input it is two real products: with the DFT matrix of length N
written as ``C - iS`` (``C[j, k] = cos(2 pi jk / N)``, ``S`` the same with sin),

    Re(F_seq X F_hid^T) = C_seq X C_hid - S_seq X S_hid      (C and S are symmetric)

so the mixing is four matmuls on the card. The matrices are built on the device from ``arange``: the angle
index ``jk mod N`` is computed exactly in float32 (``jk < 2**24`` for N <= 4096, FNet's longest) so the
cos/sin arguments stay in [0, 2 pi) and keep full precision.
"""

from __future__ import annotations

import math
import sys
import types

import torch

from .registry import Adapter, register

_MODULE = "transformers.models.fnet.modeling_fnet"
_CLASS = "FNetBasicFourierTransform"
_MAX_N = 4096  # jk < 2**24: exact in float32


def _cos_sin(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The real and (negated) imaginary parts of the length-``n`` DFT matrix, float32 on ``device``."""
    if n > _MAX_N:
        raise ValueError(f"fourier_real_dft: a Fourier transform of length {n} is longer than {_MAX_N}, "
                         "where the exact angle index would overflow float32; run this model on the CPU")
    k = torch.arange(n, device=device, dtype=torch.float32)
    jk = k[:, None] * k[None, :]
    r = jk - torch.floor(jk / n) * n  # jk mod n, exact: every value is an integer below 2**24
    angle = r * (2 * math.pi / n)
    return torch.cos(angle), torch.sin(angle)


def real_fft2(x: torch.Tensor) -> torch.Tensor:
    """``torch.fft.fftn(x, dim=(1, 2)).real`` of a real ``[B, S, H]`` tensor, in real arithmetic."""
    cs, ss = _cos_sin(x.shape[1], x.device)
    ch, sh = _cos_sin(x.shape[2], x.device)
    xf = x.float()
    out = torch.matmul(cs, xf) @ ch - torch.matmul(ss, xf) @ sh
    return out.to(x.dtype)


def _forward(self, hidden_states: torch.Tensor):
    return (real_fft2(hidden_states),)


def _mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    cls = getattr(sys.modules.get(_MODULE), _CLASS, None)
    if cls is None:
        return []
    return [m for m in model.modules() if isinstance(m, cls)]


def _apply(model: torch.nn.Module) -> None:
    for m in _mixers(model):
        m.forward = types.MethodType(_forward, m)


FOURIER_REAL_DFT = register(Adapter(
    name="fourier_real_dft",
    fixes="FNet's token mixing torch.fft.fftn(...).real makes complex64, which the card cannot hold: fnet failed "
          "eager and compiled (UnsupportedDtypeError); with the adapter the real part is four real matmuls",
    applies=lambda model: bool(_mixers(model)),
    apply=_apply,
))

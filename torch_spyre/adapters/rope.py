"""``complex_rope_real``: rotary embeddings written with complex numbers run in real arithmetic.

DeepSeek-V2's rotary embedding returns ``torch.polar(1, position * inv_freq)`` (complex64) and its
``apply_rotary_emb`` multiplies ``view_as_complex`` of the query and key pairs by it. The card holds no
complex tensors: the model failed eagerly and compiled with ``UnsupportedDtypeError: the Spyre card cannot
hold complex64 tensors`` (``spyre coverage --models deepseek_v2``, measured on the shrunken model).

The adapter makes the model's rotary embedding return the same angles as a real ``[..., dim/2, 2]`` tensor
of (cos, sin) (times the attention scaling, as the complex one is), and wraps the modeling module's
``apply_rotary_emb`` so that a real table is applied as the complex product written out: for each pair
(a, b), (a cos - b sin, a sin + b cos). A complex table (a stock model) still takes the original code.
The result for the shrunken model is in docs/coverage.md.
"""

from __future__ import annotations

import functools
import sys
import types

import torch

from .registry import Adapter, register

_MODULE = "transformers.models.deepseek_v2.modeling_deepseek_v2"
_ROTARY = "DeepseekV2RotaryEmbedding"


def _rotaries(model: torch.nn.Module) -> list[torch.nn.Module]:
    mod = sys.modules.get(_MODULE)
    cls = getattr(mod, _ROTARY, None)
    if cls is None:
        return []
    # dynamic or long RoPE update inv_freq per call (transformers' dynamic_rope_update): left as they are
    return [m for m in model.modules() if isinstance(m, cls) and not any(
        k in str(getattr(m, "rope_type", "default")) for k in ("dynamic", "longrope"))]


def _real_forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        return torch.stack([freqs.cos(), freqs.sin()], dim=-1) * self.attention_scaling


def _real_apply(original):
    @functools.wraps(original)
    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
        if freqs_cis.is_complex():
            return original(xq, xk, freqs_cis)
        table = freqs_cis.unsqueeze(1).to(xq.device)  # [B, 1, S, dim/2, 2], as the complex one broadcasts
        cos, sin = table[..., 0], table[..., 1]

        def rotate(x: torch.Tensor) -> torch.Tensor:
            pairs = x.float().reshape(*x.shape[:-1], -1, 2)
            a, b = pairs[..., 0], pairs[..., 1]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(3).type_as(x)

        return rotate(xq), rotate(xk)

    apply_rotary_emb._spyre_real = True
    return apply_rotary_emb


def _apply(model: torch.nn.Module) -> None:
    mod = sys.modules[_MODULE]
    if not getattr(mod.apply_rotary_emb, "_spyre_real", False):
        mod.apply_rotary_emb = _real_apply(mod.apply_rotary_emb)
    for rotary in _rotaries(model):
        rotary.forward = types.MethodType(_real_forward, rotary)


COMPLEX_ROPE_REAL = register(Adapter(
    name="complex_rope_real",
    fixes="DeepSeek-V2's complex (torch.polar) rotary embedding: the card holds no complex64, so deepseek_v2 "
          "failed eager and compiled (UnsupportedDtypeError); with the adapter the same rotation runs in real "
          "arithmetic",
    applies=lambda model: bool(_rotaries(model)),
    apply=_apply,
))

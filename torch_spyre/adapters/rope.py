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

Llama 4's text model has the same complex rotary embedding (``Llama4TextRotaryEmbedding``, its
``apply_rotary_emb`` broadcasting over the heads after the sequence: ``[B, S, H, D]``): llama4_text failed
eager and compiled with the same error (``spyre coverage --models llama4_text``); the adapter covers it too.
"""

from __future__ import annotations

import functools
import sys
import types

import torch

from .registry import Adapter, register

# modeling module -> (its rotary embedding class, the dim of q/k holding the heads: the table broadcasts there)
_FAMILIES = {"transformers.models.deepseek_v2.modeling_deepseek_v2": ("DeepseekV2RotaryEmbedding", 1),  # [B, H, S, D]
             "transformers.models.llama4.modeling_llama4": ("Llama4TextRotaryEmbedding", 2)}  # [B, S, H, D]


def _rotaries(model: torch.nn.Module, module: str | None = None) -> list[torch.nn.Module]:
    found = []
    for name, (cls_name, _) in _FAMILIES.items():
        cls = getattr(sys.modules.get(name), cls_name, None)
        if cls is None or module not in (None, name):
            continue
        # dynamic or long RoPE update inv_freq per call (transformers' dynamic_rope_update): left as they are
        found += [m for m in model.modules() if isinstance(m, cls) and not any(
            k in str(getattr(m, "rope_type", "default")) for k in ("dynamic", "longrope"))]
    return found


def _real_forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        return torch.stack([freqs.cos(), freqs.sin()], dim=-1) * self.attention_scaling


def _real_apply(original, head_dim: int):
    @functools.wraps(original)
    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
        if freqs_cis.is_complex():
            return original(xq, xk, freqs_cis)
        table = freqs_cis.unsqueeze(head_dim).to(xq.device)  # [B, 1, S, dim/2, 2] or [B, S, 1, ...], as the complex one broadcasts
        cos, sin = table[..., 0], table[..., 1]

        def rotate(x: torch.Tensor) -> torch.Tensor:
            pairs = x.float().reshape(*x.shape[:-1], -1, 2)
            a, b = pairs[..., 0], pairs[..., 1]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(3).type_as(x)

        return rotate(xq), rotate(xk)

    apply_rotary_emb._spyre_real = True
    return apply_rotary_emb


def _apply(model: torch.nn.Module) -> None:
    for name, (_, head_dim) in _FAMILIES.items():
        rotaries = _rotaries(model, name)
        if not rotaries:
            continue
        mod = sys.modules[name]
        if not getattr(mod.apply_rotary_emb, "_spyre_real", False):
            mod.apply_rotary_emb = _real_apply(mod.apply_rotary_emb, head_dim)
        for rotary in rotaries:
            rotary.forward = types.MethodType(_real_forward, rotary)


COMPLEX_ROPE_REAL = register(Adapter(
    name="complex_rope_real",
    fixes="DeepSeek-V2's and Llama 4's complex (torch.polar) rotary embeddings: the card holds no complex64, so "
          "deepseek_v2 and llama4_text failed eager and compiled (UnsupportedDtypeError); with the adapter the same "
          "rotation runs in real arithmetic",
    applies=lambda model: bool(_rotaries(model)),
    apply=_apply,
))

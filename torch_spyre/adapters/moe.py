"""``moe_batched_mm``: mixture-of-experts layers compute their experts with batched matmuls.

transformers runs a MoE layer's experts with ``grouped_mm`` by default: tokens are sorted by expert and
counted with ``torch.histc``, which on a non-CPU device it calls on int32 expert ids, and the matmul
sizes depend on those counts (data-dependent shapes). On spyre the int32 ``histc`` runs on the host,
where the CPU kernel has no integer version: the forward fails, eager and compiled alike.

``batched_mm`` (transformers' own implementation, chosen through its public ``set_experts_implementation``)
gathers each token's expert weights and runs batched matrix-vector products: static shapes, a gather and
a multiply-sum, which the card compiles (two compiler fixes made the rest work: gather indices that merge
dims of a host result get a copy; N == 1 matmuls run on the vector unit).

Measured with ``spyre coverage --models afmoe,cohere2_moe`` (shrunken, fp32, cosine against the CPU's
stock model): without the adapter afmoe fails eager and compiled with ``NotImplementedError:
"histogram_cpu" not implemented for 'Int'`` (as does mixtral eagerly: tests/adapters); with it afmoe passes eager
(cosine 0.999998) and compiled (0.999998, 1.67 simulated ms), cohere2_moe eager (1.000000) and compiled
(1.000000, 1.59 ms), greedy tokens equal to the CPU's; only the router's ``topk`` runs on the host.
"""

from __future__ import annotations

import torch

from .registry import Adapter, register


def _uses_grouped_mm(model: torch.nn.Module) -> bool:
    get = getattr(model, "get_experts_implementation", None)
    if get is None or not getattr(type(model), "_can_set_experts_implementation", lambda: False)():
        return False
    return "grouped_mm" in get().values()


def _batched_mm(model: torch.nn.Module) -> None:
    current = model.get_experts_implementation()
    model.set_experts_implementation({k: ("batched_mm" if v == "grouped_mm" else v) for k, v in current.items()})


MOE_BATCHED_MM = register(Adapter(
    name="moe_batched_mm",
    fixes="MoE experts via grouped_mm call torch.histc on int32 ids on a non-CPU device; the host has no int "
          "histc kernel, so every grouped_mm MoE model failed (afmoe: NotImplementedError, eager and compiled)",
    applies=_uses_grouped_mm,
    apply=_batched_mm,
))

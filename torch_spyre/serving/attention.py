"""vLLM attention backend (registered as CUSTOM): paged attention on the card (``paged_attention.py``).

The metadata builder plans each engine step once for all layers on the host (``plan.py``). A layer's
forward is then a few gathers plus one compiled attention call per group, all on the card; the scheduler
and sampler never see a spyre tensor.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)

from .device import compiled_attention, softmax_scale
from .paged_attention import write_kv
from .plan import SpyreAttentionMetadata, plan_step


class SpyrePagedAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    accept_output_buffer: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type["SpyrePagedAttentionImpl"]:
        return SpyrePagedAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["SpyreAttentionMetadataBuilder"]:
        return SpyreAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any head size: the kernel is plain torch ops

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


class SpyreAttentionMetadataBuilder(AttentionMetadataBuilder[SpyreAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> SpyreAttentionMetadata:
        m = common_attn_metadata
        return plan_step(m.query_start_loc_cpu.tolist(), m.seq_lens.cpu().tolist(), m.block_table_tensor.cpu(),
                         m.slot_mapping.cpu(), m.num_actual_tokens, self.block_size)


class SpyrePagedAttentionImpl(AttentionImpl[SpyreAttentionMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        unsupported = {"ALiBi slopes": alibi_slopes is not None, "a sliding window": sliding_window is not None,
                       "a logits soft cap": bool(logits_soft_cap), "attention sinks": sinks is not None,
                       "a quantized KV cache": kv_cache_dtype not in ("auto", "float16"),
                       f"attention type {attn_type!r}": attn_type != AttentionType.DECODER,
                       "cross-layer KV sharing": kv_sharing_target_layer_name is not None}
        missing = [name for name, used in unsupported.items() if used]
        if missing:
            raise NotImplementedError(f"the spyre paged-attention backend does not support {', '.join(missing)} "
                                      "(docs/serving.md lists what it runs)")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = None
        self.attn_type = attn_type
        # Uploaded with the model (not by the first request, whose TTFT it would lengthen); freed with the layer.
        self._scale_on_card = softmax_scale(self.scale)

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        from vllm.forward_context import get_forward_context

        meta = get_forward_context().attn_metadata
        meta = meta[layer.layer_name] if isinstance(meta, dict) else meta
        if meta is None:  # the memory-profiling run has no cache to write
            return
        n = meta.num_actual_tokens
        write_kv(kv_cache, key[:n], value[:n], meta.kv_runs)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: SpyreAttentionMetadata | None, output: torch.Tensor,
                output_scale: torch.Tensor | None = None, output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("the spyre paged-attention backend has no fused output quantization")
        if attn_metadata is None:  # memory profiling: no cache yet
            return output
        n = attn_metadata.num_actual_tokens
        q = query[:n].reshape(n, self.num_heads, self.head_size)
        attend, scale = compiled_attention(), self._scale_on_card
        pieces = []
        for g in attn_metadata.groups:
            qg = q.index_select(0, g.query_rows).reshape(g.batch, g.queries, self.num_heads, self.head_size)
            out = attend(qg, kv_cache, g.block_idx, g.mask, scale)
            pieces.append(out.reshape(g.batch * g.queries, -1).index_select(0, g.keep))
        result = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if attn_metadata.order is not None:
            result = result.index_select(0, attn_metadata.order)
        output[:n].copy_(result.reshape(output[:n].shape))
        return output

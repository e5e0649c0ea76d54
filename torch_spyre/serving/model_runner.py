"""vLLM model runner for the card: the model's float weights and the paged KV cache live on spyre.

vLLM's input preparation, scheduler bookkeeping and sampler stay on the host (the runner's device is
"cpu"). Only the model crosses: token ids and positions go to the card before the forward, hidden states
come back after it, and the logits of the sampled rows come back in float32 for the sampler.

Each engine step is timed on the card's clock for the simulated-time metrics (``sim_time.py``,
``sim_metrics.py``): ``execute_model`` opens the step, ``sample_tokens`` (or an ``execute_model`` that
answers at once) closes it.
"""

from __future__ import annotations

import torch

from vllm.distributed import get_tensor_model_parallel_rank
from vllm.model_executor.layers.attention import Attention
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache

from . import sim_metrics
from .device import card_device
from .sim_time import CardMeter, StepAccounting


def move_model_to_card(model: torch.nn.Module) -> None:
    """Float parameters and buffers to the card; an Attention layer's scale buffers stay on the host
    (vLLM's KV-cache ops read them as host scalars)."""
    host_owned = {id(b) for m in model.modules() if isinstance(m, Attention) for b in m.buffers(recurse=False)}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            param.data = param.data.to(card_device())
        for name, buf in list(module.named_buffers(recurse=False)):
            if id(buf) not in host_owned and buf.is_floating_point():
                module._buffers[name] = buf.to(card_device())


class SpyreModelRunner(CPUModelRunner):
    def load_model(self, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights)
        move_model_to_card(self.model)
        compute_logits = self.model.compute_logits

        def logits_on_host(hidden_states: torch.Tensor, *args, **kwargs):
            logits = compute_logits(hidden_states.to(card_device()), *args, **kwargs)
            return None if logits is None else logits.to("cpu", torch.float32)

        self.model.compute_logits = logits_on_host
        self._sim_meter = CardMeter(card_device().index)
        self._sim_steps = StepAccounting()
        # With tensor parallelism every rank runs the same steps in lockstep (the collectives align the cards'
        # clocks); only TP rank 0, whose output vLLM returns, records them, so each step is counted once.
        self._sim_series = None if get_tensor_model_parallel_rank() != 0 else sim_metrics.metrics().series(
            self.model_config.served_model_name, self.parallel_config.data_parallel_rank)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        self._sim_steps.begin(list(scheduler_output.num_scheduled_tokens), scheduler_output.finished_req_ids,
                              self._sim_meter.now(), self._sim_meter.busy())
        self._sim_link_at_start = self._sim_meter.link()
        output = super().execute_model(scheduler_output, intermediate_tensors)
        if output is not None:  # nothing to sample (no token scheduled): the step ends here
            self._end_sim_step(output)
        return output

    def sample_tokens(self, grammar_output):
        output = super().sample_tokens(grammar_output)
        self._end_sim_step(output)
        return output

    def _end_sim_step(self, output) -> None:
        req_ids, sampled = getattr(output, "req_ids", None) or [], getattr(output, "sampled_token_ids", None) or []
        tokens = {req_id: len(ids) for req_id, ids in zip(req_ids, sampled)}
        step = self._sim_steps.end(tokens, self._sim_meter.now(), self._sim_meter.busy())
        step.link = self._sim_meter.link() - self._sim_link_at_start
        if self._sim_series is not None:
            self._sim_series.record(step)

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None,
                       **model_kwargs):
        def to_card(x):
            return x.to(card_device()) if isinstance(x, torch.Tensor) else x

        hidden = self.model(input_ids=to_card(input_ids), positions=to_card(positions),
                            intermediate_tensors=intermediate_tensors, inputs_embeds=to_card(inputs_embeds),
                            **model_kwargs)
        return hidden.to("cpu") if isinstance(hidden, torch.Tensor) else hidden

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes, kv_cache_allocation_context=None):
        """One ``[2, num_blocks, block_size, num_kv_heads, head_size]`` spyre tensor per attention layer
        (``paged_attention.py``), instead of vLLM's one int8 host buffer viewed per layer."""
        kv_caches = {}
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            for name in group.layer_names:
                # empty, not zeros: zeroing a whole cache is a long card program; vLLM has each block zeroed
                # when first handed out (_zero_block_ids), the null block 0 is zeroed here.
                kv = torch.empty(2, kv_cache_config.num_blocks, spec.block_size, spec.num_kv_heads,
                                 spec.head_size, dtype=spec.dtype, device=card_device())
                kv[:, 0].copy_(self._zero_block(kv))
                kv_caches[name] = kv
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context, self.kv_caches,
                      kv_cache_groups=kv_cache_config.kv_cache_groups)
        return kv_caches

    def _zero_block(self, kv: torch.Tensor) -> torch.Tensor:
        """A zero block shaped like ``kv[:, b]`` on the card (copied in: a device copy per block is cheap,
        a fill kernel per block shape is not)."""
        key = (tuple(kv.shape[2:]), kv.dtype)
        cache = self.__dict__.setdefault("_zero_blocks", {})
        if key not in cache:
            cache[key] = torch.zeros(2, *kv.shape[2:], dtype=kv.dtype).to(card_device())
        return cache[key]

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        # A block newly handed out is zeroed, so the unwritten tail of a sequence's last block holds zeros
        # (masked, but a NaN left from an earlier user would survive the mask as NaN * 0).
        for kv in self.kv_caches:
            zero = self._zero_block(kv)
            for block in block_ids:
                kv[:, block].copy_(zero)

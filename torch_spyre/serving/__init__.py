"""Serving on the simulated card through vLLM (the ``serve`` extra): docs/serving.md.

- ``plugin``: vLLM's entry points; the platform activates with ``TORCH_SPYRE_VLLM=1``.
- ``log_records``: vLLM's logged tracebacks kept as text (a kept record must not keep an ``LLM`` alive).
- ``platform``: the vLLM platform (vLLM's CPU platform, model and KV cache on spyre).
- ``worker``, ``model_runner``, ``kv_budget``: weights and paged KV cache on the card, budget from card memory.
- ``attention``, ``paged_attention``, ``buckets``: the paged-attention backend in torch ops, compiled for the card.

Importing this package imports nothing of vLLM; its submodules (but ``plugin``, ``log_records``, ``buckets``
and ``paged_attention``) need vLLM.
"""

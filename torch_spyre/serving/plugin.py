"""vLLM's entry points (pyproject.toml): the platform plugin and the per-process general plugin.

The platform activates only when asked, ``TORCH_SPYRE_VLLM=1`` (``spyre serve`` sets it): installing
torch-spyre next to vLLM must not take over a user's CPU vLLM.
"""

from __future__ import annotations

import os

ENV = "TORCH_SPYRE_VLLM"


def requested() -> bool:
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}={value!r}: set it to 1 to serve on spyre, or 0/unset for vLLM's own platform")
    return value == "1"


def platform_plugin() -> str | None:
    """``vllm.platform_plugins``: the spyre platform's qualified name when requested, else None."""
    return "torch_spyre.serving.platform.SpyrePlatform" if requested() else None


ATTENTION_BACKEND = "torch_spyre.serving.attention.SpyrePagedAttentionBackend"


def general_plugin() -> None:
    """``vllm.general_plugins`` (every vLLM process). Loading this module already registered the device
    and the compiler (the torch_spyre package does on import), whether or not torch's autoload ran; this
    names the paged-attention backend as vLLM's CUSTOM backend, so ``--attention-backend CUSTOM`` and the
    platform's choice resolve to the same class in every process; and keeps vLLM's logged tracebacks as
    text, so a handler that keeps records does not keep an in-process ``LLM`` on the card (``log_records``)."""
    if requested():
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        from . import log_records

        register_backend(AttentionBackendEnum.CUSTOM, ATTENTION_BACKEND)
        log_records.install()

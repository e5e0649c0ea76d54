from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_spyre
from torch_spyre.device import tensor as device_tensor


@pytest.fixture(autouse=True)
def _clean_fallback_stats():
    torch_spyre.reset_fallback_stats()
    yield


@pytest.fixture(autouse=True)
def _host_eager_ops(monkeypatch):
    """The device suite pins the host fallback's semantics (exact fp32 matmuls, roofline records of kind
    ``fallback``, op names in fallback_stats()); single-op programs, the default, are tested in
    tests/compiler/test_eager.py and by the model tests."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "host")


@pytest.fixture
def settled():
    """Collect garbage and free dead storages so that memory figures are a clean baseline."""

    def settle() -> int:
        gc.collect()
        device_tensor.release_freed()
        return torch.spyre.memory_allocated()

    return settle


def _run_python(code: str, env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (for autoload, configuration and multi-card tests)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_SPYRE_")}
    full_env["TORCH_SPYRE_EAGER"] = "host"  # as the in-process tests (_host_eager_ops)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture
def run_python():
    """``run_python(code, env=None)``: run code in a fresh interpreter, returns CompletedProcess."""
    return _run_python

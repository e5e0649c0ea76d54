"""The environment of the serving tests: vLLM on spyre, offline, with a private compile cache."""

from __future__ import annotations

import os

import pytest

@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory):
    """vLLM on spyre, one process, offline, with a private compile cache."""
    env = {"TORCH_SPYRE_VLLM": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm_cache")),
           "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

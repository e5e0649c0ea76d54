"""Tiny random-weight Hugging Face models built from configs (no download), shared by the test suites."""

from __future__ import annotations

import pytest


def tiny(name: str, **overrides):
    """``(config, model class)`` of a 2-layer, 64-wide ``name`` ("llama", "qwen3", "granite", "bert").

    ``overrides`` change config fields (e.g. ``tie_word_embeddings=True``). Skips the test when
    transformers is not installed."""
    T = pytest.importorskip("transformers")
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    cfg, cls = {
        "llama": (T.LlamaConfig(**common, num_key_value_heads=2, max_position_embeddings=128), T.LlamaModel),
        "qwen3": (T.Qwen3Config(**common, num_key_value_heads=2, head_dim=16, max_position_embeddings=128), T.Qwen3Model),
        "granite": (T.GraniteConfig(**common, num_key_value_heads=2, max_position_embeddings=128), T.GraniteModel),
        "bert": (T.BertConfig(**common, max_position_embeddings=64), T.BertModel),
    }[name]
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg, cls

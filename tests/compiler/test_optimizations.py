"""Optimization switches: names, the environment variable, the context manager, the cache key."""

from __future__ import annotations

import pytest

from torch_spyre.compiler import backend, optimizations


def test_everything_is_on_by_default(monkeypatch):
    monkeypatch.delenv(optimizations.ENV, raising=False)
    assert all(optimizations.enabled(n) for n in optimizations.KNOWN)


def test_the_context_manager_switches_off_and_restores(monkeypatch):
    monkeypatch.delenv(optimizations.ENV, raising=False)
    with optimizations.disabled("matmul_tiling"):
        assert not optimizations.enabled("matmul_tiling")
        with optimizations.disabled("ring_sharing"):
            assert optimizations.disabled_set() == {"matmul_tiling", "ring_sharing"}
        assert optimizations.enabled("ring_sharing")
    assert optimizations.enabled("matmul_tiling")


def test_the_environment_switches_off(monkeypatch):
    monkeypatch.setenv(optimizations.ENV, "ring_sharing, matmul_tiling")
    assert optimizations.disabled_set() == {"ring_sharing", "matmul_tiling"}


@pytest.mark.parametrize("where", ["env", "context", "enabled"])
def test_an_unknown_name_fails_with_the_known_ones(monkeypatch, where):
    monkeypatch.delenv(optimizations.ENV, raising=False)
    with pytest.raises(optimizations.UnknownOptimizationError, match="known ones: .*matmul_tiling"):
        if where == "env":
            monkeypatch.setenv(optimizations.ENV, "matmul_tilling")
            optimizations.disabled_set()
        elif where == "context":
            with optimizations.disabled("nope"):
                pass
        else:
            optimizations.enabled("nope")
    monkeypatch.delenv(optimizations.ENV, raising=False)
    assert optimizations.disabled_set() == frozenset()  # a failed disabled() left nothing behind


def test_the_disabled_set_is_in_the_compiler_cache_key(monkeypatch):
    monkeypatch.delenv(optimizations.ENV, raising=False)
    on = backend.compiler_fingerprint()
    with optimizations.disabled("matmul_tiling"):
        off = backend.compiler_fingerprint()
    assert on != off and off.endswith("matmul_tiling")

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


# ---------------------------------------------------------------------------------------------
# The switches reach the generators (issue 13 §6)
# ---------------------------------------------------------------------------------------------
def _mm(M, K, N):
    from benchmarks.gemm_roofline import spec

    return spec(M, K, N)


def _timed(spec, off=()):
    from torch_spyre.card import CardConfig
    from torch_spyre.card.timing import time_program
    from torch_spyre.compiler.codegen.matmul import build_matmul

    cfg = CardConfig()
    with optimizations.disabled(*off):
        program, decisions = build_matmul(spec, cfg)
    return time_program(program, cfg).total_s, decisions


def test_matmul_tiling_off_takes_the_naive_plan_unsearched(monkeypatch):
    monkeypatch.delenv(optimizations.ENV, raising=False)
    on, d_on = _timed(_mm(128, 256, 512))
    off, d_off = _timed(_mm(128, 256, 512), ("matmul_tiling",))
    assert d_off.work_division["split"] == {"batch": 1, "M": 32, "N_sticks": 1, "K_split": 1}  # output rows only
    assert any("matmul_tiling is switched off" in n for n in d_off.notes)
    assert d_on.work_division["split"] != d_off.work_division["split"]
    assert off > 1.5 * on  # every core loads all of B


def test_matmul_tiling_off_finds_tiles_beyond_the_search_short_list(monkeypatch):
    """The naive split of 512x4096x4096 gives each core all of B: none of the search's six largest N and K
    tile sizes fit, the first fit is further down."""
    monkeypatch.delenv(optimizations.ENV, raising=False)
    from torch_spyre.card import CardConfig
    from torch_spyre.compiler.codegen.matmul.search import first_fit

    plan = first_fit(_mm(512, 4096, 4096), CardConfig())
    assert plan.split.m == 32 and plan.tiles.nt * plan.tiles.kt < 11 * 11


def test_ring_sharing_off_loads_a_on_every_core(monkeypatch):
    monkeypatch.delenv(optimizations.ENV, raising=False)
    on, d_on = _timed(_mm(128, 256, 512))
    assert d_on.work_division["operand_sharing"]["scheme"].startswith("A forwarded")
    off, d_off = _timed(_mm(128, 256, 512), ("ring_sharing",))  # the plan cache must not serve the shared plan
    sharing = d_off.work_division["operand_sharing"]
    assert sharing["scheme"] == "each core loads its own operands" and "switched off" in sharing["why"]
    assert off > on
    again, d_again = _timed(_mm(128, 256, 512))
    assert again == on and d_again.work_division == d_on.work_division


@pytest.mark.slow
@pytest.mark.parametrize("off", ["matmul_tiling", "ring_sharing"])
def test_eager_matmul_with_a_switch_off_matches_the_cpu_and_is_compiled_again(monkeypatch, off):
    """The eager program cache keys on the switches: the op is compiled again with one off (its program is
    another), and the result still matches torch."""
    monkeypatch.delenv(optimizations.ENV, raising=False)
    import torch

    from torch_spyre.compiler import eager
    from tests.compiler.spyre_compile_helpers import TOL

    eager.reset_cache()  # another test may have compiled this signature with the switch off already
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(128, 256, generator=g) * 0.1).half(), (torch.randn(256, 512, generator=g) * 0.1).half()
    da, db = a.to("spyre"), b.to("spyre")
    torch.testing.assert_close((da @ db).cpu().float(), a.float() @ b.float(), **TOL[torch.float16])
    before = eager.cache_stats()["compiles"]
    with optimizations.disabled(off):
        got = (da @ db).cpu().float()
    assert eager.cache_stats()["compiles"] == before + 1
    torch.testing.assert_close(got, a.float() @ b.float(), **TOL[torch.float16])


def _softmax_run(x, off=(), cores=None):
    """(result on the CPU, simulated µs) of a compiled softmax over ``x`` on spyre, ``off`` switched off."""
    import contextlib

    import torch

    import torch_spyre.profiler
    from torch_spyre.compiler.core_count import forcing

    f = torch.compile(lambda t: torch.softmax(t, -1))
    dx = x.to("spyre")
    with optimizations.disabled(*off), (forcing(cores) if cores else contextlib.nullcontext()):
        f(dx)
        with torch_spyre.profiler.profile() as prof:
            y = f(dx)
    us = sum(e.device_time for e in prof.key_averages() if e.kind == "kernel") * 1e6
    return y.cpu(), us


@pytest.mark.slow
def test_scratchpad_planning_off_reloads_rows_and_stays_correct(monkeypatch):
    """Softmax's three passes keep their rows in scratchpad; with scratchpad_planning off each pass loads them
    from device memory again: slower, same values. The compiled kernel's prepared programs key on the
    switch, so the same compiled function serves both."""
    monkeypatch.delenv(optimizations.ENV, raising=False)
    import torch

    from tests.compiler.spyre_compile_helpers import TOL, fresh

    fresh()
    x = torch.randn(64, 256).half()
    want = torch.softmax(x.float(), -1)
    y_on, on = _softmax_run(x, cores=1)
    y_off, off = _softmax_run(x, ("scratchpad_planning",), cores=1)
    torch.testing.assert_close(y_on.float(), want, **TOL[torch.float16])
    torch.testing.assert_close(y_off.float(), want, **TOL[torch.float16])
    assert off > on
    _, forced_on = _softmax_run(x)  # the core count's choice is another program, not the forced one
    assert forced_on != on


@pytest.mark.slow
def test_scratchpad_planning_off_layer_norm_matches_the_cpu(monkeypatch):
    """Layer norm (mean, then a centred sum of squares, then the normalisation) with every pass reloading."""
    monkeypatch.delenv(optimizations.ENV, raising=False)
    import torch

    from tests.compiler.spyre_compile_helpers import TOL, run_compiled

    x, w, b = torch.randn(32, 320), torch.randn(320), torch.randn(320)
    ln = lambda x, w, b: torch.nn.functional.layer_norm(x, (320,), w, b)  # noqa: E731
    with optimizations.disabled("scratchpad_planning"):
        got = run_compiled(ln, x, w, b)
    torch.testing.assert_close(got, ln(x, w, b), **TOL[torch.float32])


def test_a_misspelt_switch_fails_the_op_with_the_known_names_and_leaves_the_device_usable(monkeypatch):
    """A device op reads the switches (its program depends on them): a misspelt name fails it with the known
    ones, and once the variable is fixed the same tensors compute as before."""
    import torch

    a = torch.arange(16.0).reshape(4, 4).to("spyre")
    monkeypatch.setenv(optimizations.ENV, "matmul_tilling")
    with pytest.raises(optimizations.UnknownOptimizationError, match="'matmul_tilling'.*known ones: .*matmul_tiling"):
        a + a
    monkeypatch.delenv(optimizations.ENV)
    torch.testing.assert_close((a + a).cpu(), torch.arange(16.0).reshape(4, 4) * 2)


def test_a_planned_but_unbuilt_optimization_is_refused(monkeypatch):
    """Switching off what the compiler does not do yet would silently do nothing: it is refused instead
    (every planned one is built today, so the test plans one)."""
    name = "planned_for_the_test"
    monkeypatch.setitem(optimizations.NOT_BUILT, name, "an optimization the tracker plans")
    monkeypatch.delenv(optimizations.ENV, raising=False)
    with pytest.raises(optimizations.UnknownOptimizationError, match="not built yet"):
        with optimizations.disabled(name):
            pass
    monkeypatch.setenv(optimizations.ENV, name)
    with pytest.raises(optimizations.UnknownOptimizationError, match="not built yet"):
        optimizations.disabled_set()

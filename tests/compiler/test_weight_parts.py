"""An eager fp32 matmul splits its weight into DLFloat16 parts once (compiler/weight_parts.py): later calls
reuse the parts (one launch fewer), give the same bits as a split at every call, see in-place writes to
the weight, free the parts with the weight, and keep each matmul precision's parts apart."""

from __future__ import annotations

import gc

import pytest
import torch

import torch_spyre  # noqa: F401
from torch_spyre.compiler import eager, weight_parts
from torch_spyre.device import cards
from torch_spyre.device import tensor as device_tensor
from torch_spyre.device.storage import allocation_of
from torch_spyre.runtime import launch as runtime_launch


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "compile")
    monkeypatch.delenv(weight_parts.ENV, raising=False)
    monkeypatch.delenv(weight_parts.BUDGET_ENV, raising=False)
    before = torch.get_float32_matmul_precision()
    weight_parts.clear()
    yield
    torch.set_float32_matmul_precision(before)
    weight_parts.clear()


@pytest.fixture
def launches(monkeypatch):
    """The names of the programs launched, in order."""
    names: list[str] = []
    original = runtime_launch.launch

    def counted(prepared, bindings, stream=None):
        names.append(prepared.name)
        return original(prepared, bindings, stream)

    monkeypatch.setattr(runtime_launch, "launch", counted)
    return names


def _linear(n_in=96, n_out=40, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out)


def _x(m=24, k=96, seed=1):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed))


def _uncached(monkeypatch, fn):
    """``fn()``'s result with the parts cache off (the weight split in every call)."""
    monkeypatch.setenv(weight_parts.ENV, "0")
    try:
        return fn()
    finally:
        monkeypatch.delenv(weight_parts.ENV)


@pytest.mark.parametrize("k", [128, 96])  # 96: each part padded to whole sticks
def test_second_call_reuses_the_parts_without_the_split_kernels_and_the_same_bits(launches, monkeypatch, k):
    lin, x = _linear(k), _x(k=k)
    dlin, dx = _linear(k).to("spyre"), x.to("spyre")
    with torch.no_grad():
        first = dlin(dx).cpu()
        split = [n for n in launches if "fp32_b_parts" in n]
        launches.clear()
        second = dlin(dx).cpu()
        n_second = len(launches)
        assert not any("fp32_b_parts" in n for n in launches)
        launches.clear()
        uncached = _uncached(monkeypatch, lambda: dlin(dx).cpu())
        n_uncached = len(launches)
    assert split and n_second < n_uncached, (split, n_second, n_uncached)
    if k % 64 == 0:  # the uncached program's split of B is one kernel, the one the cache saves
        assert split == ["spyre_fused_fp32_b_parts_0"] and n_second == n_uncached - 1
    stats = weight_parts.stats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["entries"] == 1
    assert torch.equal(first, second) and torch.equal(first, uncached)
    torch.testing.assert_close(second, lin(x).detach(), rtol=1e-5, atol=1e-5)


def test_inference_mode_linear_caches_the_weight_not_the_activation():
    dlin = _linear().to("spyre")
    with torch.inference_mode():
        x = _x().to("spyre")
        dlin(x)
        dlin(x)
        torch.mm(x, x.t().contiguous())  # B an inference tensor: split every call, never kept
    stats = weight_parts.stats()
    assert stats["entries"] == 1 and stats["hits"] == 1


def test_an_in_place_write_to_the_weight_gives_the_new_result(monkeypatch):
    lin, x = _linear(), _x()
    dlin, dx = _linear().to("spyre"), x.to("spyre")
    with torch.no_grad():
        before = dlin(dx).cpu()
        dlin.weight.add_(1)
        lin.weight.add_(1)
        after = dlin(dx).cpu()
        uncached = _uncached(monkeypatch, lambda: dlin(dx).cpu())
        expected = lin(x)
    assert weight_parts.stats()["invalidations"] == 1
    assert not torch.equal(before, after)
    assert torch.equal(after, uncached)
    torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-4)


def test_a_freed_weight_frees_its_parts():
    x = _x().to("spyre")
    gc.collect()
    baseline = torch.spyre.memory_allocated()
    w = torch.randn(40, 96).to("spyre")
    with torch.no_grad():
        y = torch.nn.functional.linear(x, w)
    del y
    assert weight_parts.stats()["bytes"] > 0
    assert torch.spyre.memory_allocated() > baseline + w.numel() * 4
    del w
    gc.collect()
    stats = weight_parts.stats()
    assert stats["released"] == 1 and stats["entries"] == 0 and stats["bytes"] == 0
    assert torch.spyre.memory_allocated() == baseline


def test_empty_cache_drops_the_parts_and_the_next_call_splits_again(launches):
    x = _x().to("spyre")
    w = torch.randn(40, 96).to("spyre")
    gc.collect()
    baseline = torch.spyre.memory_allocated()
    with torch.no_grad():
        first = torch.nn.functional.linear(x, w).cpu()
    assert torch.spyre.memory_allocated() > baseline  # the parts stay on the card
    torch.spyre.empty_cache()
    assert weight_parts.stats()["entries"] == 0
    assert torch.spyre.memory_allocated() == baseline
    assert torch.spyre.memory_reserved() == torch.spyre.memory_allocated()
    launches.clear()
    with torch.no_grad():
        again = torch.nn.functional.linear(x, w).cpu()
    assert any("fp32_b_parts" in n for n in launches)  # split again
    assert torch.equal(first, again)
    assert weight_parts.stats()["misses"] == 2


def _settled() -> int:
    gc.collect()
    device_tensor.release_freed()
    return torch.spyre.memory_allocated()


def test_the_budget_is_bytes_evicts_the_least_recently_used_and_frees_it(monkeypatch):
    x = _x().to("spyre")
    lins = [_linear(seed=s).to("spyre") for s in range(4)]
    with torch.no_grad():
        expected = [_uncached(monkeypatch, lambda: lin(x).cpu()) for lin in lins]
        base = _settled()
        lins[0](x)
        [entry] = weight_parts._cache.entries.values()
        one = weight_parts.stats()["bytes"]
        # The entry's bytes are its parts' allocation, whole sticks, what the card lost to it.
        assert one == entry.nbytes == allocation_of(entry.parts).nbytes
        assert _settled() - base == one
        monkeypatch.setenv(weight_parts.BUDGET_ENV, str(2 * one + one // 2))  # room for two entries
        got = [lins[i](x).cpu() for i in (1, 0, 2)]  # 0 a hit, so 1 is the least recently used: it goes
        stats = weight_parts.stats()
        assert stats["entries"] == 2 and stats["evictions"] == 1 and stats["bytes"] == 2 * one
        assert stats["hits"] == 1 and stats["misses"] == 3
        assert _settled() - base == 2 * one  # the evicted parts' device memory is back
        got.append(lins[0](x).cpu())  # kept: a hit
        assert weight_parts.stats()["hits"] == 2
        got.append(lins[1](x).cpu())  # evicted: split again, evicting 2
        stats = weight_parts.stats()
        assert stats["misses"] == 4 and stats["evictions"] == 2 and stats["entries"] == 2
        assert _settled() - base == 2 * one
    for g, i in zip(got, (1, 0, 2, 0, 1)):
        assert torch.equal(g, expected[i])


def test_parts_larger_than_the_budget_are_not_kept(monkeypatch):
    monkeypatch.setenv(weight_parts.BUDGET_ENV, "0%")
    x, lin = _x().to("spyre"), _linear().to("spyre")
    with torch.no_grad():
        base = _settled()
        first, second = lin(x).cpu(), lin(x).cpu()
        assert _settled() == base
    stats = weight_parts.stats()
    assert stats["entries"] == 0 and stats["oversized"] == 2 and stats["misses"] == 2 and stats["budget"] == 0
    assert torch.equal(first, second) and torch.equal(first, _uncached(monkeypatch, lambda: lin(x).cpu()))


@pytest.mark.parametrize("value,expected", [("1073741824", 2**30), ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9),
                                            ("1.5 GiB", 3 * 2**29), ("25%", None), ("", None)])
def test_budget_values(monkeypatch, value, expected):
    monkeypatch.setenv(weight_parts.BUDGET_ENV, value)
    capacity = cards.card(0).memory.capacity
    assert weight_parts.budget(0) == (expected if expected is not None else capacity // 4)


@pytest.mark.parametrize("value", ["many", "-1", "150%", "4XB", "inf", "GiB"])
def test_a_bad_budget_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(weight_parts.BUDGET_ENV, value)
    with pytest.raises(ValueError, match=f"TORCH_SPYRE_WEIGHT_PARTS_CACHE_BYTES={value!r} is not a byte budget"):
        weight_parts.budget(0)


def test_an_allocation_that_would_not_fit_drops_the_parts_first(monkeypatch):
    x, lin = _x().to("spyre"), _linear().to("spyre")
    with torch.no_grad():
        lin(x)
    held = weight_parts.stats()["bytes"]
    memory = cards.card(0).memory
    base = _settled()
    monkeypatch.setattr(memory, "capacity", base + 128)  # one stick free, unless the parts go
    t = torch.empty(held // 4, device="spyre")  # fits only in the parts' memory
    assert weight_parts.stats()["entries"] == 0
    assert torch.spyre.memory_allocated() == base - held + allocation_of(t).nbytes
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        torch.empty(memory.capacity, device="spyre")  # still too much once nothing is cached: the usual error
def test_precisions_keep_their_own_parts(monkeypatch):
    x, dlin = _x().to("spyre"), _linear().to("spyre")
    results = {}
    with torch.no_grad():
        for precision in ("highest", "high", "highest", "high"):
            torch.set_float32_matmul_precision(precision)
            y = dlin(x).cpu()
            assert torch.equal(y, _uncached(monkeypatch, lambda: dlin(x).cpu()))
            results.setdefault(precision, []).append(y)
    assert torch.equal(*results["highest"]) and torch.equal(*results["high"])
    assert not torch.equal(results["highest"][0], results["high"][0])
    stats = weight_parts.stats()
    assert stats["entries"] == 2 and stats["misses"] == 2 and stats["hits"] == 2


def test_mm_and_addmm_with_scalars_match_the_uncached_bits(monkeypatch):
    a, b, c = _x(16, 72), torch.randn(72, 24), torch.randn(24)
    da, db, dc = a.to("spyre"), b.to("spyre"), c.to("spyre")
    for fn in (lambda: torch.mm(da, db).cpu(), lambda: torch.addmm(dc, da, db, beta=0.5, alpha=2.0).cpu()):
        first, second = fn(), fn()
        assert torch.equal(first, second) and torch.equal(first, _uncached(monkeypatch, fn))
    torch.testing.assert_close(torch.addmm(dc, da, db, beta=0.5, alpha=2.0).cpu(),
                               torch.addmm(c, a, b, beta=0.5, alpha=2.0), rtol=1e-5, atol=1e-5)
    assert weight_parts.stats()["hits"] >= 2


@pytest.mark.parametrize("value", ["many", "256", "2"])  # 256: the old entry bound, now a byte budget's job
def test_bad_switch_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(weight_parts.ENV, value)
    with pytest.raises(ValueError, match="TORCH_SPYRE_WEIGHT_PARTS_CACHE=.*expected 0 .off. or 1 .on.*_BYTES"):
        weight_parts.enabled()


def test_parts_split_in_timing_only_mode_are_split_again_when_run_for_real():
    """Parts made in timing-only mode hold no values: a later real call must not read them."""
    lin, x = _linear(), _x()
    dlin, dx = _linear().to("spyre"), x.to("spyre")
    with torch.no_grad():
        with torch_spyre.timing_only():
            dlin(dx)
            dlin(dx)  # a timing-only hit: the parts serve timing
        assert weight_parts.stats()["hits"] == 1
        got = dlin(dx).cpu()
    assert weight_parts.stats()["invalidations"] == 1
    torch.testing.assert_close(got, lin(x), rtol=1e-5, atol=1e-4)


def test_addmm_with_out_dtype_is_not_read_as_beta(monkeypatch):
    """addmm.dtype(self, mat1, mat2, out_dtype, *, beta, alpha): its 4th argument is a dtype, not beta."""
    called = []
    monkeypatch.setattr(weight_parts, "lookup", lambda *a: called.append(a))
    bound = [torch.randn(4).to("spyre"), torch.randn(3, 8).to("spyre"), torch.randn(8, 4).to("spyre"),
             torch.float32, 1, 1]
    info = type("Info", (), {"name": "addmm.dtype", "is_out": [False]})()
    assert eager._run_with_weight_parts(torch.ops.aten.addmm.dtype, info, bound, 0) is None
    assert called == []


def test_out_of_memory_while_splitting_empties_the_cache_and_the_call_goes_the_ordinary_way(monkeypatch):
    lin, x = _linear(), _x()
    dlin, dx = _linear().to("spyre"), x.to("spyre")
    other = _linear(seed=5).to("spyre")
    with torch.no_grad():
        other(dx)
        assert weight_parts.stats()["entries"] == 1

        def no_memory(*args, **kwargs):
            raise torch.OutOfMemoryError("spyre: out of memory (test)")

        monkeypatch.setattr(eager, "_run_program", no_memory)
        got = dlin(dx).cpu()
        monkeypatch.undo()
    assert weight_parts.stats()["entries"] == 0
    torch.testing.assert_close(got, lin(x), rtol=1e-5, atol=1e-4)


def test_a_replaced_entry_detaches_its_storage_finalizer(monkeypatch):
    """A weight written every step is split every step: one finalizer per live entry, not one per split."""
    x, dlin = _x().to("spyre"), _linear().to("spyre")
    with torch.no_grad():
        dlin(x)
        [first] = weight_parts._cache.entries.values()
        dlin.weight.add_(1)
        dlin(x)
        [second] = weight_parts._cache.entries.values()
    assert not first.finalizer.alive and second.finalizer.alive

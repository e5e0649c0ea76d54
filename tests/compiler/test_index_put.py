"""``index_put_`` / ``index_copy_`` with one 1-d index (a static KV cache's update) compile to programs:
the gather of the scatter's inverse (compiler/index_put.py). Before, Inductor's scatter could not be a
pointwise kernel ("an index read from memory") and ran as a fallback kernel on the host."""

from __future__ import annotations

import pytest
import torch

from torch_spyre.compiler import wrapper

from .spyre_compile_helpers import fresh

import torch_spyre  # noqa: E402,I001


def _no_host_work():
    assert wrapper.host_fallback_stats() == {}
    stats = torch_spyre.fallback_stats()
    assert dict(stats.compile_fallbacks) == {}, stats.compile_fallbacks


def _cache_update(cache, n, src):
    """StaticLayer.update's form: positions from a device counter, the counter advanced in place."""
    pos = torch.arange(src.shape[2], device=cache.device) + n
    n.add_(src.shape[2])
    cache.index_copy_(2, pos, src)
    return cache * 1


def test_static_cache_update_runs_as_programs():
    fresh()
    cache, n = torch.zeros(2, 2, 16, 8), torch.tensor(5)
    ref_cache, ref_n = cache.clone(), n.clone()
    dev_cache, dev_n = cache.to("spyre"), n.to("spyre")
    step = torch.compile(_cache_update)
    for rows in (3, 1, 1):  # a prefill of 3 tokens, then two decode steps (a second graph, reused)
        src = torch.randn(2, 2, rows, 8)
        ref = _cache_update(ref_cache, ref_n, src)
        got = step(dev_cache, dev_n, src.to("spyre"))
        assert torch.equal(got.cpu(), ref)  # a copy: exact
        assert torch.equal(dev_cache.cpu(), ref_cache) and int(dev_n.cpu()) == int(ref_n)
    _no_host_work()


@pytest.mark.parametrize("dim", [0, 1])
def test_index_put_functional_with_duplicates_and_negative_indices(dim):
    fresh()
    x = torch.randn(6, 5, 40)
    idx = torch.tensor([4, -1, 0, 4])  # row 4 twice: the last write wins, as on the CPU
    shape = [6, 5, 40]
    shape[dim] = len(idx)
    v = torch.randn(shape)

    def put(x, idx, v):
        index = [None] * x.dim()
        index[dim] = idx
        return torch.ops.aten.index_put(x, index, v)

    got = torch.compile(put)(x.to("spyre"), idx.to("spyre"), v.to("spyre")).cpu()
    torch.testing.assert_close(got, put(x, idx, v), atol=0, rtol=0)
    _no_host_work()


def test_accumulate_keeps_the_fallback():
    """index_put(accumulate=True) is a scatter-add: not this lowering's; it still runs, as a fallback kernel."""
    fresh()
    x, idx, v = torch.zeros(8, 32), torch.tensor([1, 1, 3]), torch.ones(3, 32)

    def add(x, idx, v):
        return torch.ops.aten.index_put(x, [idx], v, True)

    got = torch.compile(add)(x.to("spyre"), idx.to("spyre"), v.to("spyre")).cpu()
    torch.testing.assert_close(got, add(x, idx, v))
    assert torch_spyre.fallback_stats().compile_fallbacks


def test_an_index_out_of_range_raises_and_leaves_the_target_alone():
    """The inverse's compare alone would match no row for index 30 of 8 and drop that write silently; the
    CPU raises IndexError. The index is read through a gather, which checks it at launch."""
    fresh()
    cache = torch.zeros(8, 64)
    with pytest.raises(IndexError):
        cache.clone().index_copy_(0, torch.tensor([1, 30]), torch.ones(2, 64))
    dev = cache.to("spyre")
    step = torch.compile(lambda c, pos, v: c.index_copy_(0, pos, v))
    with pytest.raises(torch_spyre.SpyreError, match="gather index 30 .* outside \\[0, 8\\)"):
        step(dev, torch.tensor([1, 30]).to("spyre"), torch.ones(2, 64).to("spyre"))
    assert torch.equal(dev.cpu(), cache)  # nothing was written
    step(dev, torch.tensor([0, 2]).to("spyre"), torch.ones(2, 64).to("spyre"))  # the device goes on working
    assert dev.cpu()[:4, 0].tolist() == [1.0, 0.0, 1.0, 0.0]

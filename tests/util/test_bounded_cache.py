"""torch_spyre.util.bounded_cache: the LRU every bounded cache of the project uses."""

from __future__ import annotations

import threading

import pytest

from torch_spyre.util.bounded_cache import BoundedCache


def test_evicts_by_entries_least_recently_used_first():
    dropped = []
    cache = BoundedCache(2, on_drop=lambda k, v: dropped.append((k, v)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent: "b" goes first
    cache.put("c", 3)
    assert dropped == [("b", 2)] and cache.keys() == ["a", "c"] and cache.evictions == 1
    assert "b" not in cache and cache.get("b") is None and cache.get("b", "none") == "none"
    assert len(cache) == 2 and cache.weight == 2


def test_evicts_by_bytes_until_the_new_entry_fits():
    cache = BoundedCache(100)
    for key, size in (("a", 40), ("b", 30), ("c", 20)):
        assert cache.put(key, key * 2, size)
    assert cache.weight == 90
    assert cache.put("d", None, 55)  # 90 + 55 > 100: "a" (40) and "b" (30) leave, "c" (20) stays
    assert cache.keys() == ["c", "d"] and cache.weight == 75 and cache.evictions == 2
    assert cache.get("d", "missing") is None  # a stored None is a value, not a miss


def test_on_drop_sees_every_entry_that_leaves():
    dropped = []
    cache = BoundedCache(10, on_drop=lambda k, v: dropped.append(k))
    cache.put("evicted", 0, 6)
    cache.put("kept", 0, 4)
    cache.put("new", 0, 6)  # evicts "evicted"
    cache.put("kept", 1, 4)  # replaces "kept"
    assert cache.pop("new") == 0 and cache.pop("new", "gone") == "gone"
    cache.clear()
    assert dropped == ["evicted", "kept", "new", "kept"] and len(cache) == 0 and cache.weight == 0
    assert cache.evictions == 1  # only the eviction for room counts


def test_reinsert_replaces_the_value_and_weight_and_makes_it_most_recent():
    cache = BoundedCache(10)
    cache.put("a", 1, 5)
    cache.put("b", 2, 5)
    cache.put("a", 3, 2)
    assert cache.keys() == ["b", "a"] and cache.get("a") == 3 and cache.weight == 7 and cache.evictions == 0
    cache.put("c", 4, 5)  # 7 + 5 > 10: "b", the least recently used, leaves
    assert cache.keys() == ["a", "c"]


def test_an_entry_larger_than_the_bound_is_not_kept_and_evicts_nothing():
    dropped = []
    cache = BoundedCache(10, on_drop=lambda k, v: dropped.append(k))
    cache.put("a", 1, 4)
    cache.put("b", 2, 4)
    assert not cache.put("huge", 3, 11)
    assert cache.keys() == ["a", "b"] and dropped == [] and cache.evictions == 0
    assert not cache.put("a", 5, 11)  # the old value under the key is stale: it leaves
    assert cache.keys() == ["b"] and dropped == ["a"]
    assert cache.put("exact", 6, 10) and cache.keys() == ["exact"]  # a weight equal to the bound fits


def test_a_new_bound_applies_at_the_next_put():
    cache = BoundedCache(3)
    for key in "abc":
        cache.put(key, key)
    cache.bound = 1
    assert len(cache) == 3
    cache.put("d", "d")
    assert cache.keys() == ["d"] and cache.evictions == 3
    cache.bound = 0
    assert not cache.put("e", "e") and cache.keys() == ["d"]


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, None])
def test_bad_bounds_and_weights_are_clear_errors(bad):
    with pytest.raises(ValueError, match="cache bound is a whole number"):
        BoundedCache(bad)
    with pytest.raises(ValueError, match="weight is a whole number"):
        BoundedCache(4).put("a", 1, bad)


def test_on_drop_may_use_the_cache():
    caches = []
    cache = BoundedCache(1, on_drop=lambda k, v: caches[0].get("x"))  # reentrant: no deadlock
    caches.append(cache)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.keys() == ["b"]


def test_threads_keep_the_bound_and_the_weight():
    cache = BoundedCache(50)

    def work(n):
        for i in range(2000):
            cache.put((n, i % 97), i, 1 + i % 5)
            cache.get((n, (i * 7) % 97))
            if i % 11 == 0:
                cache.pop((n, i % 13))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.weight <= 50
    assert cache.weight == sum(1 + v % 5 for v in cache.values())

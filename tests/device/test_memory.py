"""Device memory: exact stats in whole sticks, freeing, caching, out-of-memory."""

from __future__ import annotations

import math

import pytest
import torch

import torch_spyre


def card_bytes(shape, dtype) -> int:
    """What a dense tensor costs on the card: 128-byte sticks over the last dim, for every other index."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    lanes = 128 // itemsize
    if not shape:
        return 128
    return 128 * math.prod(shape[:-1]) * math.ceil(shape[-1] / lanes)


@pytest.mark.parametrize(
    "shape,dtype",
    [((5, 100), torch.float16), ((3,), torch.float32), ((2, 3, 70), torch.float32), ((130,), torch.int8),
     ((7, 1, 33), torch.bfloat16), ((), torch.int64), ((17, 5), torch.bool), ((64,), torch.float16),
     ((65,), torch.float16), ((3, 17), torch.int64)],
)
def test_allocation_is_whole_sticks(settled, shape, dtype):
    base = settled()
    t = torch.zeros(shape, dtype=dtype, device="spyre")
    expected = card_bytes(tuple(d for d in shape if d != 1) or (), dtype)
    assert torch.spyre.memory_allocated() - base == expected
    assert torch_spyre.get_layout(t).nbytes == expected


def test_5x100_fp16_costs_1280_bytes(settled):
    base = settled()
    t = torch.empty(5, 100, dtype=torch.float16, device="spyre")
    assert torch.spyre.memory_allocated() - base == 1280
    del t
    assert torch.spyre.memory_allocated() == base


def test_empty_tensor_costs_nothing(settled):
    base = settled()
    t = torch.empty(0, 5, device="spyre")
    assert torch.spyre.memory_allocated() == base
    assert t.cpu().shape == (0, 5)


def test_views_do_not_allocate_and_storage_lives_while_a_view_does(settled):
    base = settled()
    t = torch.ones(10, 64, device="spyre")
    cost = torch.spyre.memory_allocated() - base
    v = t[2:5, 1:]
    assert torch.spyre.memory_allocated() - base == cost
    del t
    assert torch.spyre.memory_allocated() - base == cost  # the view keeps the storage alive
    assert v.cpu().sum().item() == 3 * 63
    del v
    assert torch.spyre.memory_allocated() == base


def test_peak_and_reset(settled):
    base = settled()
    torch.spyre.reset_peak_memory_stats()
    a = torch.empty(1000, device="spyre")  # 32 sticks
    b = torch.empty(1000, device="spyre")
    del a, b
    assert torch.spyre.memory_allocated() == base
    assert torch.spyre.max_memory_allocated() == base + 2 * 4096
    torch.spyre.reset_peak_memory_stats()
    assert torch.spyre.max_memory_allocated() == base


def test_reserved_cache_and_empty_cache(settled):
    settled()
    torch.spyre.empty_cache()
    reserved0 = torch.spyre.memory_reserved()
    t = torch.empty(12345, device="spyre")
    nbytes = torch_spyre.get_layout(t).nbytes
    assert torch.spyre.memory_reserved() == reserved0 + nbytes
    del t
    assert torch.spyre.memory_reserved() == reserved0 + nbytes  # kept for reuse
    free_before, total = torch.spyre.mem_get_info()
    torch.spyre.empty_cache()
    assert torch.spyre.memory_reserved() == reserved0
    free_after, total2 = torch.spyre.mem_get_info()
    assert total == total2 == torch.spyre.get_device_properties().total_memory
    assert free_after - free_before == nbytes


def test_memory_stats_keys(settled):
    base = settled()
    stats = torch.spyre.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    for key in ("allocated_bytes.all.peak", "reserved_bytes.all.current", "reserved_bytes.all.peak",
                "active.all.current", "num_ooms", "num_alloc_retries"):
        assert key in stats


def test_out_of_memory_changes_nothing(settled):
    torch.spyre.empty_cache()  # a failing allocation drops caches held to save work (weight parts) first
    base = settled()
    keep = torch.ones(100, device="spyre")
    before = {k: v for k, v in torch.spyre.memory_stats().items() if k != "num_ooms"}
    free = torch.spyre.mem_get_info()[1] - torch.spyre.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(10**12, device="spyre")
    msg = str(info.value)
    assert "4000000000000 bytes" in msg and f"{free} bytes" in msg and "empty_cache" in msg
    after = {k: v for k, v in torch.spyre.memory_stats().items() if k != "num_ooms"}
    assert after == before
    again = torch.full((100,), 2.0, device="spyre")  # later allocations work
    assert (again + keep).cpu().tolist() == [3.0] * 100
    assert torch.spyre.memory_stats()["num_ooms"] >= 1
    del keep, again
    assert settled() == base


def test_out_of_memory_is_a_runtime_error_subclass_like_cuda():
    with pytest.raises(RuntimeError):
        torch.empty(2**40, device="spyre")


def test_accounting_survives_many_short_lived_tensors(settled):
    base = settled()
    for _ in range(200):
        x = torch.ones(50, 50, device="spyre")
        y = x * 2
    del x, y
    assert settled() == base


def test_small_card_reclaims_dead_tensors_before_refusing(run_python):
    r = run_python(
        """
        import torch, torch_spyre
        cap = torch.spyre.mem_get_info()[1]
        for _ in range(50):                      # each 0.4 MiB tensor replaces the previous one
            x = torch.ones(100 * 1024, device="spyre")
        keep = [torch.ones(100 * 1024, device="spyre")]
        before = {k: v for k, v in torch.spyre.memory_stats().items() if k != "num_ooms"}
        try:
            while True:
                keep.append(torch.ones(100 * 1024, device="spyre"))
        except torch.OutOfMemoryError as e:
            print("oom after", len(keep), "tried to allocate 409600 bytes" in str(e))
        after = {k: v for k, v in torch.spyre.memory_stats().items() if k != "num_ooms"}
        print("allocated", after["allocated_bytes.all.current"], "of", cap)
        keep.pop()
        y = torch.ones(100 * 1024, device="spyre")   # works again once something is freed
        print("ok", y.sum().item())
        """,
        env={"TORCH_SPYRE_DRAM_CAPACITY_BYTES": str(1 << 20)},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "oom after 1 True"  # x (still alive) + 1 kept: a third 400 KiB block does not fit in 1 MiB
    assert lines[1] == f"allocated {2 * 409600} of {1 << 20}"
    assert lines[2] == "ok 102400.0"

"""Device memory: stick-granular accounting, caching, lookups, and an OOM that changes nothing."""

import numpy as np
import pytest

from torch_spyre.card.memory import DeviceMemory, DeviceOutOfMemoryError, InvalidAddressError

MiB = 1024 * 1024


def test_allocations_are_whole_aligned_sticks():
    m = DeviceMemory(64 * MiB)
    a = m.allocate(1000)
    b = m.allocate(1)
    assert a.nbytes == 1024 and b.nbytes == 128
    assert a.address % 128 == 0 and b.address % 128 == 0
    assert b.address >= a.end
    assert m.allocated == 1152 and m.reserved == 1152


def test_free_caches_and_empty_cache_releases():
    m = DeviceMemory(64 * MiB)
    a = m.allocate(4096)
    m.free(a)
    assert m.allocated == 0 and m.reserved == 4096
    b = m.allocate(4096)  # served from the cache ...
    assert b.address == a.address and b.buffer is a.buffer and m.reserved == 4096
    assert b is not a and not a.live and b.live  # ... through a new handle: the old one stays dead
    m.free(b)
    m.empty_cache()
    assert m.reserved == 0
    with pytest.raises(InvalidAddressError, match="double free"):
        m.free(b)


def test_peak_and_reset():
    m = DeviceMemory(64 * MiB)
    a = m.allocate(MiB)
    m.allocate(MiB)
    m.free(a)
    assert m.peak_allocated == 2 * MiB and m.allocated == MiB
    m.reset_peak()
    assert m.peak_allocated == MiB


def test_out_of_memory_names_bytes_and_changes_nothing():
    m = DeviceMemory(4 * MiB, card=1)
    keep = m.allocate(3 * MiB)
    cached = m.allocate(256 * 1024)
    m.free(cached)
    before = (m.allocated, m.reserved, m.peak_allocated, m.peak_reserved, len(m.live_allocations()))
    with pytest.raises(DeviceOutOfMemoryError) as e:
        m.allocate(2 * MiB)
    assert e.value.requested == 2 * MiB and e.value.free == MiB
    assert "spyre:1" in str(e.value) and str(2 * MiB) in str(e.value) and str(MiB) in str(e.value)
    assert (m.allocated, m.reserved, m.peak_allocated, m.peak_reserved, len(m.live_allocations())) == before
    # Later allocations still work, including one that needs the cache emptied first.
    c = m.allocate(MiB)
    assert m.allocated == 4 * MiB and keep.buffer.size == 3 * MiB and c.nbytes == MiB


def test_lookup_by_device_address_and_host_pointer():
    m = DeviceMemory(64 * MiB)
    allocs = [m.allocate(n) for n in (128, 5000, 300)]
    for a in allocs:
        assert m.find(a.address) == (a, 0)
        assert m.find(a.end - 1) == (a, a.nbytes - 1)
        assert m.find_host(a.host_ptr + 3) == (a, 3)
    with pytest.raises(InvalidAddressError):
        m.find(0)
    m.free(allocs[1])
    with pytest.raises(InvalidAddressError):
        m.find(allocs[1].address)
    # The host index is rebuilt after allocations and frees made since the last lookup.
    with pytest.raises(InvalidAddressError):
        m.find_host(allocs[1].host_ptr)
    d = m.allocate(7000)
    assert m.find_host(d.host_ptr + 5) == (d, 5) and m.find_host(allocs[2].host_ptr) == (allocs[2], 0)


def test_read_write_by_device_address():
    m = DeviceMemory(64 * MiB)
    a = m.allocate(512)
    m.write(a.address + 128, np.arange(32, dtype=np.float32))
    np.testing.assert_array_equal(m.read(a.address + 128, 128).view(np.float32), np.arange(32, dtype=np.float32))
    with pytest.raises(InvalidAddressError, match="runs past the end"):
        m.read(a.address + 256, 512)


def test_address_ranges_are_reused_after_empty_cache():
    m = DeviceMemory(MiB)
    for _ in range(50):  # far more than the virtual range holds without reuse
        a = m.allocate(MiB)
        m.free(a)
        m.empty_cache()
    assert m.allocated == 0 and m.reserved == 0


def test_each_card_has_its_own_address_range():
    a, b = DeviceMemory(MiB, card=0).allocate(128), DeviceMemory(MiB, card=1).allocate(128)
    assert abs(a.address - b.address) >= 2 * MiB


def test_negative_size():
    with pytest.raises(ValueError, match="negative"):
        DeviceMemory(MiB).allocate(-1)


def test_an_allocation_larger_than_host_ram_succeeds_until_touched():
    # 64 GiB on a card of 128 GiB: host pages are committed only where written.
    m = DeviceMemory(128 * 1024 * MiB)
    a = m.allocate(64 * 1024 * MiB)
    a.buffer[:: 1 << 30] = 7  # touch one byte per GiB
    assert m.allocated == 64 * 1024 * MiB and int(a.buffer[1 << 30]) == 7
    m.free(a)
    m.empty_cache()
    assert m.reserved == 0

"""Timing-only mode (runtime/timing_only.py): programs timed but not executed, tensors without data."""

from __future__ import annotations

import io

import pytest
import torch

import torch_spyre
import torch_spyre.profiler
from torch_spyre.device import copy as device_copy
from torch_spyre.device import storage
from torch_spyre.errors import SpyreError
from torch_spyre.runtime import stream as rt
from torch_spyre.runtime import timing_only as T


def _kernels(records):
    """(kind, name, simulated duration, FLOPs, DRAM bytes) of every piece of compute work, in order."""
    return [(r.kind, r.name, r.duration, r.details.get("flops"), r.details.get("dram_bytes"))
            for r in records if r.resource == "compute"]


def _profiled(fn, *args):
    clock = rt.clock(torch.spyre.current_device())
    torch.spyre.synchronize()
    before = clock.now
    with torch.no_grad(), torch_spyre.profiler.profile() as prof:
        out = fn(*args)
    torch.spyre.synchronize()
    return out, prof.events(), clock.now - before


class Block(torch.nn.Module):
    """A small transformer-shaped block: norm, attention, MLP."""

    def __init__(self, d: int = 64, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.slow
def test_timing_only_gives_the_faithful_kernels_times_and_clock():
    torch.manual_seed(0)
    model = Block().half().to("spyre")
    compiled = torch.compile(model, dynamic=False)
    x = torch.randn(2, 64, 64, dtype=torch.float16)
    xs = x.to("spyre")
    _profiled(compiled, xs)  # compile and relayout the weights: not part of either measured run
    faithful, faithful_records, faithful_clock = _profiled(compiled, xs)
    with torch_spyre.timing_only():
        xt = x.to("spyre")  # charged, not stored
        timed, timed_records, timed_clock = _profiled(compiled, xt)
    assert _kernels(timed_records) == _kernels(faithful_records)
    assert len(_kernels(timed_records)) >= 5
    # The clock sums the same durations from another starting time: equal up to that sum's rounding.
    assert timed_clock == pytest.approx(faithful_clock, rel=1e-12) and faithful_clock > 0
    # The faithful result is right; the timing-only one has no data.
    with torch.no_grad():
        expected = model.cpu().float()(x.float())
    assert torch.allclose(faithful.cpu().float(), expected, atol=3e-2, rtol=3e-2)
    assert storage.allocation_of(faithful).has_data and not storage.allocation_of(timed).has_data
    with pytest.raises(T.NoDataError):
        timed.cpu()


@pytest.mark.slow  # eager ops compile as single-op programs (about 10 s)
def test_reading_a_tensor_without_data_raises_a_clear_error():
    with torch_spyre.timing_only():
        x = torch.randn(8, 64).to("spyre")
        y = x * 2  # an eager op: a program, timed, not executed
    for read in (lambda: x.cpu(), lambda: y.cpu(), lambda: y.sum().item(), lambda: print(y), lambda: str(x),
                 lambda: torch.save(x, io.BytesIO())):
        with pytest.raises(T.NoDataError, match="has no data: it was made .* in timing-only mode") as e:
            read()
        assert isinstance(e.value, SpyreError)
    assert torch.spyre.NoDataError is T.NoDataError and torch.spyre.timing_only is T.timing_only


def test_allocations_are_accounted_but_not_stored():
    torch.spyre.empty_cache()
    before = torch.spyre.memory_allocated()
    with torch_spyre.timing_only():
        big = torch.empty(4096, 4096, dtype=torch.float16, device="spyre")
        assert torch.spyre.memory_allocated() - before == 4096 * 4096 * 2
        weights = torch.nn.Linear(1024, 512, dtype=torch.float16, device="meta").to_empty(device="spyre")
        assert torch.spyre.memory_allocated() - before == 4096 * 4096 * 2 + (512 * 1024 + 512) * 2
    alloc = storage.allocation_of(big)
    assert not alloc.has_data and not storage.allocation_of(weights.weight).has_data
    del big, weights
    assert torch.spyre.memory_allocated() == before


def test_a_copy_to_the_card_is_charged_but_not_stored_and_a_later_write_brings_data_back():
    host = torch.randn(256, 256)
    clock = rt.clock(torch.spyre.current_device())
    torch.spyre.synchronize()
    start = clock.now
    with torch_spyre.timing_only():
        x = host.to("spyre")
    torch.spyre.synchronize()
    assert clock.now - start == pytest.approx(device_copy.pcie_seconds(256 * 256 * 4))
    assert not storage.allocation_of(x).has_data
    x.copy_(host)  # outside the mode, a whole write stores the values again
    assert torch.equal(x.cpu(), host)


def test_faithful_work_on_a_tensor_without_data_is_timed_and_its_result_has_none():
    with torch_spyre.timing_only():
        x = torch.randn(64, 64).to("spyre")
    y = x + 1  # faithful mode, but the input holds nothing: the program is timed, not run
    z = y.clone()  # a device copy: likewise
    for t in (y, z):
        with pytest.raises(T.NoDataError):
            t.cpu()


def test_the_mode_nests_and_follows_the_environment(monkeypatch):
    monkeypatch.delenv(T.ENV, raising=False)
    assert not T.enabled()
    with T.timing_only():
        assert T.enabled()
        with T.timing_only(False):
            assert not T.enabled()
        assert T.enabled()
    monkeypatch.setenv(T.ENV, "1")
    assert T.enabled()
    with T.timing_only(False):
        assert not T.enabled()
    monkeypatch.setenv(T.ENV, "maybe")
    with pytest.raises(T.TimingOnlySettingError, match="TORCH_SPYRE_TIMING_ONLY='maybe': expected 1"):
        T.enabled()


@pytest.mark.parametrize("view", [lambda w: w, lambda w: w[0].t(), lambda w: w.mT, lambda w: w.permute(2, 0, 1), lambda w: w[1:],
                                  lambda w: w[:, ::2], lambda w: w.transpose(0, 1)[:, :, :40],
                                  lambda w: w.reshape(-1)[5:-5], lambda w: w[:, :1]])
def test_transfer_size_of_views_is_the_sticks_they_touch(view):
    # A view of every element in any order (a weight's .t()) touches every stick: counted without
    # mapping its indices; any other view still counts the sticks its elements fall in.
    from torch_spyre.device import tensor as device_tensor

    w = torch.randn(3, 70, 130, dtype=torch.float16).to("spyre")
    v = view(w)
    layout = storage.allocation_of(w).meta["layout"]
    offsets = layout.device_offsets(device_tensor._host_indices(v))
    assert device_tensor.transfer_size(v).device_bytes == device_tensor._touched_bytes(offsets, layout)


@pytest.mark.slow  # compiles a small block (about 15 s)
def test_a_first_compiled_call_in_timing_only_mode_keeps_the_weights_values():
    """The first compiled call relayouts weights in place; doing it in timing-only mode must not leave them
    without data (every later faithful run read nothing and raised NoDataError)."""
    torch.manual_seed(0)
    model = Block().half()
    on_card = Block().half()
    on_card.load_state_dict(model.state_dict())
    on_card = on_card.to("spyre")
    compiled = torch.compile(on_card, dynamic=False)
    x = torch.randn(2, 64, 64, dtype=torch.float16)
    with torch.no_grad():
        with torch_spyre.timing_only():
            compiled(x.to("spyre"))
        got = compiled(x.to("spyre")).cpu().float()
        expected = model.float()(x.float())
    assert torch.allclose(got, expected, atol=3e-2, rtol=3e-2)
    assert all(storage.allocation_of(p).has_data for p in on_card.parameters())

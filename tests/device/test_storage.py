"""The private-torch mechanisms under device tensors (DLPack creation, set_ redispatch, freeing)."""

from __future__ import annotations

import gc

import pytest
import torch

from torch_spyre.device import storage, tensor


def test_storage_tensor_is_a_plain_privateuse1_tensor_over_the_allocation():
    t = torch.ones(3, 5, device="spyre")
    assert type(t) is torch.Tensor
    assert t.device == torch.device("spyre:0")
    assert "PrivateUse1" in repr(torch._C._dispatch_keys(t))
    alloc = storage.allocation_of(t)
    assert t.untyped_storage().data_ptr() == alloc.host_ptr
    assert t.untyped_storage().nbytes() == 15 * 4  # the host element space, not the padded device bytes
    assert alloc.nbytes == 3 * 128


@pytest.mark.parametrize("size,stride", [((8, 16, 384), (6144, 384, 1)), ((4, 5), (1, 4)), ((3, 1, 5), (5, 1, 1)),
                                         ((2, 3), (0, 1)), ((5,), (2,)), ((), ())])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_empty_strided_geometry_and_storage(size, stride, dtype):
    # The DLPack import gives the view's geometry at once where its storage is the layout's host element
    # space (dense, permuted, broadcast and gapped strides alike); the storage holds exactly that space.
    t = tensor.empty_strided(size, stride, dtype, 0)
    layout = storage.allocation_of(t).meta["layout"]
    assert (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) == (size, stride, 0, dtype)
    assert t.device == torch.device("spyre:0") and type(t) is torch.Tensor
    assert t.untyped_storage().nbytes() == layout.numel * t.element_size()
    assert t.untyped_storage().data_ptr() == storage.allocation_of(t).host_ptr


def test_set_view_only_edits_metadata():
    t = torch.arange(10.0).to("spyre")
    v = storage.view_of(t, t.dtype, (2, 2), (3, 1), 4)
    assert v.cpu().tolist() == [[4.0, 5.0], [7.0, 8.0]]
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


def test_freed_allocations_are_swept_when_stats_are_read(settled):
    base = settled()
    t = torch.ones(100, device="spyre")
    alloc = storage.allocation_of(t)
    del t
    gc.collect()
    assert torch.spyre.memory_allocated() == base  # the stats query swept it
    assert all(a is not alloc for a in tensor.cards.card(0).memory.live_allocations())


def test_tensors_on_a_second_card(run_python):
    r = run_python(
        """
        import torch, torch_spyre
        from torch_spyre.runtime import stream as rt
        a = torch.arange(4.0).to("spyre:1")
        got = []
        rt.add_listener(got.append)
        b = a.to("spyre:0")
        rt.remove_listener(got.append)
        d2h, h2d = got
        assert (d2h.card, d2h.kind, h2d.card, h2d.kind) == (1, "copy_d2h", 0, "copy_h2d"), got
        assert h2d.start >= d2h.end, got  # card to card goes through the host link
        c = a * 2
        print(a.device, b.device, c.device, torch.spyre.memory_allocated(1), torch.spyre.memory_allocated(0))
        print(b.cpu().tolist())
        try:
            a + b
        except RuntimeError as e:
            print("mixed:", "spyre:1" in str(e) and "spyre:0" in str(e))
        """,
        env={"TORCH_SPYRE_NUM_CARDS": "2"},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "spyre:1 spyre:0 spyre:1 256 128"
    assert lines[1] == "[0.0, 1.0, 2.0, 3.0]"
    assert lines[2] == "mixed: True"

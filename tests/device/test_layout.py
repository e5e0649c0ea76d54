"""Stick layouts of device tensors and their views; device memory holds the card's layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_spyre
from torch_spyre.card.layout import StickLayout
from torch_spyre.device import storage


def raw_device(t: torch.Tensor) -> np.ndarray:
    alloc = storage.allocation_of(t)
    layout = alloc.meta["layout"]
    return alloc.view(layout.storage_dtype, 0, layout.device_numel)


def test_default_layout_sticks_the_last_dim():
    t = torch.zeros(5, 100, 150, dtype=torch.float16).to("spyre")
    lay = torch_spyre.get_layout(t)
    assert lay.device_size == (100, 3, 5, 64)  # IBM's documented example
    assert lay.stride_map == (150, 64, 15000, 1)
    assert lay.padding == 42
    assert lay.device_dtype == "dlfloat16"
    assert lay.stick_layout.stick_dim == 2


def test_device_memory_is_in_stick_order_with_zero_padding():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = x.to("spyre")
    dev = raw_device(t).reshape(1, 2, 32)  # [sticks, rows, lanes]
    assert dev[0, :, :3].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not dev[0, :, 3:].any()


def test_to_spyre_with_another_stick_dim():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = torch_spyre.to_spyre(x, stick_dim=0)
    lay = torch_spyre.get_layout(t)
    assert lay.stick_layout.stick_dim == 0
    assert lay.device_size == StickLayout((3, 4), 0, "float32").device_size
    # column j of x is one stick on the device
    dev = raw_device(t).reshape(lay.device_size)
    assert lay.device_size == (1, 4, 32)  # [sticks, columns, lanes]
    assert dev[0, 1, :3].tolist() == x[:, 1].tolist()
    assert torch.equal(t.cpu(), x)
    assert torch.equal((t + 1).cpu(), x + 1)


def test_permuted_strides_keep_a_dense_layout():
    x = torch.randn(4, 6).t()  # strides (1, 6)
    t = x.to("spyre")  # preserve_format keeps the strides
    assert t.stride() == x.stride()
    lay = torch_spyre.get_layout(t)
    assert lay.stick_layout.host_shape == (4, 6)  # sizes by decreasing stride
    assert torch.equal(t.cpu(), x)


def test_non_dense_strides_get_a_flat_layout():
    t = torch.empty_strided((3, 4), (10, 2), device="spyre")
    lay = torch_spyre.get_layout(t)
    assert lay.stick_layout.host_shape == (1 + 2 * 10 + 3 * 2,)
    t.copy_(torch.arange(12.0).reshape(3, 4))
    assert t.cpu().flatten().tolist() == list(range(12))


def test_views_share_storage_and_report_their_geometry():
    t = torch.arange(24.0).reshape(4, 6).to("spyre")
    v = t[1:3, 2:]
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    lay = torch_spyre.get_layout(v)
    assert lay.stick_layout == torch_spyre.get_layout(t).stick_layout
    assert (lay.size, lay.stride, lay.storage_offset) == ((2, 4), (6, 1), 8)
    assert not lay.is_whole and torch_spyre.get_layout(t).is_whole
    v.fill_(-1)
    expected = torch.arange(24.0).reshape(4, 6)
    expected[1:3, 2:] = -1
    assert torch.equal(t.cpu(), expected)


def test_dtype_views_reinterpret_host_format_bits():
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float16)
    t = x.to("spyre")
    assert torch.equal(t.view(torch.int16).cpu(), x.view(torch.int16))
    f = torch.tensor([1.5, 2.5]).to("spyre")
    assert torch.equal(f.view(torch.int32).cpu(), torch.tensor([1.5, 2.5]).view(torch.int32))
    f.view(torch.int32).fill_(0)
    assert f.cpu().tolist() == [0.0, 0.0]


def test_get_layout_rejects_cpu_tensors():
    with pytest.raises(TypeError, match="spyre device"):
        torch_spyre.get_layout(torch.ones(2))

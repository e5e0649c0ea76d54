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


def _bits(values: torch.Tensor) -> torch.Tensor:
    """fp32 values with NaNs of several payloads and signs (a bit move must keep them)."""
    out = values.clone()
    flat = out.view(-1).view(torch.int32)
    flat[::7] = 0x7FC00001
    flat[3::11] = -0x003FFFFF  # 0xFFC00001: a negative NaN with a payload
    return out


@pytest.mark.parametrize("case", ["reshape_3d_to_2d", "transpose", "permute_4d", "slice", "offset_row", "padded",
                                  "int64", "bool", "slice_of_sticks"])
def test_device_to_device_copy_is_the_read_write_round_trip_bit_for_bit(case):
    """``tensor.copy_within`` (one gather of device elements, the map cached per geometry) writes exactly
    the bytes of reading ``src`` to the host and writing it to ``dst``, and reports the same transfers."""
    from torch_spyre.device import tensor as device_tensor

    g = torch.Generator().manual_seed(0)
    x = _bits(torch.randn(8, 12, 64, generator=g))
    views = {
        "reshape_3d_to_2d": lambda t: t.view(96, 64),
        "transpose": lambda t: t.transpose(1, 2),
        "permute_4d": lambda t: t.view(8, 12, 2, 32).permute(0, 2, 1, 3),
        "slice": lambda t: t[:, 1:5, 3:40],
        "offset_row": lambda t: t[3],
        "padded": lambda t: t[:, :, :40].contiguous().view(96, 40),
        "int64": lambda t: (t.nan_to_num() * 1000).to(torch.int64).transpose(0, 1),
        "bool": lambda t: (t > 0).transpose(0, 2),
        "slice_of_sticks": lambda t: t[:, 2:7, 32:],
    }
    src = views[case](x.to("spyre"))
    via_gather = torch.empty(src.shape, dtype=src.dtype, device="spyre")
    via_host = torch.empty(src.shape, dtype=src.dtype, device="spyre")
    moved = device_tensor.copy_within(src, via_gather)
    assert moved is not None
    values, read = device_tensor.read(src)
    written = device_tensor.write(via_host, values)
    assert (moved[0].device_bytes, moved[1].device_bytes) == (read.device_bytes, written.device_bytes)
    assert np.array_equal(raw_device(via_gather).view(np.uint8), raw_device(via_host).view(np.uint8))
    assert torch.equal(via_gather.cpu().view(-1).view(torch.uint8), views[case](x).contiguous().view(-1).view(torch.uint8))
    again = torch.empty(src.shape, dtype=src.dtype, device="spyre")  # the cached map gives the same
    device_tensor.copy_within(src, again)
    assert np.array_equal(raw_device(again).view(np.uint8), raw_device(via_host).view(np.uint8))


@pytest.mark.parametrize("case,by_stick", [("reshape", True), ("permute_keeping_the_sticked_dim", True),
                                           ("padded", True), ("transpose", False), ("slice_inside_sticks", False)])
def test_device_to_device_copy_moves_whole_sticks_where_it_can(case, by_stick):
    """Where each destination stick is one whole source stick, the cached map names source sticks (a gather
    of 128-byte rows, one index a stick) instead of elements; the bytes are the same (test above)."""
    from torch_spyre.device import storage
    from torch_spyre.device import tensor as device_tensor

    x = torch.randn(8, 12, 64).to("spyre")
    src = {"reshape": lambda t: t.view(96, 64),
           "permute_keeping_the_sticked_dim": lambda t: t.view(8, 12, 2, 32).permute(0, 2, 1, 3),
           "padded": lambda t: t[:, :, :40].contiguous().view(96, 40), "transpose": lambda t: t.transpose(1, 2),
           "slice_inside_sticks": lambda t: t[:, 1:5, 3:40]}[case](x)
    dst = torch.empty(src.shape, device="spyre")
    layout = storage.allocation_of(dst).meta["layout"]
    index, _, _, lanes = device_tensor._copy_map(storage.allocation_of(src).meta["layout"], tuple(src.shape),
                                                 tuple(src.stride()), src.storage_offset(), layout)
    assert (lanes, index.size) == ((layout.lanes, layout.device_numel // layout.lanes) if by_stick
                                   else (0, layout.device_numel))
    device_tensor.copy_within(src, dst)
    assert torch.equal(dst.cpu(), src.cpu())


def test_device_to_device_copy_gathers_only_bit_moves():
    """16-bit floats convert through fp32, a partial destination keeps its other bytes, a broadcast or a
    dtype change converts: those go through the host round trip (``copy_within`` declines them)."""
    from torch_spyre.device import tensor as device_tensor

    x = torch.randn(4, 64).to("spyre")
    assert device_tensor.copy_within(x.half(), torch.empty(4, 64, dtype=torch.float16, device="spyre")) is None
    assert device_tensor.copy_within(x, torch.empty(8, 64, device="spyre")[:4]) is None
    assert device_tensor.copy_within(x[:1], torch.empty(4, 64, device="spyre")) is None
    assert device_tensor.copy_within(x, torch.empty(4, 64, dtype=torch.int64, device="spyre")) is None
    y = torch.empty(64, 4, device="spyre").t()
    y.copy_(x)  # permuted destination: through the host
    assert torch.equal(y.cpu(), x.cpu())


def test_device_to_device_copy_maps_are_bounded_by_bytes(monkeypatch):
    """Each cached map is as large as its destination; a view whose shape changes every step (a growing
    KV cache's ``x[:, :L].transpose`` made contiguous) must not pile them up: the least recently used
    are dropped beyond the byte budget, and a map larger than it is not kept at all."""
    from torch_spyre.device import tensor as device_tensor
    from torch_spyre.util.bounded_cache import BoundedCache

    monkeypatch.setattr(device_tensor, "_copy_maps", BoundedCache(64 << 10))
    x = torch.randn(4, 64, 64)
    xd = x.to("spyre")
    for length in range(8, 64, 4):  # 14 geometries of 8-60 KiB maps
        got = xd[:, :length].transpose(1, 2).contiguous()
        assert torch.equal(got.cpu(), x[:, :length].transpose(1, 2).contiguous())
        kept = sum(i.nbytes + (0 if p is None else p.nbytes) for i, p, *_ in device_tensor._copy_maps.values())
        assert kept == device_tensor._copy_maps.weight <= 64 << 10
    assert 0 < len(device_tensor._copy_maps) < 14
    big = torch.randn(4, 128, 64).to("spyre")
    assert torch.equal(big.transpose(1, 2).contiguous().cpu(), big.cpu().transpose(1, 2).contiguous())
    assert all(k[1] != (4, 64, 128) for k in device_tensor._copy_maps)  # 128 KiB: over the budget, not kept

"""Copies between the host and the card, and within/between cards, with their simulated time.

Time model (the one place it is decided for copies):

- host<->device: the PCIe Gen5 x16 link, ``pcie_latency_s + device_bytes / pcie_effective_bandwidth``,
  on the current stream of the card, resource ``h2d`` or ``d2h``. ``device_bytes`` are the whole sticks the
  transfer touches (padding included: the card moves sticks).
- device->device on one card: a DMA through LPDDR5, ``kernel_fixed_cost_s + 2 * bytes / (peak x mixed
  efficiency)`` (read and write), resource ``compute``.
- card->card: a ``d2h`` on the source card followed by an ``h2d`` on the destination card.

A blocking copy to the host makes the host observe the copy's end (``DeviceClock.observe``), like
``cudaMemcpy``. With ``non_blocking=True`` it does not: the host runs ahead, and an event or
``torch.spyre.synchronize()`` observes the time later. The bytes are always there at once (the card
executes functionally; only its timing is simulated), so ``non_blocking`` never returns stale data.

In timing-only mode (``runtime/timing_only.py``) copies are charged but store nothing: the destination
on the card holds no data afterwards, and reading a tensor without data raises ``NoDataError``.
"""

from __future__ import annotations

import torch

from ..runtime import stream as rt
from ..runtime import timing_only
from . import cards, tensor


def pcie_seconds(nbytes: int) -> float:
    cfg = cards.config()
    return cfg.pcie_latency_s + nbytes / cfg.pcie_effective_bandwidth


def d2d_seconds(nbytes: int) -> float:
    cfg = cards.config()
    return cfg.kernel_fixed_cost_s + 2 * nbytes / (cfg.dram_peak_bandwidth * cfg.dram_mixed_efficiency)


def _card(t: torch.Tensor) -> int:
    return t.device.index or 0


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten::_copy_from``: ``dst.copy_(src)`` where at least one side is on a spyre device."""
    src_spyre, dst_spyre = src.device.type == "spyre", dst.device.type == "spyre"
    if src_spyre and not dst_spyre:
        if dst.device.type != "cpu":
            raise RuntimeError(f"cannot copy between {src.device} and {dst.device}; go through the CPU")
        values, moved = tensor.read(src)
        dst.copy_(values)
        card = _card(src)
        rec = rt.current_stream(card).enqueue(
            "copy_d2h", pcie_seconds(moved.device_bytes), kind="copy_d2h", resource="d2h",
            details={"bytes": moved.device_bytes, "non_blocking": non_blocking},
        )
        if not non_blocking:
            rt.clock(card).observe(rec.end)
        return dst
    if dst_spyre and not src_spyre:
        if src.device.type != "cpu":
            raise RuntimeError(f"cannot copy between {src.device} and {dst.device}; go through the CPU")
        moved = tensor.write(dst, src)
        rt.current_stream(_card(dst)).enqueue(
            "copy_h2d", pcie_seconds(moved.device_bytes), kind="copy_h2d", resource="h2d",
            details={"bytes": moved.device_bytes, "non_blocking": non_blocking},
        )
        return dst
    # device -> device
    if timing_only.enabled() or not tensor.has_data(src):  # nothing to move: the copy is only timed
        read_moved, written = tensor.transfer_size(src), tensor.transfer_size(dst)
        tensor.mark_no_data(dst)
    elif (moved := tensor.copy_within(src, dst)) is not None:  # a bit move: one gather of device elements
        read_moved, written = moved
    else:
        # A conversion on the card goes through fp32, never IEEE fp16: DLFloat16 reads as fp32 exactly (values
        # beyond fp16's range or below its normals stay), and fp32 becomes DLFloat16 in one rounding.
        wide = src.dtype in (torch.float16, torch.bfloat16)
        values, read_moved = tensor.read(src, as_dtype=torch.float32 if wide else None)
        if dst.dtype == torch.bfloat16 and src.dtype != torch.bfloat16:
            # A conversion to bf16 rounds as torch's does (to nearest even, 8 bits). DLFloat16 holds every bf16
            # value in its range, so the result is stored exactly; fp32 straight to DLFloat16 would round twice
            # (to 9 bits, ties away, then to bf16 when read), one bf16 step off for about 1 value in 8.
            values = values.to(torch.bfloat16)
        written = tensor.write(dst, values, computed_in_fp32=values.dtype == torch.float32)
    s_card, d_card = _card(src), _card(dst)
    if s_card == d_card:
        rt.current_stream(s_card).enqueue(
            "copy_d2d", d2d_seconds(max(read_moved.device_bytes, written.device_bytes)), kind="copy_d2d",
            resource="compute", details={"bytes": written.device_bytes},
        )
    else:
        out = rt.current_stream(s_card).enqueue(
            "copy_d2h", pcie_seconds(read_moved.device_bytes), kind="copy_d2h", resource="d2h",
            details={"bytes": read_moved.device_bytes, "to": f"spyre:{d_card}"},
        )
        dst_stream = rt.current_stream(d_card)
        dst_stream.ready_at = max(dst_stream.ready_at, out.end)  # the data is on the host link by then
        rt.current_stream(d_card).enqueue(
            "copy_h2d", pcie_seconds(written.device_bytes), kind="copy_h2d", resource="h2d",
            details={"bytes": written.device_bytes, "from": f"spyre:{s_card}"},
        )
    return dst


def contiguous_copy(src: torch.Tensor) -> torch.Tensor:
    """``src.clone(memory_format=torch.contiguous_format)`` of a spyre tensor, for callers already inside a
    spyre kernel (the compiler's eager runner copying an operand): the same new tensor and the same copy
    (``copy_from``, its time and transfers), without the dispatcher's two round trips into Python kernels
    (``empty.memory_format`` and ``_copy_from``)."""
    out = tensor.empty_strided(src.shape, tensor.contiguous_strides(src.shape), src.dtype, _card(src))
    return copy_from(src, out)

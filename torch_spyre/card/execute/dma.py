"""The DMA engine: strided stick loads and stores between device memory and the scratchpad, and
gathers of rows picked by an index tensor. Every access to device memory is recorded for the race check."""

from __future__ import annotations

import numpy as np

from ...program import STICK_BYTES, DmaGather, DmaLoad, DmaPattern, DmaStore, dram_addr
from ..memory import InvalidAddressError
from .state import CoreState, DeviceAccess


def offset_grid(base: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """``base + sum(i_d * strides_d)`` over the index grid of ``shape`` (int64): where each element of a
    strided pattern lies."""
    out = np.full(shape, base, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        out += (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(shape) - d - 1))
    return out


def gather_index_problem(index: np.ndarray, ins: DmaGather, program) -> str | None:
    """Why a gather cannot use these (decoded) index values, or None. Depends on data: checked at every
    launch, by the fast executor too."""
    if index.dtype.kind != "i":
        return f"gather index must be an integer tensor, got {ins.index.dtype}"
    bad = np.flatnonzero((index < 0) | (index >= ins.num_rows))
    if not bad.size:
        return None
    origin = ""
    g = program.metadata.get("gather")  # which tensors the gather reads, when the compiler recorded it
    if not isinstance(g, dict):  # a group of gathers in one program: the member reading this source (each
        # member has its own source operand, also when two lookups read one table)
        members = program.metadata.get("gather_members") or []
        g = next((m for m in members if isinstance(m, dict) and m.get("source_operand") == ins.src.operand), None)
    if isinstance(g, dict) and "index_operand" in g:
        origin = (f"; the index tensor is %{g['index_operand']}, whose values must be valid rows of "
                  f"%{g.get('source_operand', '?')} along dim {g.get('dim', 0)}")
    return (f"gather index {int(index[bad[0]])} at position {int(bad[0])} is outside "
            f"[0, {ins.num_rows}) ({bad.size} indices out of range){origin}")


def gather_rows(sp: np.ndarray, buffer: np.ndarray, offset: int, ins: DmaGather, index: np.ndarray) -> None:
    """Copy the source rows ``index`` picks (device ``buffer`` from ``offset``) into scratchpad ``sp`` at
    the gather's destination: the data movement of a DmaGather, for both executors."""
    row_bytes = ins.row_sticks * STICK_BYTES
    rows = np.ndarray((max(ins.num_rows, 1), row_bytes), np.uint8, buffer=buffer, offset=offset,
                      strides=(ins.row_stride, 1))
    sp[ins.sp_offset: ins.sp_offset + index.size * row_bytes] = rows[index].reshape(-1)


class DmaEngine:
    """Mixed into the execution; uses its ``card``, ``program``, ``stats``, ``segments`` and ``accesses``."""

    def _device_buffer(self, st: CoreState, address: int, lo: int, hi: int) -> tuple[np.ndarray, int]:
        """The allocation buffer holding device bytes [address+lo, address+hi), and address's offset in it."""
        ins = st.instrs[st.pc]
        if (address + lo) % STICK_BYTES:
            raise self._fail(st, f"device address {address + lo:#x} is not {STICK_BYTES}-byte aligned")
        try:
            alloc, off = self.card.memory.find(address + lo)
        except InvalidAddressError as e:
            raise self._fail(st, f"{e}; was operand %{dram_addr(ins).operand} bound to a live tensor?") from None
        if address + hi > alloc.end:
            raise self._fail(st, f"device range [{address + lo:#x}, {address + hi:#x}) runs past the end of its "
                                 f"allocation [{alloc.address:#x}, {alloc.end:#x}); the operand is too small "
                                 "for this transfer")
        return alloc.buffer, off - lo

    def _dram_sticks(self, st: CoreState, address: int, pattern: DmaPattern) -> tuple[np.ndarray, np.ndarray]:
        """The device side of a DMA as a (*shape, 128) byte view, and its stick numbers."""
        lo, hi = pattern.span(pattern.dram_strides)
        buf, off = self._device_buffer(st, address, lo, hi)
        view = np.ndarray((*pattern.shape, STICK_BYTES), np.uint8, buffer=buf, offset=off,
                          strides=(*pattern.dram_strides, 1))
        sticks = offset_grid(address // STICK_BYTES, pattern.shape, tuple(s // STICK_BYTES for s in pattern.dram_strides))
        return view, sticks.reshape(-1)

    def _record(self, st: CoreState, sticks: np.ndarray, write: bool) -> None:
        if st.segment is None:
            st.segment = len(self.segments)
            self.segments.append((st.id, int(st.vc[st.id]), st.vc.copy()))
        self.accesses.append(DeviceAccess(st.id, st.pc, st.segment, write, sticks))

    def _dma_load(self, st: CoreState, ins: DmaLoad) -> bool:
        if ins.pattern.sticks:
            dram, sticks = self._dram_sticks(st, int(st.addrs[st.pc]), ins.pattern)
            self._sp_sticks(st, ins.sp_offset, ins.pattern)[...] = dram
            hi = ins.pattern.sp_range(ins.sp_offset)[1]
            self._mark_written(st, self._sp_sticks(st, ins.sp_offset, ins.pattern, mask=True), hi)
            self._record(st, sticks, write=False)
        self.stats._add(self.stats.dma_read_bytes, st.id, ins.pattern.nbytes)
        return True

    def _dma_store(self, st: CoreState, ins: DmaStore) -> bool:
        if ins.pattern.sticks:
            src = self._sp_sticks(st, ins.sp_offset, ins.pattern)
            mask = self._sp_sticks(st, ins.sp_offset, ins.pattern, mask=True)
            if not mask.all():
                self._require_written(st, mask, ins.sp_offset, "dma_store")
            dram, sticks = self._dram_sticks(st, int(st.addrs[st.pc]), ins.pattern)
            dram[...] = src
            self._record(st, sticks, write=True)
        self.stats._add(self.stats.dma_write_bytes, st.id, ins.pattern.nbytes)
        return True

    def _dma_gather(self, st: CoreState, ins: DmaGather) -> bool:
        index = self._read(st, ins.index, "index").reshape(-1)
        problem = gather_index_problem(index, ins, self.program)
        if problem:
            raise self._fail(st, problem)
        row_bytes = ins.row_sticks * STICK_BYTES
        n = index.size
        lo, hi = ins.sp_range()
        self._check_span(st, lo, hi, "the gather destination")
        self._touch(st, lo, hi)
        if n:
            address = int(st.addrs[st.pc])
            rows_hi = (ins.num_rows - 1) * ins.row_stride + row_bytes if ins.num_rows else 0
            buf, off = self._device_buffer(st, address, 0, max(rows_hi, row_bytes))
            gather_rows(st.sp, buf, off, ins, index)
            mask = st.written[ins.sp_offset: ins.sp_offset + n * row_bytes]
            self._mark_written(st, mask, ins.sp_offset + n * row_bytes)
            first = (address + index * ins.row_stride) // STICK_BYTES
            sticks = (first[:, None] + np.arange(ins.row_sticks, dtype=np.int64)[None, :]).reshape(-1)
            self._record(st, sticks, write=False)
        self.stats._add(self.stats.dma_read_bytes, st.id, n * row_bytes)
        return True

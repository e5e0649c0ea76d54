"""Scratchpad access with the checks real hardware skips: bounds, reads of bytes nothing wrote in this
execution (a written-mask per byte), and the record of each core's uses that the scratchpad race check
reads."""

from __future__ import annotations

import numpy as np

from ...program import STICK_BYTES, DmaPattern, SpTensor
from .. import vector_ops
from .state import CoreState, ExecutionError, ring_race_fix


class ScratchpadAccess:
    """Mixed into the execution; uses its ``limit``, ``pads`` and ``in_flight``."""

    def _fail(self, st: CoreState, message: str) -> ExecutionError:
        return ExecutionError(message, st.id, st.pc, st.instrs[st.pc])

    def _check_span(self, st: CoreState, lo: int, hi: int, what: str) -> None:
        if lo < 0 or hi > self.limit:
            raise self._fail(st, f"{what} touches scratchpad bytes [{lo}, {hi}) outside the plannable "
                                 f"scratchpad [0, {self.limit}): the plan needs {hi} bytes")

    def _view(self, st: CoreState, t: SpTensor, what: str) -> np.ndarray:
        """A numpy view of scratchpad tensor ``t`` (no copy)."""
        if t.dtype not in vector_ops.NP_DTYPES:
            raise self._fail(st, f"{what} has unknown dtype {t.dtype!r}")
        lo, hi = t.byte_span()
        self._check_span(st, lo, hi, what)
        self._touch(st, lo, hi)
        isz = t.itemsize
        return np.ndarray(t.shape, vector_ops.NP_DTYPES[t.dtype], buffer=st.sp, offset=t.offset,
                          strides=tuple(s * isz for s in t.strides))

    def _touch(self, st: CoreState, lo: int, hi: int) -> None:
        """Note that ``st``'s current instruction accesses scratchpad bytes [lo, hi), for the race check."""
        st.uses.append((st.pc, lo, hi, -1))

    def _mask_view(self, st: CoreState, t: SpTensor) -> np.ndarray:
        isz = t.itemsize
        return np.ndarray((*t.shape, isz), np.bool_, buffer=st.written, offset=t.offset,
                          strides=(*(s * isz for s in t.strides), 1))

    def _require_written(self, st: CoreState, mask: np.ndarray, base: int, what: str) -> None:
        if mask.all():
            return
        # Find the first missing byte to say exactly where: the mask view's byte offsets.
        missing = np.argwhere(~mask)[0]
        offset = base + int(sum(int(i) * s for i, s in zip(missing, mask.strides)))
        for t in self.in_flight.get(st.id, []):
            if t.dst_offset <= offset < t.dst_offset + t.nbytes:
                # The send ran before this read yet the receive comes after it: a scratchpad race.
                raise self._fail(st, f"scratchpad race on core {st.id}: {what} reads scratchpad byte {offset} "
                                     f"({offset:#x}), which core {t.src_core}'s ring_send (instruction {t.src_index}) "
                                     "is writing (sent, not yet received here). If this reads that transfer, "
                                     "ring_recv it first; if the bytes belong to another buffer, the transfer may "
                                     "land while this instruction reads them. "
                                     f"{ring_race_fix(st.id, f'core {t.src_core}')}.")
        raise self._fail(st, f"{what} reads scratchpad byte {offset} ({offset:#x}), which nothing wrote in "
                             "this execution. Load or compute it first.")

    def _read(self, st: CoreState, t: SpTensor, what: str) -> np.ndarray:
        """The values of ``t`` for computing: fp32 for floats, int64 for integers, bool for bool."""
        view = self._view(st, t, what)
        self._require_written(st, self._mask_view(st, t), t.offset, what)
        return vector_ops.decode(view, t.dtype)

    def _write(self, st: CoreState, t: SpTensor, values: np.ndarray, what: str = "out") -> None:
        view = self._view(st, t, what)
        encoded = vector_ops.encode(values, t.dtype)
        view[...] = np.broadcast_to(encoded, view.shape)
        self._mark_written(st, self._mask_view(st, t), t.byte_span()[1])

    def _mark_written(self, st: CoreState, mask: np.ndarray, hi: int) -> None:
        mask[...] = True
        if hi > self.pads.dirty_hi[st.id]:
            self.pads.dirty_hi[st.id] = hi

    def _sp_sticks(self, st: CoreState, offset: int, pattern: DmaPattern, mask: bool = False) -> np.ndarray:
        """The scratchpad side of a DMA as a (*shape, 128) byte view (of the data or the mask)."""
        lo, hi = pattern.sp_range(offset)
        self._check_span(st, lo, hi, "the DMA's scratchpad side")
        if not mask:
            self._touch(st, lo, hi)
        buf = st.written if mask else st.sp
        return np.ndarray((*pattern.shape, STICK_BYTES), buf.dtype, buffer=buf, offset=offset,
                          strides=(*pattern.sp_strides, 1))

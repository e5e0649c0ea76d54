"""Timing-only execution: programs are generated, prepared and timed, but not executed; tensors hold no data.

    with torch_spyre.timing_only():          # or torch.spyre.timing_only(), or TORCH_SPYRE_TIMING_ONLY=1
        y = compiled(x)                      # every kernel advances the clock as in a faithful run

What still happens: allocations (memory statistics, out-of-memory errors), program generation, validation
and timing at prepare, the patch table at launch, every stream record (the profiler sees the same kernels
with the same simulated times as in a faithful run: timing is data-independent). What does not: the
functional execution of programs, and the bytes of host-to-device copies (they are charged, not stored).

Which memory holds data is tracked per allocation (``Allocation.has_data``): an allocation made, or
written by a skipped program or copy, in timing-only mode has none, and so has anything a program later
computes from it (a launch whose inputs hold no data is skipped too, and its outputs hold none). Reading
the values of such a tensor (``.cpu()``, ``.item()``, ``print``) raises :class:`NoDataError`, in or out of
the mode. Allocations are backed by host mappings that are committed only when touched
(``card/memory.py``), so the gigabytes of an 8B model's weights cost no host memory here.

The mode is process-wide (like the card it describes), not per thread: ``timing_only()`` nests, and
``timing_only(False)`` turns it off inside an outer ``timing_only()``.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import SpyreError

ENV = "TORCH_SPYRE_TIMING_ONLY"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

_lock = threading.Lock()
_overrides: list[bool] = []  # innermost last; empty: the environment variable decides


class NoDataError(SpyreError, RuntimeError):
    """A spyre tensor's values were asked for, but it has no data: it was made in timing-only mode."""

    def __init__(self, what: str = "this spyre tensor"):
        super().__init__(
            f"{what} has no data: it was made (or computed from tensors made) in timing-only mode "
            f"(torch_spyre.timing_only() or {ENV}=1), where programs are timed but not executed. "
            f"Run outside timing-only mode, with real inputs, to read values."
        )


class TimingOnlySettingError(SpyreError, ValueError):
    pass


def _from_env() -> bool:
    text = os.environ.get(ENV, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TimingOnlySettingError(f"{ENV}={os.environ[ENV]!r}: expected 1 (timing-only) or 0 (faithful execution)")


def enabled() -> bool:
    """True when programs are timed but not executed (the innermost ``timing_only()``, else the env var)."""
    if _overrides:
        return _overrides[-1]
    return _from_env()


@contextmanager
def timing_only(enable: bool = True) -> Iterator[None]:
    """Inside, programs and copies advance the simulated clock without computing or storing anything."""
    with _lock:
        _overrides.append(bool(enable))
    try:
        yield
    finally:
        with _lock:
            _overrides.pop()


def skip_launch(memory: Any, operands: Any, bases: Any, allocs: Any = None) -> bool:
    """Whether a launch skips its functional execution; if it does, its outputs are marked as holding no data.

    ``operands``: the program's operands, ``bases``: the device address bound to each (in order), on the
    card whose :class:`~torch_spyre.card.memory.DeviceMemory` is ``memory``. A launch is skipped in
    timing-only mode, and whenever an operand it reads holds no data (its results would be garbage).
    ``allocs``: the allocation each address lies in, when the caller has found them already.
    """
    if allocs is None:
        allocs = [memory.find(int(address))[0] for address in bases]
    skip = enabled() or any(not a.has_data for o, a in zip(operands, allocs) if o.access != "out")
    if skip:
        for o, a in zip(operands, allocs):
            if o.access != "in":
                a.has_data = False
    return skip


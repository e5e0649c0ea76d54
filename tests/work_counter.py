"""A deterministic measure of host work for tests: Python and builtin calls counted, never timed.

Wall time belongs in benchmarks/ (it depends on the machine and its load); a call count says the same
thing about complexity (a per-element Python loop, a quadratic step) and gives the same number every run.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


def python_calls(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """``(calls, result)``: how many Python-level and builtin calls ``fn(*args, **kwargs)`` made."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    previous = sys.getprofile()
    sys.setprofile(count)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return calls, result

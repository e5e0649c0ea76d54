"""From suites and collected tests to a plan: each test's mode, reason, tolerance and the entry that chose them.

The first entry of a source whose name regex matches a test decides it; a test no entry matches runs in the
source's ``unlisted_test_mode``. An entry's edits leave instances out (by dtype or op: skipped, the reason
names the entry) and replace tolerances. A test of a dtype outside ``supported_dtypes`` is skipped unless its
entry includes that dtype explicitly. An entry whose regex matches no collected test is reported
(:func:`stale_entries`) so entries for tests that no longer exist are found.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Iterable

from .suite import Source, Suite, TestEntry, Tolerance


@dataclass(frozen=True)
class Collected:
    """One instantiated test: its id, class, method, generic method (``base``) and its op and dtype if any."""

    id: str
    source: str
    class_name: str
    method: str
    base: str
    op: str | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Planned:
    test: Collected
    mode: str  # skip | mandatory_success | xfail
    reason: str
    atol: float | None = None
    rtol: float | None = None
    entry: str = ""  # "suite.yaml entry 3" or "unlisted"
    suite: str = ""  # the name of the suite that planned it (result records are pruned per suite and source)

    def to_json(self) -> dict:
        return {**asdict(self), "test": asdict(self.test)}


class StaleEntryWarning(UserWarning):
    """A suite entry whose name regex matches no collected test (the test was renamed or removed)."""


def _tolerance(suite: Suite, entry: TestEntry | None, dtype: str | None) -> Tolerance | None:
    overrides = entry.edits.tolerances if entry is not None else {}
    if dtype in overrides:
        return overrides[dtype]
    if "all" in overrides:
        return overrides["all"]
    return suite.supported_dtypes.get(dtype) if dtype else None


def plan_source(suite: Suite, source: Source, tests: Iterable[Collected], where: str) -> tuple[list[Planned], list[int]]:
    """The plan of ``tests`` (all collected from ``source``) and the indices of entries that matched nothing."""
    out, used = [], set()
    for t in tests:
        index, entry = next(((i, e) for i, e in enumerate(source.tests) if e.matches(t.method, t.class_name)),
                            (None, None))
        if entry is None:
            mode, reason, label = source.unlisted_test_mode, source.unlisted_reason or "", "unlisted"
        else:
            used.add(index)
            mode, reason, label = entry.mode, entry.reason or "", f"{where} entry {index + 1} ({entry.name})"
        explicit = entry is not None and entry.edits.dtypes.include is not None
        if entry is not None and not entry.edits.dtypes.keeps(t.dtype):
            mode, reason = "skip", f"dtype {t.dtype} left out by the edits of {label}"
        elif entry is not None and not entry.edits.ops.keeps(t.op):
            mode, reason = "skip", f"op {t.op} left out by the edits of {label}"
        elif t.dtype is not None and t.dtype not in suite.supported_dtypes and not explicit:
            mode, reason = "skip", f"dtype {t.dtype} is not among the suite's supported_dtypes"
        tol = _tolerance(suite, entry, t.dtype)
        out.append(Planned(t, mode, reason, tol.atol if tol else None, tol.rtol if tol else None, label, suite.name))
    stale = [i for i in range(len(source.tests)) if i not in used]
    return out, stale


def in_scope(p: Planned) -> bool:
    """Whether a planned test belongs to its suite's results: anything but an unlisted skip (another tier's)."""
    return not (p.mode == "skip" and p.entry == "unlisted")


def warn_stale(source: Source, stale: list[int], where: str) -> list[str]:
    """Warn (:class:`StaleEntryWarning`) once per entry that matched no test; returns the messages."""
    messages = [f"{where}: entry {i + 1} ({source.tests[i].name!r}) of source {source.source} matches no test; "
                "remove it or fix the regex" for i in stale]
    for m in messages:
        warnings.warn(m, StaleEntryWarning, stacklevel=2)
    return messages

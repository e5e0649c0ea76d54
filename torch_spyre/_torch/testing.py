"""The eager sweep's side of the seam: PyTorch's OpInfo database and pytree helpers.

Used by ``compiler/eager_sweep.py`` only (a development tool; importing the database needs ``expecttest``).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import unittest
from typing import Any, Callable, Iterator

# Every private torch symbol this module uses ("module:attribute.path"); tests/test_torch_seam.py
# imports each one.
PRIVATE_SYMBOLS = [
    "torch.utils._pytree:tree_map",
    "torch.utils._pytree:tree_flatten",
    "torch.testing._internal.common_methods_invocations:op_db",
    "torch.testing._internal.common_utils:extract_test_fn",
    "torch.testing._internal.opinfo.core:extract_test_fn",
]


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` (nested lists, tuples, dicts) with ``fn`` applied to every leaf."""
    return importlib.import_module("torch.utils._pytree").tree_map(fn, tree)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree``, in order."""
    return importlib.import_module("torch.utils._pytree").tree_flatten(tree)[0]


def opinfo_database() -> list[Any]:
    """PyTorch's OpInfo entries (``op_db``): each operator with sample inputs per dtype."""
    return importlib.import_module("torch.testing._internal.common_methods_invocations").op_db


def _test_fn_from_frames() -> Callable | None:
    """What torch's ``extract_test_fn`` answers (the running unittest test function, or None), found by
    walking the frames directly instead of through ``inspect.stack()``, which reads every frame's source
    file: torch calls it for every OpInfo sample, and outside a unittest run it cost the sweep over a third
    of its time for an answer that is always None."""
    frame = sys._getframe(1)
    while frame is not None:
        self_val = frame.f_locals.get("self")
        if isinstance(self_val, unittest.TestCase):
            *_, cls_name, test_name = self_val.id().rsplit(".", 2)
            if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                return getattr(self_val, test_name).__func__
        frame = frame.f_back
    return None


@contextlib.contextmanager
def cheap_sample_tracking() -> Iterator[None]:
    """While active, OpInfo sample generation finds the running test without ``inspect.stack()`` (same
    answer, see :func:`_test_fn_from_frames`); torch's functions are restored on exit."""
    modules = [importlib.import_module(m) for m in ("torch.testing._internal.common_utils",
                                                    "torch.testing._internal.opinfo.core")]
    originals = [m.extract_test_fn for m in modules]
    for m in modules:
        m.extract_test_fn = _test_fn_from_frames
    try:
        yield
    finally:
        for m, fn in zip(modules, originals):
            m.extract_test_fn = fn

"""The eager sweep's side of the seam: PyTorch's OpInfo database and pytree helpers.

Used by ``compiler/eager_sweep.py`` only (a development tool; importing the database needs ``expecttest``).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

# Every private torch symbol this module uses ("module:attribute.path"); tests/test_torch_seam.py
# imports each one.
PRIVATE_SYMBOLS = [
    "torch.utils._pytree:tree_map",
    "torch.utils._pytree:tree_flatten",
    "torch.testing._internal.common_methods_invocations:op_db",
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

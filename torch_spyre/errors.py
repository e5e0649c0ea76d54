"""One root for every error torch-spyre raises: ``except torch_spyre.SpyreError`` catches them all.

Each error also derives from the builtin (or torch) exception that PyTorch users already catch for that
kind of failure: a bad value is a ``ValueError``, a bad dtype a ``TypeError``, an op the compiler cannot
lower a ``NotImplementedError``, a full card a ``MemoryError`` / ``torch.OutOfMemoryError``. This module is
the bottom of the import order (it imports nothing of the package), so every layer can use it.
"""

from __future__ import annotations


class SpyreError(Exception):
    """Base class of every error raised by torch-spyre (the message says what was wrong and what to do)."""

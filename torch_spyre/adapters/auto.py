"""Adapt a transformers model automatically when it moves to spyre.

``install()`` (called when torch_spyre registers) wraps ``transformers.PreTrainedModel.to`` so that a
model whose parameters end up on spyre is adapted (``adapters.auto_adapt``; a model that opted out with
``adapt(model, adapters=[])`` is left alone). It must not import transformers (registration is cheap): if
``transformers.modeling_utils`` is not imported yet, a meta-path finder wraps the method right after that
module is first executed, and then takes itself off ``sys.meta_path``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

_MODULE = "transformers.modeling_utils"


def _on_spyre(model: Any) -> bool:
    params = getattr(model, "parameters", None)
    first = next(params(), None) if params else None
    return first is not None and first.device.type == "spyre"


def _patch(module: Any) -> None:
    cls = getattr(module, "PreTrainedModel", None)
    if cls is None or getattr(cls.to, "_spyre_adapts", False):
        return
    original = cls.to

    def to(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if _on_spyre(out):
            from . import auto_adapt

            auto_adapt(out)
        return out

    to._spyre_adapts = True
    to.__wrapped__ = original
    to.__doc__ = original.__doc__
    cls.to = to


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the module
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Adapt transformers models moved to spyre from now on (idempotent, imports nothing)."""
    module = sys.modules.get(_MODULE)
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())

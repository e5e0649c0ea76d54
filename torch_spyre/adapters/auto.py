"""Adapt transformers models automatically when they reach spyre.

A model reaches spyre in one of three ways, and each one is covered:

- ``model.to("spyre")``, and a container's ``.to("spyre")`` (``SentenceTransformer(path, device="spyre")``
  moves its ``nn.Sequential``; the transformers model inside never sees its own ``.to``): ``install()`` wraps
  ``torch.nn.Module.to``, and a module that ends up on spyre has every outermost transformers model inside it
  adapted;
- ``from_pretrained(..., device_map="spyre")``, which loads the weights straight onto the device with no
  ``.to``: ``PreTrainedModel.from_pretrained`` is wrapped too.

A model that opted out with ``adapt(model, adapters=[])`` is left alone (``adapters.auto_adapt``).
Registration must stay cheap and must not import transformers: if ``transformers.modeling_utils`` is not
imported yet, a meta-path finder wraps ``from_pretrained`` right after that module is first executed, and
then takes itself off ``sys.meta_path``; the ``.to`` wrapper finds ``PreTrainedModel`` in ``sys.modules``.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Any

import torch

_MODULE = "transformers.modeling_utils"


def _on_spyre(model: Any) -> bool:
    params = getattr(model, "parameters", None)
    first = next(params(), None) if params else None
    return first is not None and first.device.type == "spyre"


def _adapt_inside(module: torch.nn.Module) -> None:
    """Adapt the outermost transformers models in ``module`` (itself included) whose weights are on spyre."""
    transformers_module = sys.modules.get(_MODULE)
    cls = getattr(transformers_module, "PreTrainedModel", None)
    if cls is None:
        return  # transformers not imported: no transformers model can be in there
    from . import auto_adapt

    stack = [module]
    while stack:
        m = stack.pop()
        if isinstance(m, cls):
            if _on_spyre(m):
                auto_adapt(m)  # an adapter rewrites the whole model, inner PreTrainedModels included
        else:
            stack.extend(m.children())


def _after_to(module: torch.nn.Module) -> None:
    if _on_spyre(module):
        _adapt_inside(module)


def _patch_from_pretrained(module: Any) -> None:
    cls = getattr(module, "PreTrainedModel", None)
    if cls is None or getattr(cls.from_pretrained, "_spyre_adapts", False):
        return
    original = cls.from_pretrained.__func__

    @functools.wraps(original)
    def from_pretrained(klass, *args, **kwargs):
        out = original(klass, *args, **kwargs)
        model = out[0] if isinstance(out, tuple) else out  # output_loading_info=True returns (model, info)
        if isinstance(model, torch.nn.Module) and _on_spyre(model):
            _adapt_inside(model)
        return out

    from_pretrained._spyre_adapts = True
    cls.from_pretrained = classmethod(from_pretrained)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch_from_pretrained(module)


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
    """Adapt transformers models that reach spyre from now on (idempotent, imports nothing)."""
    from .._torch.device import call_after_module_to

    call_after_module_to(_after_to)
    module = sys.modules.get(_MODULE)
    if module is not None:
        _patch_from_pretrained(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())

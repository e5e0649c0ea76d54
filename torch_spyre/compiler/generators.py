"""The program generators, by ``KernelSpec.generator``: the one table that says which module builds which kernels.

``""`` (pointwise and reduction kernels) is ``codegen.pointwise.generate``. Whole-op generators (matmul,
attention, gather) are modules defining ``GENERATOR`` (the name) and ``generate(kspec, places, config)``;
:func:`register_builtin_generators` imports each one named in :data:`BUILTIN_GENERATORS` and raises if one
fails to import (a build without a generator must say so, not skip it). Other generators can be added
with :func:`register_generator`: ``fn(spec, places, config) -> Program``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from ..errors import SpyreError
from .kernel_spec import KernelSpec

# The modules of the built-in generators (pointwise: kernels with generator ""; the others by GENERATOR).
POINTWISE_GENERATOR = "torch_spyre.compiler.codegen.pointwise"
BUILTIN_GENERATORS = (
    "torch_spyre.compiler.codegen.matmul",
    "torch_spyre.compiler.codegen.matmul.group",
    "torch_spyre.compiler.codegen.attention",
    "torch_spyre.compiler.codegen.gather",
    "torch_spyre.compiler.codegen.mlp",
)

GENERATORS: dict[str, Callable[..., Any]] = {}


class GeneratorImportError(SpyreError, ImportError):
    """A built-in program generator that could not be imported (the build is broken: the message says which)."""


def register_generator(name: str, fn: Callable[..., Any]) -> None:
    GENERATORS[name] = fn


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise GeneratorImportError(f"the program generator module {module} failed to import ({e}); the Spyre "
                                   "compiler cannot build its kernels without it") from e


def register_builtin_generators() -> None:
    """Register every module of :data:`BUILTIN_GENERATORS` under its ``GENERATOR`` name (its ``generate``). Raises
    :class:`GeneratorImportError` if one fails to import, ``TypeError`` if one lacks ``GENERATOR``/``generate``."""
    for module in BUILTIN_GENERATORS:
        mod = _import(module)
        name = getattr(mod, "GENERATOR", None)
        if name and hasattr(mod, "generate"):
            GENERATORS.setdefault(name, mod.generate)
        else:
            raise TypeError(f"the program generator module {module} defines no GENERATOR name and generate() function")


def generator_for(spec: KernelSpec) -> Callable[..., Any]:
    """The function that builds ``spec``'s program: ``fn(spec, places, config) -> Program``."""
    if not spec.generator:
        return _import(POINTWISE_GENERATOR).generate
    if spec.generator not in GENERATORS:
        raise RuntimeError(f"kernel {spec.name} needs the {spec.generator!r} program generator, which is not "
                           f"registered (known: {', '.join(GENERATORS) or 'none'})")
    return GENERATORS[spec.generator]

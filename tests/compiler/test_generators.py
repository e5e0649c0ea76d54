"""generators.py: the one table of program generators; a generator that fails to import fails loudly."""

from __future__ import annotations

import pytest

from torch_spyre.compiler import generators


def test_builtin_generators_are_registered():
    generators.register_builtin_generators()
    assert {"matmul", "attention", "gather", "mlp"} <= set(generators.GENERATORS)


def test_a_generator_that_fails_to_import_raises(monkeypatch):
    monkeypatch.setattr(generators, "BUILTIN_GENERATORS", (*generators.BUILTIN_GENERATORS,
                                                           "torch_spyre.compiler.codegen_no_such_generator"))
    with pytest.raises(generators.GeneratorImportError, match="codegen_no_such_generator failed to import"):
        generators.register_builtin_generators()


def test_a_generator_module_without_generate_raises(monkeypatch):
    monkeypatch.setattr(generators, "BUILTIN_GENERATORS", ("torch_spyre.compiler.decisions",))
    with pytest.raises(TypeError, match="defines no GENERATOR"):
        generators.register_builtin_generators()

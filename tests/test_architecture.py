"""Imports point one way: every module of torch_spyre may import only its own layer and the layers below.

The layers, bottom first (docs/architecture.md, "The layer rule"):

    errors < util < program < card < runtime < _torch < device < compiler < jobs/models/serving/adapters < cli

- ``torch_spyre/_torch/`` is the seam to torch's private APIs: it sits just below the device (the device
  and the compiler use it) and imports nothing of torch_spyre but ``errors``.
- ``torch_spyre/profiler.py`` is the public name of ``runtime/profiler.py``: runtime layer.
- ``torch_spyre/spyre_module.py`` is the ``torch.spyre`` device module: device layer.
- ``torch_spyre/__init__.py`` (the package itself, which registers the device and installs the compiler's
  hooks) is above every layer; no module imports it (a submodule's import has already run it).

Every import counts: module-level and function-local, absolute and relative, ``import a.b`` and
``from a import b``. A failure names the file, the line, the import and the rule it breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "torch_spyre"
ROOT = "torch_spyre"

LAYERS = ["errors", "util", "program", "card", "runtime", "_torch", "device", "compiler", "jobs", "cli", "package"]
RANK = {name: i for i, name in enumerate(LAYERS)}
# Packages and top-level modules -> layer.
LAYER_OF = {
    "errors": "errors", "util": "util", "program": "program", "card": "card", "runtime": "runtime",
    "profiler": "runtime", "_torch": "_torch", "device": "device", "spyre_module": "device", "compiler": "compiler",
    "jobs": "jobs", "models": "jobs", "serving": "jobs", "adapters": "jobs", "testing": "jobs", "coverage": "jobs", "cli": "cli",
}
# Layers with a narrower rule than "anything below": the seam uses nothing of torch_spyre but errors.
ONLY = {"_torch": {"errors", "_torch"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts == [ROOT]:
        return "package"
    layer = LAYER_OF.get(parts[1])
    if layer is None:
        raise AssertionError(f"{module}: no layer assigned (add it to LAYER_OF in tests/test_architecture.py "
                             "and to docs/architecture.md)")
    return layer


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path: Path) -> list[tuple[int, str, str]]:
    """(line, imported torch_spyre module, the import as written) for every import in the file."""
    module = module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    out.append((node.lineno, alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node)
            if not (target == ROOT or target.startswith(ROOT + ".")):
                continue
            written = f"from {'.' * node.level}{node.module or ''} import {', '.join(a.name for a in node.names)}"
            for alias in node.names:  # ``from . import kernels``: the submodule kernels, if it is one
                sub = f"{target}.{alias.name}"
                out.append((node.lineno, sub if _is_module(sub) else target, written))
    return out


def upward_imports() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        own = layer_of(module)
        for line, target, written in imported_modules(path):
            other = layer_of(target)
            where = f"{path.relative_to(PACKAGE.parent)}:{line}: {written}"
            if own in ONLY and other not in ONLY[own]:
                allowed = " and ".join(sorted(ONLY[own] - {own}))
                problems.append(f"{where}  -- {own} may import nothing of torch_spyre but {allowed} "
                                f"(it imports {other})")
            elif RANK[other] > RANK[own]:
                problems.append(f"{where}  -- {own} may not import {other}")
    return problems


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def test_imports_point_down_only():
    problems = upward_imports()
    assert not problems, ("imports must point down (docs/architecture.md, 'The layer rule'; layers, bottom first: "
                          f"{' < '.join(LAYERS[:-1])}; the package root above all):\n" + "\n".join(problems))


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    # The walk covers imports inside functions and relative ones: the case that let a cycle go unnoticed.
    source = "def f():\n    from ..compiler import eager\n    import torch_spyre.cli\n"
    tree = ast.parse(source)
    found = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert len(found) == 2
    node = found[0]
    assert _resolve("torch_spyre.device.fallback", False, node) == "torch_spyre.compiler"
    assert layer_of("torch_spyre.compiler") == "compiler" and RANK["compiler"] > RANK["device"]

"""The seam to torch's private APIs (``torch_spyre/_torch/``): every private symbol it uses still exists, and
no other module of torch_spyre uses one.

On a torch release that moves, renames or removes a symbol the seam uses, ``test_every_private_symbol_exists``
fails first, with one line per symbol (all of them, not only the first): that list is the upgrade's work.
"""

from __future__ import annotations

import ast
import importlib

import pytest
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "torch_spyre"
SEAM = PACKAGE / "_torch"
SEAM_MODULES = ("torch_spyre._torch.device", "torch_spyre._torch.inductor", "torch_spyre._torch.testing")
MAX_SEAM_MODULES = 3


def _resolve(symbol: str) -> str | None:
    """None if ``"module:attr.path"`` imports and resolves, else what is wrong with it."""
    module_name, _, path = symbol.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        return f"module {module_name} does not import ({type(e).__name__}: {e})"
    done = module_name
    for attr in filter(None, path.split(".")):
        try:
            obj = getattr(obj, attr)
        except Exception as e:  # noqa: BLE001
            return f"{done} has no attribute {attr!r} ({type(e).__name__})"
        done = f"{done}.{attr}"
    return None


def test_the_seam_has_at_most_three_modules():
    modules = sorted(p.stem for p in SEAM.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= MAX_SEAM_MODULES, modules
    assert sorted(m.rsplit(".", 1)[1] for m in SEAM_MODULES) == modules


def test_every_private_symbol_exists():
    import importlib.util

    import torch

    # torch.testing._internal needs expecttest (a test dependency): without it, those symbols are not checked.
    has_expecttest = importlib.util.find_spec("expecttest") is not None
    failures = []
    for module in SEAM_MODULES:
        symbols = importlib.import_module(module).PRIVATE_SYMBOLS
        assert symbols, f"{module} lists no PRIVATE_SYMBOLS"
        for symbol in symbols:
            if symbol.startswith("torch.testing._internal") and not has_expecttest:
                continue
            problem = _resolve(symbol)
            if problem:
                failures.append(f"{module}: {symbol}: {problem}")
    assert not failures, (f"torch {torch.__version__} lacks {len(failures)} private symbol(s) the seam uses "
                          "(torch_spyre/_torch/; fix the seam, nothing else):\n" + "\n".join(failures))


def test_the_check_names_a_missing_symbol():
    assert _resolve("torch._C:DispatchKey") is None
    assert "no attribute 'NoSuchKey'" in _resolve("torch._C:DispatchKey.NoSuchKey")
    assert "does not import" in _resolve("torch._no_such_module:x")


# --- no private torch API outside the seam ------------------------------------------------------------
def _is_private_module(name: str) -> bool:
    """``torch._x`` (any private submodule of torch), ``torch.utils._x``, ``torch.testing._internal``."""
    parts = name.split(".")
    if parts[0] != "torch" or len(parts) < 2:
        return False
    return any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def private_uses(path: Path) -> list[str]:
    """``file:line: what`` for every use of a private torch API in the file's code (strings and comments
    do not count; annotations do)."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PACKAGE.parent) if PACKAGE.parent in path.parents else path.name
    annotation_strings = _annotation_strings(tree)
    out = []
    for node in ast.walk(tree):
        found = None
        if isinstance(node, ast.Import):
            found = next((a.name for a in node.names if _is_private_module(a.name)), None)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_private_module(node.module):
                found = node.module
            elif node.module.split(".")[0] == "torch":
                private = [a.name for a in node.names if a.name.startswith("_")]
                found = f"{node.module}.{private[0]}" if private else None
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name and _is_private_module(name) and not _is_private_module(name.rsplit(".", 1)[0]):
                found = name  # the outermost private step only (torch._C, not torch._C.DispatchKey too)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node in annotation_strings:
            found = next((w for w in node.value.replace("[", " ").replace("]", " ").split()
                          if _is_private_module(w.strip(",|"))), None)
        if found:
            out.append(f"{where}:{node.lineno}: {found}")
    return out


def _annotation_strings(tree: ast.AST) -> set:
    """The string constants inside the tree's annotations. Computed per tree, never cached by id(tree): a
    collected tree's id is reused by the next one, which then saw the old tree's nodes (a flaky failure)."""
    nodes = set()
    for node in ast.walk(tree):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            anns = [a.annotation for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs,
                                           node.args.vararg, node.args.kwarg] if a is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            anns = [node.annotation]
        for a in anns:
            if a is not None:
                nodes |= {n for n in ast.walk(a) if isinstance(n, ast.Constant)}
    return nodes


BENCHMARKS = PACKAGE.parent / "benchmarks"


def test_no_private_torch_api_outside_the_seam():
    """In the package and in the benchmark scripts (they are what users copy)."""
    problems = []
    for path in sorted([*PACKAGE.rglob("*.py"), *BENCHMARKS.rglob("*.py")]):
        if SEAM in path.parents:
            continue
        problems += private_uses(path)
    assert not problems, ("private torch APIs outside torch_spyre/_torch/ (add what you need to the seam, with a "
                          "name saying what it does for us, and list its symbols in PRIVATE_SYMBOLS):\n"
                          + "\n".join(problems))


def test_the_scan_finds_each_kind_of_use(tmp_path):
    source = (
        "import torch._dynamo\n"
        "from torch._inductor import ir\n"
        "from torch.utils.backend_registration import _setup_privateuseone_for_python_backend\n"
        "from torch.utils import _pytree\n"
        "def f(op: 'torch._ops.OpOverload') -> None:\n"
        "    x = torch._C.DispatchKey.CPU\n"
        "    s = 'torch._inductor in a string is fine'  # and torch._C in a comment\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = private_uses(path)
    lines = sorted(int(f.split(":")[1]) for f in found)
    assert lines == [1, 2, 3, 4, 5, 6], found


def test_cheap_sample_tracking_answers_as_torch_does_and_restores_it():
    """The eager sweep's faster stand-in for torch's extract_test_fn gives torch's answer (inside a
    unittest test and outside one), and torch's function is back afterwards."""
    import unittest

    pytest.importorskip("expecttest")
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    from torch_spyre._torch import testing

    original = common_utils.extract_test_fn

    class Case(unittest.TestCase):
        def test_probe(self):
            self.answers = (common_utils.extract_test_fn(), core.extract_test_fn())

    with testing.cheap_sample_tracking():
        assert common_utils.extract_test_fn is testing._test_fn_from_frames is core.extract_test_fn
        assert common_utils.extract_test_fn() is None is original()
        case = Case("test_probe")
        case.test_probe()
    assert case.answers == (Case.test_probe, Case.test_probe)
    case.test_probe()  # torch's own, restored
    assert case.answers == (Case.test_probe, Case.test_probe)
    assert common_utils.extract_test_fn is original and core.extract_test_fn is original

"""PyTorch's test machinery behind the seam: the OpInfo and ModuleInfo databases, device-generic test
instantiation for the PrivateUse1 device, op schemas, and pytree helpers.

Used by ``compiler/eager_sweep.py`` and ``testing/`` (development tools; importing the databases needs
``expecttest``).
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
    "torch.testing._internal.common_utils:TestCase",
    "torch.testing._internal.common_device_type:ops",
    "torch.testing._internal.common_device_type:dtypes",
    "torch.testing._internal.common_device_type:instantiate_device_type_tests",
    "torch.testing._internal.common_modules:module_db",
    "torch.testing._internal.common_modules:modules",
    "torch._C:_jit_get_all_schemas",
]

# instantiate_device_type_tests names the PrivateUse1 device "privateuse1" in only_for (it maps the backend's
# own name to it); tests of the device are then TestXPRIVATEUSE1.test_y_spyre_<dtype>.
DEVICE_ONLY_FOR_ENV = {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "privateuse1"}


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` (nested lists, tuples, dicts) with ``fn`` applied to every leaf."""
    return importlib.import_module("torch.utils._pytree").tree_map(fn, tree)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree``, in order."""
    return importlib.import_module("torch.utils._pytree").tree_flatten(tree)[0]


def opinfo_database() -> list[Any]:
    """PyTorch's OpInfo entries (``op_db``): each operator with sample inputs per dtype."""
    return importlib.import_module("torch.testing._internal.common_methods_invocations").op_db


def module_database() -> list[Any]:
    """PyTorch's ModuleInfo entries (``module_db``): nn modules with constructor and forward inputs."""
    return importlib.import_module("torch.testing._internal.common_modules").module_db


def device_test_case() -> type:
    """The TestCase base of PyTorch's device-generic tests (``assertEqual`` with ``precision``/``rel_tol``)."""
    return importlib.import_module("torch.testing._internal.common_utils").TestCase


def ops(op_list: list[Any], **kwargs: Any) -> Callable:
    """PyTorch's ``@ops`` decorator: one test per OpInfo and dtype (``allowed_dtypes=...`` narrows them)."""
    return importlib.import_module("torch.testing._internal.common_device_type").ops(op_list, **kwargs)


def modules(module_list: list[Any], **kwargs: Any) -> Callable:
    """PyTorch's ``@modules`` decorator: one test per ModuleInfo and dtype."""
    return importlib.import_module("torch.testing._internal.common_modules").modules(module_list, **kwargs)


def dtypes(*dtype_list: Any) -> Callable:
    """PyTorch's ``@dtypes`` decorator: one test per dtype."""
    return importlib.import_module("torch.testing._internal.common_device_type").dtypes(*dtype_list)


def instantiate_for_device(generic_class: type, scope: dict) -> None:
    """Instantiate ``generic_class``'s device-generic tests for the PrivateUse1 device only (into ``scope``)."""
    # looked up at each call so that recording_generic_tests sees it
    importlib.import_module("torch.testing._internal.common_device_type").instantiate_device_type_tests(
        generic_class, scope, only_for="privateuse1")


@contextlib.contextmanager
def recording_generic_tests(into: dict[str, set[str]]) -> Iterator[None]:
    """While active, every ``instantiate_device_type_tests`` call records the generic test methods of the
    classes it creates (``into[instantiated class name] = {generic test names}``): torch removes them from the
    generic class, and they are what tells ``test_<generic>_<op>_<device>_<dtype>`` apart. Files imported in
    the block must import the function after it starts (upstream files import it at their top)."""
    module = importlib.import_module("torch.testing._internal.common_device_type")
    original = module.instantiate_device_type_tests

    def recording(generic_test_class, scope, *args, **kwargs):
        generic = {n for n in vars(generic_test_class) if n.startswith("test")}
        before = set(scope)
        result = original(generic_test_class, scope, *args, **kwargs)
        for name in set(scope) - before:
            into[name] = generic
        return result

    module.instantiate_device_type_tests = recording
    try:
        yield
    finally:
        module.instantiate_device_type_tests = original


def all_op_schemas() -> list[str]:
    """Every registered operator schema, as text (``aten::add.Tensor(Tensor self, ...) -> Tensor``)."""
    return sorted(str(s) for s in importlib.import_module("torch._C")._jit_get_all_schemas())


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

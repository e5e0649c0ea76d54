"""Which OpInfo entries and dtypes each template of the ``builtin:opinfo`` source is instantiated for.

One place for both users: ``opinfo_tests.py`` instantiates the templates from it, and the inventory
(``inventory.py``) names the same tests without importing the device (so an inventory can be written for a
torch that torch_spyre does not run on yet). tests/testing/ checks that both give the same test ids.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._torch import testing as seam

DEVICE = "spyre"
TEMPLATE_CLASS = "TestSpyreOps"  # the generic class in opinfo_tests.py (OpInfo DecorateInfos name it)
CLASS_NAME = TEMPLATE_CLASS + "PRIVATEUSE1"  # instantiate_device_type_tests names the class after PrivateUse1
DEVICE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
REFUSED_DTYPES = (torch.float64, torch.complex64, torch.uint64)

# template -> which OpInfo entries it is instantiated for
TEMPLATES: dict[str, Callable[[Any], bool]] = {
    "compare_cpu": lambda op: True,
    "noncontiguous": lambda op: True,
    "out": lambda op: bool(op.supports_out),
    "type_promotion": lambda op: type(op).__name__ == "BinaryUfuncInfo",
    "backward": lambda op: bool(op.supports_autograd),
    "compiled": lambda op: True,
}
DTYPE_TEMPLATES = {"unsupported_dtype_refused": REFUSED_DTYPES}  # per dtype, not per op


def template_ops(template: str) -> list[Any]:
    return [op for op in seam.opinfo_database() if TEMPLATES[template](op)]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def test_ids() -> dict[str, dict]:
    """Every test the source instantiates: id -> {template, op (OpInfo full name), dtype}."""
    out = {}
    for template in TEMPLATES:
        for op in template_ops(template):
            for dtype in DEVICE_DTYPES:
                if dtype in op.dtypes:  # what @ops gives the PrivateUse1 device (no dtypesIf entry for it)
                    method = f"test_{template}_{op.formatted_name}_{DEVICE}_{dtype_name(dtype)}"
                    out[f"builtin:opinfo::{CLASS_NAME}.{method}"] = {"template": template, "op": op.full_name,
                                                                     "dtype": dtype_name(dtype)}
    for template, dtypes in DTYPE_TEMPLATES.items():
        for dtype in dtypes:
            method = f"test_{template}_{DEVICE}_{dtype_name(dtype)}"
            out[f"builtin:opinfo::{CLASS_NAME}.{method}"] = {"template": template, "op": None,
                                                             "dtype": dtype_name(dtype)}
    return out

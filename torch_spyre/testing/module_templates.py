"""Which ModuleInfo entries and dtypes the ``builtin:module_info`` source is instantiated for.

One place for both users: ``module_tests.py`` instantiates its templates from it, and tests/testing/ checks
the test ids it names against the ones the worker collects.
"""

from __future__ import annotations

import copy
from typing import Any

from .._torch import testing as seam
from .opinfo_templates import DEVICE, DEVICE_DTYPES, dtype_name

TEMPLATE_CLASS = "TestSpyreModules"  # the generic class in module_tests.py
CLASS_NAME = TEMPLATE_CLASS + "PRIVATEUSE1"
TEMPLATES = ("compare_cpu", "noncontiguous", "backward")


def spyre_module_infos() -> list[Any]:
    """module_db's entries, each declaring the card's dtypes (float32, float16, bfloat16).

    module_db declares float32 and float64 for nearly every module, the dtypes upstream runs on CPU and CUDA;
    the card works in 16 bits, so the copies declare its three dtypes (float64 is refused by the card)."""
    out = []
    for info in seam.module_database():
        mine = copy.copy(info)
        mine.dtypes = DEVICE_DTYPES
        out.append(mine)
    return out


def test_ids() -> dict[str, dict]:
    """Every test the source instantiates: id -> {template, module (the part of the name between template and
    device), dtype}."""
    out = {}
    for template in TEMPLATES:
        for info in spyre_module_infos():
            modes = ["_train_mode", "_eval_mode"] if info.train_and_eval_differ else [""]
            for mode in modes:
                for dtype in DEVICE_DTYPES:
                    method = f"test_{template}_{info.formatted_name}{mode}_{DEVICE}_{dtype_name(dtype)}"
                    out[f"builtin:module_info::{CLASS_NAME}.{method}"] = {
                        "template": template, "module": info.formatted_name + mode, "dtype": dtype_name(dtype)}
    return out

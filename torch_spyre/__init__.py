"""torch-spyre: IBM's Spyre accelerator as a native PyTorch device, on a simulated card.

``import torch_spyre`` (or a bare ``import torch`` once the package is installed, through the
``torch.backends`` entry point ``torch_spyre:_autoload``) registers the ``spyre`` device and
``torch.spyre``, and plugs the compiler into the device. Public helpers are loaded on first use.

This module is above every layer (docs/architecture.md, "The layer rule"): no module of the package
imports it.
"""

from __future__ import annotations

from typing import Any

from .errors import SpyreError

__version__ = "0.1.0"

_LAZY = {
    "get_layout": ("torch_spyre.device.tensor", "get_layout"),
    "to_spyre": ("torch_spyre.device.tensor", "to_spyre"),
    "TensorLayout": ("torch_spyre.device.tensor", "TensorLayout"),
    "fallback_stats": ("torch_spyre.device.fallback", "fallback_stats"),
    "reset_fallback_stats": ("torch_spyre.device.fallback", "reset_fallback_stats"),
    "dlfloat16_emulation": ("torch_spyre.device.dtypes", "dlfloat16_emulation"),
    "set_dlfloat16_emulation": ("torch_spyre.device.dtypes", "set_dlfloat16_emulation"),
    "Stream": ("torch_spyre.spyre_module", "Stream"),
    "Event": ("torch_spyre.spyre_module", "Event"),
    "timing_only": ("torch_spyre.runtime.timing_only", "timing_only"),
    "adapt": ("torch_spyre.adapters", "adapt"),
    "NoDataError": ("torch_spyre.runtime.timing_only", "NoDataError"),
}

__all__ = ["register", "SpyreError", *_LAZY]


def register() -> None:
    """Register the ``spyre`` device with PyTorch and plug the compiler into it (idempotent, cheap).

    The compiler's hooks (``compiler/hooks.py``) make eager ops run as single-op programs and answer
    Inductor's lookup of ``torch.spyre.Scheduling``; neither imports Inductor before it is needed.
    """
    # torch first: if torch is not imported yet, its own import runs the autoload entry point, which
    # calls this function again (re-entrantly) and registers the device before we get here.
    import torch  # noqa: F401

    from .adapters import auto
    from .compiler import hooks
    from .device.registration import register as _register

    _register()
    hooks.install()
    auto.install()  # transformers models are adapted when they move to spyre (torch_spyre/adapters/)


def _autoload() -> None:
    """Entry point for torch's backend autoload (``[project.entry-points."torch.backends"]``)."""
    register()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'torch_spyre' has no attribute {name!r}")


register()

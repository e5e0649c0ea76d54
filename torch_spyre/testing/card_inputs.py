"""How the device-generic templates place sample inputs on spyre and compute CPU references.

Shared by the OpInfo templates (``opinfo_tests.py``) and the ModuleInfo templates (``module_tests.py``); a
module of its own because importing either template module instantiates its tests, and the class name
``instantiate_device_type_tests`` gives depends on what was instantiated before in the process.
"""

from __future__ import annotations

import torch

from .._torch import testing as seam
from ..card import dlfloat16
from ..device.dtypes import dlfloat16_emulation
from .opinfo_templates import DEVICE_DTYPES

DEFAULT_TOLERANCES = {torch.float32: (1e-3, 1e-3), torch.float16: (2e-2, 2e-2), torch.bfloat16: (5e-2, 5e-2)}
REFUSED = "cannot hold"  # the device's UnsupportedDtypeError for dtypes it cannot hold (device/dtypes.py)


def to_device(tree, device):
    return seam.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


def as_stored(tree, device):
    """The CPU tensors of ``tree`` with the values the card holds for them (a round trip through it)."""
    return seam.tree_map(lambda t: t.to(device).cpu() if isinstance(t, torch.Tensor) and t.dtype in DEVICE_DTYPES
                         else t, tree)


def _beyond_dlfloat16(t: torch.Tensor) -> torch.Tensor:
    """Where a finite value overflows DLFloat16 (rounds above its largest finite, 8.573e9; only bf16 has such
    values): the card stores its NaN/Inf code there, as it stores an infinity."""
    bits = dlfloat16.from_float32(t.detach().float().numpy()).astype("int32")
    codes = torch.from_numpy(bits).reshape(t.shape)  # a 0-dim array comes back 1-dim
    return ((codes & 0x7FFF) == dlfloat16.SPECIAL) & t.isfinite()


def as_card_result(expected, actual):
    """The CPU reference as the card can return it: a 16-bit infinity, or a bf16 value beyond DLFloat16's
    range, where the card returned NaN is NaN.

    DLFloat16 has one code for NaN and infinity, which reads back as NaN (docs/numerics.md): an infinite
    result is NaN on the card, and so is a finite bf16 result above DLFloat16's largest finite (its overflow
    gives the same code; e.g. polygamma near a pole, 5.6e12 on the CPU). A result beyond fp16's range that
    DLFloat16 holds finite reads back as inf, as on the CPU, so the same infinity is accepted too.
    ``actual`` is the card's result on the CPU; NaN equals NaN in the comparison, and a NaN where the CPU
    gives a value DLFloat16 holds finite still fails."""
    got, want = seam.tree_leaves(actual), seam.tree_leaves(expected)
    if not dlfloat16_emulation() or len(got) != len(want):
        return expected
    returned = iter(got)

    def held(e):
        a = next(returned)
        if (isinstance(e, torch.Tensor) and e.dtype in (torch.float16, torch.bfloat16)
                and isinstance(a, torch.Tensor) and a.shape == e.shape and a.is_floating_point()):
            return e.masked_fill((e.isinf() | _beyond_dlfloat16(e)) & a.isnan(), float("nan"))
        return e

    return seam.tree_map(held, expected)


def noncontiguous_on(tree, device):
    """Each tensor as a strided (every other element) view on ``device`` with the same values."""
    def view(t):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return to_device(t, device)
        buf = torch.zeros(*t.shape, 2, dtype=t.dtype, device=device)
        out = buf[..., 1]
        out.copy_(t.to(device))
        return out

    return seam.tree_map(view, tree)


def refused(e: BaseException | None) -> bool:
    """Whether ``e`` is the card refusing a dtype it cannot hold (eager: the device's UnsupportedDtypeError, a RuntimeError), or the
    compiler refusing to compute in one (its UnsupportedDtypeError, which a compile raises wrapped in
    Dynamo's and Inductor's errors: the chain of causes is searched)."""
    from ..compiler.kernel_spec import UnsupportedDtypeError
    from ..device.dtypes import UnsupportedDtypeError as DeviceUnsupportedDtypeError

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (UnsupportedDtypeError, DeviceUnsupportedDtypeError)):
            return True
        e = e.__cause__ or e.__context__ or getattr(e, "inner_exception", None)
    return False

"""Batch norm and layer norm statistics on spyre as the CPU returns them.

``native_batch_norm``, ``_native_batch_norm_legit`` and ``native_layer_norm`` also return the statistics
they normalized with (``save_mean``, ``save_invstd`` / ``rstd``). torch's decompositions and meta kernels
give every device but the CPU CUDA's conventions: the statistics in fp32 for 16-bit inputs, and the
running statistics (shape ``(C,)``) in eval mode. The CPU returns them in the input's dtype, and tensors of
no elements in eval mode, which is what the card is compared with (issue 12). The ops run as before
(``fallback.run``: a program, or the host); these kernels then give the statistics the CPU's dtype and
shape. Autograd's backward formulas read them as the CPU's do: the training statistics (cast back to
fp32 by the backward), the running statistics in eval mode.
"""

from __future__ import annotations

import torch

from .._torch.device import OpOverload
from .op_call import bound_args, op_info

_libs: list[torch.library.Library] = []  # kept alive: a Library's registrations end with it

# op overload name -> whether it has a ``training`` argument
OPS = {
    "native_batch_norm": True,
    "_native_batch_norm_legit": True,
    "_native_batch_norm_legit.no_stats": True,
    "native_layer_norm": False,
}


def _kernel(op: OpOverload, has_training: bool):
    info = op_info(op)

    def kernel(*args, **kwargs):
        from . import fallback

        out, mean, rstd = fallback.run(op, *args, **kwargs)
        x = args[0] if args else kwargs["input"]
        if has_training and not bound_args(info, args, kwargs)[info.arg_names.index("training")]:
            return out, x.new_empty((0,)), x.new_empty((0,))
        return out, mean.to(x.dtype), rstd.to(x.dtype)

    kernel.__name__ = f"spyre_{info.name.replace('.', '_')}"
    return kernel


def register() -> list[torch.library.Library]:
    """Install the kernels for spyre tensors (idempotent)."""
    if _libs:
        return _libs
    aten = torch.library.Library("aten", "IMPL")
    for name, has_training in OPS.items():
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        aten.impl(name, _kernel(op, has_training), "PrivateUse1")
    _libs.append(aten)
    return _libs

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

# op overload name -> whether it has a ``training`` argument
OPS = {
    "native_batch_norm": True,
    "_native_batch_norm_legit": True,
    "_native_batch_norm_legit.no_stats": True,
    "native_layer_norm": False,
}


_PARAMS = ("weight", "bias", "running_mean", "running_var")


def _statistics_dtype(x: torch.Tensor, params: list) -> torch.dtype:
    """The CPU kernels' ``param_scalar_type``: fp32 for a 16-bit input whose parameters (weight, bias,
    running statistics: those given) are all fp32 -- mixed precision, e.g. autocast -- else the input's."""
    given = [p for p in params if isinstance(p, torch.Tensor)]
    mixed = x.dtype in (torch.float16, torch.bfloat16) and bool(given) and all(p.dtype == torch.float32
                                                                                for p in given)
    return torch.float32 if mixed else x.dtype


def _kernel(op: OpOverload, has_training: bool):
    info = op_info(op)

    def kernel(*args, **kwargs):
        from . import fallback

        out, mean, rstd = fallback.run(op, *args, **kwargs)
        bound = dict(zip(info.arg_names, bound_args(info, args, kwargs)))
        x = bound["input"]
        dtype = _statistics_dtype(x, [bound.get(n) for n in _PARAMS])
        if has_training and not bound["training"]:
            return out, x.new_empty((0,), dtype=dtype), x.new_empty((0,), dtype=dtype)
        return out, mean.to(dtype), rstd.to(dtype)

    kernel.__name__ = f"spyre_{info.name.replace('.', '_')}"
    return kernel


def kernels() -> list[tuple[str, object, str]]:
    """(aten op, kernel, dispatch key) for each op, for the device's registration (registration.py)."""
    out = []
    for name, has_training in OPS.items():
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        out.append((name, _kernel(op, has_training), "PrivateUse1"))
    return out

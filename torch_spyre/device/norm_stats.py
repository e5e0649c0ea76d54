"""Batch norm and layer norm statistics on spyre as the CPU returns them.

``native_batch_norm``, ``_native_batch_norm_legit``, ``native_layer_norm`` and torch.export's batch norms
(``_batch_norm_with_update``, its functional variant, ``_batch_norm_no_update``) also return the statistics
they normalized with (``save_mean``, ``save_invstd`` / ``rstd``). torch's decompositions and meta kernels
give every device but the CPU CUDA's conventions: the statistics in fp32 for 16-bit inputs, and the
running statistics (shape ``(C,)``) in eval mode. The CPU returns them in the input's dtype, and tensors of
no elements in eval mode, which is what the card is compared with (issue 12). The ops run as before
(``fallback.run``: a program, or the host); these kernels then give the statistics the CPU's dtype and
shape. Autograd's backward formulas read them as the CPU's do: the training statistics (cast back to
fp32 by the backward), the running statistics in eval mode. The running statistics a training op
updates keep their version counters, as on the CPU.

Compiled graphs never reach these kernels: tracing runs torch's decompositions (fake kernels, then
Inductor's table), so :func:`patch_decompositions` wraps those to return the same dtypes and shapes for
spyre inputs (the fake and the real outputs agree), also when autograd records the op: the backward
reads the 16-bit statistics as the CPU's does. The casts this adds after the statistics stay in a graph
that does not read them until dead code is eliminated; the LayerNorm matmul epilogue sees through them
(``compiler/epilogue_norm.py``).
"""

from __future__ import annotations

import torch

from .._torch.device import OpOverload, unversioned_writes, wrap_decompositions
from .op_call import bound_args, op_info

# op overload name -> training mode: the ``training`` argument's value ("arg"), always (True: the statistics
# are the batch's) or never (False: the CPU returns tensors of no elements for them)
OPS = {
    "native_batch_norm": "arg",
    "_native_batch_norm_legit": "arg",
    "_native_batch_norm_legit.no_stats": "arg",
    "native_layer_norm": True,
    # torch.export's batch norms (their 4th output, ``reserve``, is a uint8 tensor of no elements on the
    # CPU); _batch_norm_no_update's composite kernel calls the CPU's batch_norm_cpu and refuses device tensors
    "_batch_norm_with_update": True,
    "_batch_norm_no_update": False,
}


_PARAMS = ("weight", "bias", "running_mean", "running_var")


def _statistics_dtype(x: torch.Tensor, params: list) -> torch.dtype:
    """The CPU kernels' ``param_scalar_type``: fp32 for a 16-bit input whose parameters (weight, bias,
    running statistics: those given) are all fp32 -- mixed precision, e.g. autocast -- else the input's."""
    given = [p for p in params if isinstance(p, torch.Tensor)]
    mixed = x.dtype in (torch.float16, torch.bfloat16) and bool(given) and all(p.dtype == torch.float32
                                                                                for p in given)
    return torch.float32 if mixed else x.dtype


def _training(mode, bound: dict) -> bool:
    return bool(bound["training"]) if mode == "arg" else mode


def _kernel(op: OpOverload, mode):
    info = op_info(op)

    def kernel(*args, **kwargs):
        from . import fallback

        bound = dict(zip(info.arg_names, bound_args(info, args, kwargs)))
        # The CPU's kernels update the running statistics without bumping their version counters, and
        # autograd saves them for the backward before the op runs: the program that writes them back
        # must not bump them either ("modified by an inplace operation" in the backward otherwise).
        running = tuple(t for t in (bound.get("running_mean"), bound.get("running_var")) if isinstance(t, torch.Tensor))
        with unversioned_writes(running):
            out, mean, rstd, *rest = fallback.run(op, *args, **kwargs)
        x = bound["input"]
        dtype = _statistics_dtype(x, [bound.get(n) for n in _PARAMS])
        if not _training(mode, bound):
            return out, x.new_empty((0,), dtype=dtype), x.new_empty((0,), dtype=dtype), *rest
        return out, mean.to(dtype), rstd.to(dtype), *rest

    kernel.__name__ = f"spyre_{info.name.replace('.', '_')}"
    return kernel


# The ops compiled graphs trace (torch.compile, export), whose decompositions give the statistics for
# devices other than the CPU in fp32 and, in eval mode, the running statistics. Their first three
# outputs are (out, mean, rstd); the functional batch norms add ``reserve`` and/or the new running statistics.
_TRACED = {**OPS, "_native_batch_norm_legit_functional": "arg", "_native_batch_norm_legit_no_training": False,
           "_batch_norm_with_update_functional": True}


def _traced(op: OpOverload, decomposition):
    """``decomposition`` with the statistics of spyre inputs as the CPU's kernels return them."""
    info = op_info(op)
    mode = _TRACED[info.name]

    def traced(*args, **kwargs):
        result = decomposition(*args, **kwargs)
        bound = dict(zip(info.arg_names, bound_args(info, args, kwargs)))
        x = bound["input"]
        if result is NotImplemented or not isinstance(x, torch.Tensor) or x.device.type != "spyre":
            return result
        out, mean, rstd, *rest = result
        dtype = _statistics_dtype(x, [bound.get(n) for n in _PARAMS])
        if not _training(mode, bound):
            return (out, x.new_empty((0,), dtype=dtype), x.new_empty((0,), dtype=dtype), *rest)
        return (out, mean.to(dtype), rstd.to(dtype), *rest)

    return traced


def patch_decompositions() -> None:
    """Compiled graphs get the statistics eager spyre ops return (a patch of torch's global state:
    docs/architecture.md); other devices' inputs keep torch's decompositions unchanged."""
    ops = []
    for name in _TRACED:
        packet, _, overload = name.partition(".")
        ops.append(getattr(getattr(torch.ops.aten, packet), overload or "default"))
    wrap_decompositions(ops, _traced)


def kernels() -> list[tuple[str, object, str]]:
    """(aten op, kernel, dispatch key) for each op, for the device's registration (registration.py)."""
    out = []
    for name, mode in OPS.items():
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        out.append((name, _kernel(op, mode), "PrivateUse1"))
    return out

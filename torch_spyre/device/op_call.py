"""One ATen op call on spyre tensors: what its schema says, its arguments in schema order, and the fixes a
boxed call from C++ needs.

Used by the device's fallback (``fallback.py``) and by whoever runs an op for it, e.g. the compiler's eager
programs (``compiler/eager.py``), which receive the :class:`OpInfo` the fallback computed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .._torch.device import OpOverload, op_schema


def is_spyre(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "spyre"


def tensors_in(x: Any) -> Iterator[torch.Tensor]:
    """The tensors in an argument value (ATen arguments nest at most lists/tuples of tensors)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors_in(y)


def flat_tensors(values: Any) -> list[torch.Tensor]:
    """The tensors in a sequence of argument values, in order."""
    out = []
    for v in values:  # (tensors and numbers without the generator: every op call asks, several times)
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(tensors_in(v))
    return out


def map_tensors(fn: Callable[[torch.Tensor], Any], x: Any) -> Any:
    """``x`` with ``fn`` applied to each tensor in it (lists/tuples without tensors are kept as they are)."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)) and any(isinstance(y, (torch.Tensor, list, tuple)) for y in x):
        return type(x)(map_tensors(fn, y) for y in x)
    return x


@dataclass(frozen=True)
class OpInfo:
    """What running an op needs from its schema, computed once per op (:func:`op_info`)."""

    name: str  # e.g. "add.out"
    arg_names: tuple[str, ...]
    defaults: tuple[Any, ...]
    is_out: tuple[bool, ...]
    is_write: tuple[bool, ...]
    returns: tuple[tuple[int | None, bool], ...]  # per return: (aliased argument index, written)
    generator: tuple[int, bool] | None  # (argument index, kwarg-only) of a Generator? argument
    is_view: bool
    tensor_args: tuple[bool, ...]  # arguments of type Tensor (that may arrive as unwrapped Python numbers)
    returns_only_tensors: bool = False  # every return is a Tensor or Tensor[] (and there is one)


_infos: dict[OpOverload, OpInfo] = {}

# Arguments the CPU kernels write though their schemas do not say so: ``native_batch_norm`` updates the
# running statistics in training mode (``_native_batch_norm_legit``, its successor, declares them). Treated
# as written (the host fallback writes them back); the write keeps their version counters, as on the CPU
# (``norm_stats.py``).
_UNDECLARED_WRITES = {"aten::native_batch_norm": ("running_mean", "running_var")}


def op_info(op: OpOverload) -> OpInfo:
    info = _infos.get(op)
    if info is not None:
        return info
    schema = op_schema(op)
    arguments = schema.arguments
    returns = []
    for r in schema.returns:
        ai = r.alias_info
        found = None
        if ai is not None:
            for i, a in enumerate(arguments):
                if a.alias_info is not None and a.alias_info.before_set & ai.before_set:
                    found = i
                    break
        returns.append((found, bool(ai is not None and ai.is_write)))
    generator = None
    for i, a in enumerate(arguments):
        if a.name == "generator" and "Generator" in str(a.type):
            generator = (i, a.kwarg_only)
    info = OpInfo(
        name=op.name().removeprefix("aten::"),
        arg_names=tuple(a.name for a in arguments),
        defaults=tuple(a.default_value if a.has_default_value() else None for a in arguments),
        is_out=tuple(bool(a.is_out) for a in arguments),
        is_write=tuple(bool(a.alias_info is not None and a.alias_info.is_write)
                       or a.name in _UNDECLARED_WRITES.get(op.name(), ()) for a in arguments),
        returns=tuple(returns),
        generator=generator,
        is_view=bool(returns) and all(i is not None and not w for i, w in returns),
        tensor_args=tuple(str(a.type) == "Tensor" for a in arguments),
        returns_only_tensors=(all(str(r.type) in ("Tensor", "Tensor[]") for r in schema.returns)
                              and bool(schema.returns)),
    )
    _infos[op] = info
    return info


def bound_args(info: OpInfo, args: tuple, kwargs: dict) -> list[Any]:
    """Argument values in schema order (positional, then keyword, then defaults)."""
    n = len(args)
    return [args[i] if i < n else kwargs.get(name, info.defaults[i]) for i, name in enumerate(info.arg_names)]


def _tensor_slots(info: OpInfo, args: tuple, kwargs: dict) -> Iterator[tuple[int | str, Any]]:
    """(position, or name for a keyword, value) of each argument given that the schema types as Tensor."""
    n = len(args)
    for i, name in enumerate(info.arg_names):
        if info.tensor_args[i]:
            if i < n:
                yield i, args[i]
            elif name in kwargs:
                yield name, kwargs[name]


def rewrap_numbers(info: OpInfo, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Python numbers in Tensor arguments back to 0-d tensors.

    C++ passes scalars as "wrapped number" tensors (``x % 4`` runs ``remainder.Tensor`` with a wrapped 4),
    and the boxed call into Python unwraps them to plain numbers, which the op then refuses. The 0-d
    tensor takes the dtype the scalar would promote to against the op's first tensor, so type promotion is
    unchanged. Most calls have no such number: their arguments come back as they came.
    """
    numbers = {at: v for at, v in _tensor_slots(info, args, kwargs) if isinstance(v, (bool, int, float))}
    if not numbers:
        return args, kwargs
    first = next((t for v in (*args, *kwargs.values()) for t in tensors_in(v)), None)
    wrapped = {at: torch.tensor(v, dtype=torch.result_type(first, v) if first is not None else None)
               for at, v in numbers.items()}
    args = tuple(wrapped.get(i, v) for i, v in enumerate(args))
    kwargs = {**kwargs, **{at: t for at, t in wrapped.items() if isinstance(at, str)}}
    return args, kwargs


def written_args(info: OpInfo, bound: list[Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors the op writes (in-place ``self``, ``out=``), each with its argument's name (``out``,
    ``out[1]`` in a list), in schema order."""
    written = []
    for name, value, w in zip(info.arg_names, bound, info.is_write):
        if not w:
            continue
        if isinstance(value, torch.Tensor):
            written.append((name, value))
        elif isinstance(value, (list, tuple)):
            written.extend((f"{name}[{i}]", t) for i, t in enumerate(value) if isinstance(t, torch.Tensor))
    return written


def write_only_outs(info: OpInfo, bound: list[Any]) -> list[torch.Tensor]:
    """The spyre ``out=`` tensors the op only writes: those whose storage no input shares
    (``x.add_(y)`` runs ``add.out(x, y, out=x)``, whose out is also read)."""
    if not any(info.is_out):
        return []
    inputs = {t.untyped_storage().data_ptr()
              for v, out in zip(bound, info.is_out) if not out for t in tensors_in(v) if is_spyre(t)}
    return [t for v, out in zip(bound, info.is_out) if out
            for t in tensors_in(v) if is_spyre(t) and t.untyped_storage().data_ptr() not in inputs]


def resize_written(info: OpInfo, name: str, dev: torch.Tensor, shape: Any) -> bool:
    """Resize a written argument to the shape the op gives it, as the CPU's ``resize_output`` does:
    silently when it holds no elements; otherwise with torch's deprecation warning (its text first, so
    filters on it still match), naming the op, the argument and the device. True if it was resized."""
    shape = tuple(shape)
    if tuple(dev.shape) == shape:
        return False
    if dev.numel():
        warnings.warn(
            f"An output with one or more elements was resized since it had shape {list(dev.shape)}, which does "
            f"not match the required output shape {list(shape)}. This behavior is deprecated, and in a future "
            "PyTorch release outputs will not be resized unless they have zero elements. You can explicitly "
            "reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0). "
            f"(aten::{info.name}, argument {name!r}, a {dev.device} tensor)",
            UserWarning, stacklevel=3,
        )
    dev.resize_(shape)
    return True

"""Eager ops that run on the host over device memory, each timed on the card by a roofline estimate.

Every ATen op without a spyre kernel reaches :func:`run` (a catch-all PrivateUse1 fallback):

1. check the arguments: all device tensors on one card, CPU tensors only as 0-d scalars (as CUDA allows);
2. view ops (a return that aliases an argument without writing it) are pure metadata: the op runs on
   meta tensors of the same geometry and the result is a view of the same device storage;
3. other ops: inputs are read through their layouts into CPU tensors of their host dtype (``out=``
   arguments are not read: they get empty host temporaries), the CPU kernel runs, mutated arguments (schema ``alias_info.is_write``: in-place ``self``, ``out=``) are written back
   through their views, and fresh results are stored on the card in its default layout;
4. the op takes simulated time on the current stream's ``compute`` resource:

       t = kernel_fixed_cost_s + max(flops / peak_fp16_flops, bytes / (dram_peak_bandwidth * dram_mixed_efficiency))

   ``bytes`` are the device bytes (whole sticks) of every tensor read or written, ``flops`` come from
   ``torch.utils.flop_counter`` for matmul/convolution/attention ops and are the output element count
   otherwise.

The compiler issue replaces step 3 by single-op programs; the interface is :func:`run` and
:func:`fallback_stats`.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..runtime import stream as rt
from . import cards, storage, tensor

_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()


class FallbackStats(dict):
    """Op name -> number of calls that ran on the host. ``reset()`` clears the counters."""

    def reset(self) -> None:
        reset_fallback_stats()
        self.clear()


def fallback_stats() -> FallbackStats:
    with _counts_lock:
        return FallbackStats(sorted(_counts.items(), key=lambda kv: (-kv[1], kv[0])))


def reset_fallback_stats() -> None:
    with _counts_lock:
        _counts.clear()


def _is_spyre(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "spyre"


def _check_devices(op: torch._ops.OpOverload, flat: list[Any]) -> int:
    card = None
    for x in flat:
        if not isinstance(x, torch.Tensor):
            continue
        if x.device.type == "spyre":
            idx = x.device.index or 0
            if card is None:
                card = idx
            elif idx != card:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"spyre:{card} and spyre:{idx}! (in {op.name()}; move one with .to('spyre:{card}'))"
                )
    for x in flat:
        if isinstance(x, torch.Tensor) and x.device.type != "spyre" and not (x.device.type == "cpu" and x.dim() == 0):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"spyre:{card} and {x.device}! (in {op.name()}; move the {x.device} tensor with .to('spyre') "
                f"or the spyre one with .cpu())"
            )
    return 0 if card is None else card


def _aliases(schema_returns, schema_args) -> list[tuple[int | None, bool]]:
    """For each return: (index of the argument it aliases, whether that argument is written)."""
    out = []
    for r in schema_returns:
        ai = r.alias_info
        found = None
        if ai is not None:
            for i, a in enumerate(schema_args):
                if a.alias_info is not None and a.alias_info.before_set & ai.before_set:
                    found = i
                    break
        out.append((found, bool(ai is not None and ai.is_write)))
    return out


def _bound_args(op, args, kwargs) -> list[Any]:
    """Argument values in schema order (positional, then keyword, then defaults)."""
    values = []
    for i, a in enumerate(op._schema.arguments):
        if i < len(args):
            values.append(args[i])
        elif a.name in kwargs:
            values.append(kwargs[a.name])
        else:
            values.append(a.default_value if a.has_default_value() else None)
    return values


def _flops(op, args, kwargs, out) -> float:
    from torch.utils.flop_counter import flop_registry

    fn = flop_registry.get(op.overloadpacket)
    if fn is not None:
        try:
            return float(fn(*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001 - fall back to the element count on any shape surprise
            pass
    outs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
    return float(sum(x.numel() for x in outs))


def roofline_seconds(flops: float, nbytes: int) -> float:
    cfg = cards.config()
    bw = cfg.dram_peak_bandwidth * cfg.dram_mixed_efficiency
    return cfg.kernel_fixed_cost_s + max(flops / cfg.peak_fp16_flops, nbytes / bw)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    base = torch.empty_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _run_view(op, args, kwargs, aliases):
    meta_args, meta_kwargs = tree_map(lambda x: _meta_like(x) if _is_spyre(x) else x, (args, kwargs))
    result = op(*meta_args, **meta_kwargs)
    bound = _bound_args(op, args, kwargs)
    returns = result if isinstance(result, (tuple, list)) else (result,)
    outs = []
    for r, (arg_index, _) in zip(returns, aliases):
        base = bound[arg_index] if arg_index is not None else None
        if isinstance(base, (list, tuple)):
            base = base[0]
        if isinstance(r, (list, tuple)):
            outs.append(type(r)(storage.view_of(base, v.dtype, v.shape, v.stride(), v.storage_offset()) for v in r))
        else:
            outs.append(storage.view_of(base, r.dtype, r.shape, r.stride(), r.storage_offset()))
    return outs[0] if not isinstance(result, (tuple, list)) else type(result)(outs)


def _inject_generator(op, args, kwargs, card):
    """Random ops without an explicit generator draw from the card's generator."""
    for i, a in enumerate(op._schema.arguments):
        if a.name == "generator" and "Generator" in str(a.type):
            if a.kwarg_only or i >= len(args):
                if kwargs.get("generator") is None:
                    kwargs = {**kwargs, "generator": cards.generator(card)}
            elif args[i] is None:
                args = (*args[:i], cards.generator(card), *args[i + 1:])
    return args, kwargs


def run(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    flat, _ = tree_flatten((args, kwargs))
    card = _check_devices(op, flat)
    schema = op._schema
    aliases = _aliases(schema.returns, schema.arguments)
    if aliases and all(i is not None and not w for i, w in aliases):
        return _run_view(op, args, kwargs, aliases)

    with _counts_lock:
        _counts[op.name().removeprefix("aten::")] += 1

    # Host copies of every device tensor argument (the same host tensor for the same device tensor).
    hosts: dict[int, torch.Tensor] = {}
    nbytes = 0

    def to_host(x):
        nonlocal nbytes
        if not _is_spyre(x):
            return x
        if id(x) not in hosts:
            values, moved = tensor.read(x)
            hosts[id(x)] = values
            nbytes += moved.device_bytes
        return hosts[id(x)]

    # out= arguments are only written: a host temporary of the same geometry, without reading the device.
    # (Unless an input shares its storage, as in ``x.add_(y)`` which runs ``add.out(x, y, out=x)``.)
    bound = _bound_args(op, args, kwargs)
    input_storages = {
        t.untyped_storage().data_ptr()
        for a, v in zip(schema.arguments, bound) if not a.is_out
        for t in tree_flatten(v)[0] if _is_spyre(t)
    }
    for a, v in zip(schema.arguments, bound):
        if a.is_out:
            for t in tree_flatten(v)[0]:
                if _is_spyre(t) and t.untyped_storage().data_ptr() not in input_storages:
                    hosts[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    host_args, host_kwargs = tree_map(to_host, (args, kwargs))
    host_args, host_kwargs = _inject_generator(op, host_args, host_kwargs, card)
    host_out = op(*host_args, **host_kwargs)

    # Write mutated arguments back through their views.
    host_bound = _bound_args(op, host_args, host_kwargs)
    for a, dev, host in zip(schema.arguments, bound, host_bound):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        pairs = zip(dev, host) if isinstance(dev, (list, tuple)) else [(dev, host)]
        for d, h in pairs:
            if not _is_spyre(d):
                continue
            if tuple(d.shape) != tuple(h.shape):
                d.resize_(h.shape)
            nbytes += tensor.write(d, h).device_bytes

    # Results: aliases of arguments are the device arguments themselves; the rest are stored on the card.
    returns = host_out if isinstance(host_out, tuple) else (host_out,)
    device_returns = []
    for r, (arg_index, _) in zip(returns, aliases + [(None, False)] * (len(returns) - len(aliases))):
        if arg_index is not None:
            device_returns.append(bound[arg_index])
            continue

        def upload(x):
            nonlocal nbytes
            if not isinstance(x, torch.Tensor):
                return x
            out = tensor.empty_strided(x.shape, x.stride(), x.dtype, card)
            nbytes += tensor.write(out, x).device_bytes
            return out

        device_returns.append(tree_map(upload, r))
    result = tuple(device_returns) if isinstance(host_out, tuple) else device_returns[0]

    flops = _flops(op, host_args, host_kwargs, host_out)
    rt.current_stream(card).enqueue(
        op.name(), roofline_seconds(flops, nbytes), kind="fallback", resource="compute",
        details={"flops": flops, "bytes": nbytes},
    )
    return result

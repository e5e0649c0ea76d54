"""Eager ops that run on the host over device memory, each timed on the card by a roofline estimate.

Every ATen op without a spyre kernel reaches :func:`run` (a catch-all PrivateUse1 fallback):

1. check the arguments: all device tensors on one card, CPU tensors only as 0-d scalars (as CUDA allows);
2. view ops (a return that aliases an argument without writing it) are pure metadata: the op runs on
   meta tensors of the same geometry and the result is a view of the same device storage;
3. other ops: inputs are read through their layouts into CPU tensors of their host dtype (fp32 for
   DLFloat16 data: 16-bit ops compute in fp32, as the card does; see ``_wide_results``) (``out=``
   arguments are not read: they get host temporaries of no elements, which the CPU kernel resizes), the CPU kernel runs, mutated arguments (schema ``alias_info.is_write``: in-place ``self``, ``out=``) are written back
   through their views, and fresh results are stored on the card in its default layout;
4. the op takes simulated time on the current stream's ``compute`` resource:

       t = kernel_fixed_cost_s + max(flops / peak_fp16_flops, bytes / (dram_peak_bandwidth * dram_mixed_efficiency))

   ``bytes`` are the device bytes (whole sticks) of every tensor read or written, ``flops`` come from
   ``torch.utils.flop_counter`` for matmul/convolution/attention ops and are the output element count
   otherwise.

Inputs that hold no data (made in timing-only mode, ``runtime/timing_only.py``) are not read: the op
runs on meta tensors for its result shapes, its results are allocated without data, and it is charged the
same roofline time; an op that needs the values (``.item()``, data-dependent shapes) raises ``NoDataError``.

Step 3 is first offered to the program runner, if one is set (``program_runner.py``; the compiler sets
one when torch_spyre registers, ``compiler/eager.py``, which declines every op with
``TORCH_SPYRE_EAGER=host``, docs/compiler.md "Eager mode"): an op it can lower runs as a cached single-op
program, timed by the card, and is counted in ``fallback_stats().compiled``; the rest run as above,
warn once per op and are counted in ``fallback_stats().host`` (and as the dict's items).

An op that a compiled graph runs this way because the compiler could not lower it (its kernel runs the
eager op, ``compiler/fallback.py``) is announced by :func:`expect_compile_fallback`: it is counted in
``fallback_stats().compile_fallbacks`` and the work it queues is tagged ``compile_fallback`` for the
profiler.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch

from .._torch.device import OpOverload
from ..runtime import stream as rt
from ..runtime.timing_only import NoDataError
from . import cards, dtypes, storage, tensor
from .op_call import (OpInfo, bound_args, flat_tensors, is_spyre, map_tensors, op_info, resize_written, rewrap_numbers,
                      tensors_in, write_only_outs, written_args)
from .program_runner import program_runner

_counts: Counter[str] = Counter()  # ops computed on the host
_compiled: Counter[str] = Counter()  # ops that ran as single-op programs (the program runner)
_compile_fallbacks: Counter[str] = Counter()  # ops compiled graphs ran eagerly (no lowering for the card)
_counts_lock = threading.Lock()
_expected = threading.local()  # the compile fallback this thread is about to run


def _sorted(counter: Counter[str]) -> dict[str, int]:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


class FallbackStats(dict):
    """Op name -> number of calls that ran on the host (also ``.host``); ``.compiled``: op name ->
    calls that ran as single-op programs; ``.compile_fallbacks``: op name -> calls a compiled graph made
    to the eager op because the compiler could not lower it (each also counted in ``.host`` or
    ``.compiled``, by where it ran). ``reset()`` clears the counters."""

    def __init__(self, host: dict[str, int], compiled: dict[str, int], compile_fallbacks: dict[str, int]):
        super().__init__(host)
        self.host = dict(host)
        self.compiled = dict(compiled)
        self.compile_fallbacks = dict(compile_fallbacks)

    def reset(self) -> None:
        reset_fallback_stats()
        self.clear()
        self.host.clear()
        self.compiled.clear()
        self.compile_fallbacks.clear()


def fallback_stats() -> FallbackStats:
    with _counts_lock:
        return FallbackStats(_sorted(_counts), _sorted(_compiled), _sorted(_compile_fallbacks))


def reset_fallback_stats() -> None:
    with _counts_lock:
        _counts.clear()
        _compiled.clear()
        _compile_fallbacks.clear()


def expect_compile_fallback(name: str) -> None:
    """A compiled graph is about to call op ``name`` eagerly (no lowering for the card): count it, and
    tag the work of the next op this thread runs on the device (``compile_fallback=name``)."""
    with _counts_lock:
        _compile_fallbacks[name] += 1
        call = sum(_compile_fallbacks.values())
    _expected.tag = {"compile_fallback": name, "compile_fallback_call": call}


def _check_devices(info: OpInfo, args: tuple, kwargs: dict) -> int:
    card = None
    others = []
    for x in flat_tensors((*args, *kwargs.values())):
        device = x.device
        if device.type == "spyre":
            idx = device.index or 0
            if card is None:
                card = idx
            elif idx != card:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"spyre:{card} and spyre:{idx}! (in aten::{info.name}; move one with .to('spyre:{card}'))"
                )
        elif not (device.type == "cpu" and x.dim() == 0):
            others.append(x)
    if others:
        x = others[0]
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"spyre:{card} and {x.device}! (in aten::{info.name}; move the {x.device} tensor with .to('spyre') "
            f"or the spyre one with .cpu())"
        )
    return 0 if card is None else card


def _flops(op, args, kwargs, out) -> float:
    from torch.utils.flop_counter import flop_registry

    fn = flop_registry.get(op.overloadpacket)
    if fn is not None:
        try:
            return float(fn(*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001 - fall back to the element count on any shape surprise
            pass
    return float(sum(x.numel() for x in tensors_in(out if isinstance(out, (list, tuple)) else [out])))


def roofline_seconds(flops: float, nbytes: int) -> float:
    cfg = cards.config()
    bw = cfg.dram_peak_bandwidth * cfg.dram_mixed_efficiency
    return cfg.kernel_fixed_cost_s + max(flops / cfg.peak_fp16_flops, nbytes / bw)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    base = torch.empty_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _run_view(op, info: OpInfo, args, kwargs):
    to_meta = lambda x: _meta_like(x) if is_spyre(x) else x  # noqa: E731
    result = op(*[map_tensors(to_meta, a) for a in args], **{k: map_tensors(to_meta, v) for k, v in kwargs.items()})
    bound = bound_args(info, args, kwargs)
    returns = result if isinstance(result, (tuple, list)) else (result,)
    outs = []
    for r, (arg_index, _) in zip(returns, info.returns):
        base = bound[arg_index]
        if isinstance(base, (list, tuple)):
            base = base[0]
        if isinstance(r, (list, tuple)):
            outs.append(type(r)(storage.view_of(base, v.dtype, v.shape, v.stride(), v.storage_offset()) for v in r))
        else:
            outs.append(storage.view_of(base, r.dtype, r.shape, r.stride(), r.storage_offset()))
    return outs[0] if not isinstance(result, (tuple, list)) else type(result)(outs)


def _inject_generator(info: OpInfo, args: tuple, kwargs: dict, card: int) -> tuple[tuple, dict]:
    """Random ops without an explicit generator draw from the card's generator."""
    if info.generator is None:
        return args, kwargs
    i, kwarg_only = info.generator
    if kwarg_only or i >= len(args):
        if kwargs.get("generator") is None:
            kwargs = {**kwargs, "generator": cards.generator(card)}
    elif args[i] is None:
        args = (*args[:i], cards.generator(card), *args[i + 1:])
    return args, kwargs


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return torch.ops.aten.convolution.default, (input, weight, bias, stride, padding, dilation, transposed,
                                                output_padding, groups)


def _convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    bias_sizes = [grad_output.shape[1]] if output_mask[2] else None
    return torch.ops.aten.convolution_backward.default, (grad_output, input, weight, bias_sizes, stride, padding,
                                                         dilation, transposed, output_padding, groups, output_mask)


# Ops that torch routes to a backend-specific entry point on PrivateUse1 (the CPU has no kernel for it):
# on the host they run (and are costed) as the generic op they stand for.
_HOST_EQUIVALENT = {
    "convolution_overrideable": _convolution,
    "convolution_backward_overrideable": _convolution_backward,
}


# Ops whose CPU kernels refuse operands of different dtypes while their meta kernels (and so traced
# programs) accept them: the device checks as the CPU does, whichever way the op then runs.
_SAME_DTYPE_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot"})


def _check_same_dtype(info: OpInfo, args: tuple, kwargs: dict) -> None:
    if info.name.split(".")[0] not in _SAME_DTYPE_OPS:
        return
    named = [(name, v) for name, v, out in zip(info.arg_names, bound_args(info, args, kwargs), info.is_out)
             if isinstance(v, torch.Tensor) and not out]
    dtypes_seen = {v.dtype for _, v in named}
    if len(dtypes_seen) > 1:
        listed = ", ".join(f"{name}: {str(v.dtype).replace('torch.', '')}" for name, v in named)
        raise RuntimeError(f"aten::{info.name} expects operands of one dtype, got {listed}; convert one, "
                           "e.g. b.to(a.dtype) (as on the CPU, which refuses mixed dtypes here too)")


def run(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    tag = getattr(_expected, "tag", None)
    if tag is not None and tag["compile_fallback"].rsplit(".", 1)[0] == str(op.overloadpacket):
        _expected.tag = None
        with rt.tagged(**tag):
            return _run(op, *args, **kwargs)
    return _run(op, *args, **kwargs)


def _run(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    info = op_info(op)
    card = _check_devices(info, args, kwargs)
    _check_same_dtype(info, args, kwargs)
    if info.is_view:
        return _run_view(op, info, args, kwargs)
    runner = program_runner()
    if runner is not None:  # the op as a program (compiler/eager.py, unless TORCH_SPYRE_EAGER=host)
        ran = runner.run(op, info, args, kwargs, card)
        if ran is not None:
            if ran.as_program:
                with _counts_lock:
                    _compiled[info.name] += 1
            return ran.result
    # While a runner compiles, fake tensors run ops that have no meta kernel on real zeros of the device
    # to learn output shapes: probes of the compiler, neither counted nor timed.
    return _run_on_host(op, info, args, kwargs, card, probe=runner is not None and runner.probing())


_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def _holds_dlfloat16(x: Any) -> bool:
    if not (is_spyre(x) and x.dtype in _SIXTEEN_BIT):
        return False
    alloc = storage.allocation_of(x)
    return alloc is not None and alloc.meta["encoding"] == dtypes.DLFLOAT16


def _wide_results(op, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """The op's results on meta tensors when it should compute in fp32 on the host, else None.

    The card keeps fp16/bf16 as DLFloat16 only in memory and computes in fp32; so does the host path.
    Computing in the 16-bit dtype would also break values DLFloat16 holds beyond fp16's range:
    ``finfo(float16).min`` is -65536 on the card, inf once read as fp16, and the NaN/Inf code once
    stored back. The meta run gives the result dtypes. Only ops whose floating spyre arguments are all
    DLFloat16 of one dtype compute wide: with mixed dtypes the CPU's own checks must see them (meta
    kernels accept ``mm(fp16, fp32)``, which the CPU refuses). Random ops keep their dtype, so they
    draw the same numbers as on the CPU; so do ops told their dtype (``cumprod(x, 0, dtype=float16,
    out=...)`` checks its out against that dtype)."""
    if info.generator is not None:
        return None
    if "dtype" in info.arg_names and bound_args(info, args, kwargs)[info.arg_names.index("dtype")] is not None:
        return None
    floats = [t for v in (*args, *kwargs.values()) for t in tensors_in(v) if is_spyre(t) and t.is_floating_point()]
    if not floats or len({t.dtype for t in floats}) != 1 or not all(_holds_dlfloat16(t) for t in floats):
        return None
    to_meta = lambda x: _meta_like(x) if is_spyre(x) else x  # noqa: E731
    try:
        return op(*[map_tensors(to_meta, a) for a in args], **{k: map_tensors(to_meta, v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - no meta kernel or a dtype error: compute as the CPU would
        return None


def _inputs_without_data(info: OpInfo, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The spyre tensors the op reads that hold no data (made in timing-only mode)."""
    bound = bound_args(info, args, kwargs)
    return [t for v, out in zip(bound, info.is_out) if not out
            for t in tensors_in(v) if is_spyre(t) and not tensor.has_data(t)]


def _run_without_data(op, info: OpInfo, args: tuple, kwargs: dict, card: int, missing: torch.Tensor) -> Any:
    """The op over inputs that hold no data (timing-only mode): shapes from its meta kernel, results
    allocated on the card without data, and the same roofline time as the host path charges (the same
    device bytes, FLOPs from the same formula). An op whose result is not a tensor (``.item()``) or has
    no meta kernel needs the values: :class:`NoDataError`."""
    def refuse() -> NoDataError:
        return NoDataError(f"the spyre tensor ({list(missing.shape)}, {str(missing.dtype).replace('torch.', '')}) "
                           f"given to aten::{info.name}")

    # Write-only outs are meta tensors of no elements, which the op resizes without a warning (as on the
    # host path): the device out is resized below, warning if it held elements.
    write_only = {id(t) for t in write_only_outs(info, bound_args(info, args, kwargs))}

    def to_meta(x):
        if not is_spyre(x):
            return x
        return torch.empty(0, dtype=x.dtype, device="meta") if id(x) in write_only else _meta_like(x)

    meta_args = tuple(map_tensors(to_meta, a) for a in args)
    meta_kwargs = {k: map_tensors(to_meta, v) for k, v in kwargs.items()}
    try:
        meta_out = op(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel, or a shape that depends on the values
        raise refuse() from None
    returns = meta_out if isinstance(meta_out, tuple) else (meta_out,)
    if not all(isinstance(r, torch.Tensor) or (isinstance(r, (list, tuple)) and all(isinstance(x, torch.Tensor)
               for x in r)) for r in returns):
        raise refuse()
    bound = bound_args(info, args, kwargs)
    nbytes = sum(tensor.transfer_size(t).device_bytes for v, out in zip(bound, info.is_out) if not out
                 for t in tensors_in(v) if is_spyre(t))
    meta_bound = bound_args(info, meta_args, meta_kwargs)
    for (name, d), (_, m) in zip(written_args(info, bound), written_args(info, meta_bound)):
        if is_spyre(d):
            resize_written(info, name, d, m.shape)
            tensor.mark_no_data(d)
            nbytes += tensor.transfer_size(d).device_bytes

    def fresh(m: torch.Tensor) -> torch.Tensor:
        nonlocal nbytes
        out = tensor.empty_strided(m.shape, m.stride(), m.dtype, card)
        tensor.mark_no_data(out)
        nbytes += tensor.transfer_size(out).device_bytes
        return out

    aliases = info.returns + ((None, False),) * (len(returns) - len(info.returns))
    results = [bound[i] if i is not None else (type(r)(fresh(x) for x in r) if isinstance(r, (list, tuple))
                                                else fresh(r))
               for r, (i, _) in zip(returns, aliases)]
    result = tuple(results) if isinstance(meta_out, tuple) else results[0]
    flops = _flops(op, meta_args, meta_kwargs, meta_out)
    rt.current_stream(card).enqueue(
        f"aten::{info.name}", roofline_seconds(flops, nbytes), kind="fallback", resource="compute",
        details={"flops": flops, "bytes": nbytes, "timing_only": True},
    )
    return result


def _run_on_host(op, info: OpInfo, args: tuple, kwargs: dict, card: int, probe: bool = False) -> Any:
    if not probe:
        with _counts_lock:
            _counts[info.name] += 1
        missing = _inputs_without_data(info, args, kwargs)
        if missing:
            return _run_without_data(op, info, args, kwargs, card, missing[0])
    wide = _wide_results(op, info, args, kwargs)
    wide_dtype = (lambda x: torch.float32 if wide is not None and _holds_dlfloat16(x) else None)  # noqa: E731

    # Host copies of every device tensor argument (the same host tensor for the same device tensor).
    hosts: dict[int, torch.Tensor] = {}
    nbytes = 0

    # out= arguments are only written: a host temporary with no elements, without reading the device
    # (unless an input shares its storage, as in ``x.add_(y)`` which runs ``add.out(x, y, out=x)``). The
    # CPU kernel resizes it to the result's shape without warning; the result is written back through
    # the device out's view, which is resized first if its shape differs (``op_call.resize_written``).
    # A temporary of the device out's shape would make the CPU kernel warn "An output with one or more
    # elements was resized" whenever a composite op hands the fallback an out= of a placeholder shape
    # (F.mse_loss reaches ``mse_loss.out`` with a 0-d out that the CPU kernel first fills at full size).
    bound = bound_args(info, args, kwargs)
    for t in write_only_outs(info, bound):
        hosts[id(t)] = torch.empty(0, dtype=wide_dtype(t) or t.dtype)

    def to_host(x):
        nonlocal nbytes
        if x.device.type != "spyre":
            return x
        h = hosts.get(id(x))
        if h is None:
            h, moved = tensor.read(x, as_dtype=wide_dtype(x), require_data=not probe)
            hosts[id(x)] = h
            nbytes += moved.device_bytes
        return h

    host_args = tuple(map_tensors(to_host, a) for a in args)
    host_kwargs = {k: map_tensors(to_host, v) for k, v in kwargs.items()}
    host_args, host_kwargs = _inject_generator(info, host_args, host_kwargs, card)
    host_args, host_kwargs = rewrap_numbers(info, host_args, host_kwargs)
    host_op = op
    if info.name in _HOST_EQUIVALENT:
        host_op, host_args = _HOST_EQUIVALENT[info.name](*host_args, **host_kwargs)
        host_kwargs = {}
    host_out = host_op(*host_args, **host_kwargs)

    returns = host_out if isinstance(host_out, tuple) else (host_out,)
    # Refused before anything is stored (written arguments and results alike), so the card stays as it was.
    # (Not in a compiler's probe: it runs under fake tensors, which log a TypeError as an internal error; the
    # probe's failure declines the program.)
    for r in tensors_in(list(returns)) if not probe else ():
        dtypes.check_layout(r.layout, f"the result of aten::{info.name}")

    # Write mutated arguments back through their views.
    if any(info.is_write):
        host_bound = bound_args(info, host_args, host_kwargs)  # (no _HOST_EQUIVALENT op writes its arguments)
        for (name, d), (_, h) in zip(written_args(info, bound), written_args(info, host_bound)):
            if not is_spyre(d):
                continue
            resize_written(info, name, d, h.shape)  # torch's warning if it held elements, naming the op
            nbytes += tensor.write(d, h, computed_in_fp32=wide is not None).device_bytes

    # Results: aliases of arguments are the device arguments themselves; the rest are stored on the card
    # (in the op's own result dtype when it computed in fp32: see _wide_results).
    def upload(x, meta):
        nonlocal nbytes
        dtype = meta.dtype if isinstance(meta, torch.Tensor) else x.dtype
        out = tensor.empty_strided(x.shape, x.stride(), dtype, card)
        nbytes += tensor.write(out, x, computed_in_fp32=wide is not None).device_bytes
        return out

    def upload_all(x, meta):
        if isinstance(x, torch.Tensor):
            return upload(x, meta)
        if isinstance(x, (list, tuple)):
            metas = meta if isinstance(meta, (list, tuple)) and len(meta) == len(x) else [None] * len(x)
            return type(x)(upload_all(y, m) for y, m in zip(x, metas))
        return x

    metas = wide if isinstance(wide, tuple) else (wide,)
    metas = metas if len(metas) == len(returns) else (None,) * len(returns)
    aliases = info.returns + ((None, False),) * (len(returns) - len(info.returns))
    device_returns = [bound[i] if i is not None else upload_all(r, m)
                      for r, m, (i, _) in zip(returns, metas, aliases)]
    result = tuple(device_returns) if isinstance(host_out, tuple) else device_returns[0]

    if probe:
        return result
    flops = _flops(host_op, host_args, host_kwargs, host_out)
    rt.current_stream(card).enqueue(
        f"aten::{info.name}", roofline_seconds(flops, nbytes), kind="fallback", resource="compute",
        details={"flops": flops, "bytes": nbytes},
    )
    return result

"""Eager mode through the compiler: each ATen op on spyre tensors runs as a cached single-op program.

The device's catch-all fallback (``device/fallback.py``) offers every op that has no spyre kernel to its
program runner, which the compiler installs when torch_spyre registers (``hooks.py``) and which calls
:func:`run`. For an op that can become a program, the first call with a given *signature* (the op
overload; each tensor argument's shape, strides, storage offset, dtype and stick layout; which
arguments share a storage; the non-tensor arguments; the card and its configuration) traces the one op
into an FX graph (``make_fx`` on fake tensors) and compiles it with Inductor's ``compile_fx`` for spyre
(static shapes, one graph). The result is kept in a bounded LRU cache (:func:`cache_stats`); later
calls with the same signature only launch the cached programs (the wrapper calls ``SpyreKernel.run``).

Python numbers in Tensor arguments and 0-d CPU tensors are constants of the graph (their values are in
the signature). Results go where the host fallback puts them: fresh results are new device tensors,
in-place and ``out=`` arguments are written in place (Inductor keeps a graph input's mutation inside
the graph; a written storage's view is one graph input however many arguments pass it; an ``out=`` of
another shape is resized first, as on the CPU), and returns that alias an
argument are that argument (``x.add_(1) is x``).

An op stays on the host (:func:`static_host_reason`, :func:`call_host_reason` say why) when it is, by
design, not a computation a program should do: random ops, factories (no spyre tensor input), ops
returning non-tensors (``_local_scalar_dense``, ``equal``), inputs of no elements, a written argument
that overlaps another argument other than as the same view. It also stays there when the compiler
cannot lower it (the error is kept as the reason) or its compiled graph still computes something on
the host. The fallback then computes it on the host, warns once per op and counts it.
``TORCH_SPYRE_EAGER=compile`` is the default; ``TORCH_SPYRE_EAGER=host`` (docs/compiler.md "Eager
mode") sends every op to the host without warnings.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .._torch import device as torch_device
from .._torch import inductor as torch_inductor
from .._torch.device import OpOverload, version_of
from ..device import cards
from ..device.copy import contiguous_copy
from ..device.op_call import (bound_args, flat_tensors, map_tensors, resize_written, rewrap_numbers,
                              write_only_outs, written_args)
from ..device.storage import allocation_of
from ..runtime.timing_only import NoDataError
from ..util.bounded_cache import BoundedCache
from . import row_views, weight_parts
from .kernel_runtime import generation_key, walks_allocation_dims
from .row_views import row_shift

MODES = ("compile", "host")
DEFAULT_MODE = "compile"  # docs/compiler.md "Eager mode"; TORCH_SPYRE_EAGER=host computes every op on the host
DEFAULT_CACHE_SIZE = 1024

_local = threading.local()
_lock = threading.RLock()
_compile_lock = threading.Lock()  # one Inductor compilation at a time


def mode() -> str:
    """``TORCH_SPYRE_EAGER``: ``compile`` (single-op programs) or ``host`` (every op on the host)."""
    raw = os.environ.get("TORCH_SPYRE_EAGER", DEFAULT_MODE)
    value = _modes.get(raw)  # (every op asks: each distinct value is checked once)
    if value is None:
        value = raw.strip().lower() or DEFAULT_MODE
        if value not in MODES:
            raise ValueError(f"TORCH_SPYRE_EAGER={value!r} is not one of {', '.join(MODES)}")
        if len(_modes) < 16:
            _modes[raw] = value
    return value


_modes: dict[str, str] = {}


def active() -> bool:
    """True while this thread compiles or runs an eager single-op program (nested ops go to the host)."""
    return getattr(_local, "depth", 0) > 0


def compiling() -> bool:
    """True while this thread traces or compiles an eager single-op program."""
    return getattr(_local, "compiling", False)


class _Compiling:
    def __enter__(self):
        self.previous = compiling()
        _local.compiling = True

    def __exit__(self, *exc):
        _local.compiling = self.previous


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------
@dataclass
class Entry:
    """One signature: its compiled program function, or why it runs on the host."""

    compiled: Callable[..., Any] | None
    reason: str = ""


class _Cache:
    def __init__(self, size: int):
        self.size = size
        self.entries: BoundedCache[tuple, Entry] = BoundedCache(size)
        self.hits = self.compiles = self.failures = 0

    @property
    def evictions(self) -> int:
        return self.entries.evictions

    def get(self, key: tuple) -> Entry | None:
        entry = self.entries.get(key)
        if entry is not None:
            self.hits += 1
        return entry

    def put(self, key: tuple, entry: Entry) -> None:
        self.entries.put(key, entry)


def _cache_size() -> int:
    return int(os.environ.get("TORCH_SPYRE_EAGER_CACHE_SIZE", DEFAULT_CACHE_SIZE))


_cache = _Cache(_cache_size())


def cache_stats() -> dict[str, int]:
    """``hits`` (launches of a cached program), ``compiles`` (signatures compiled), ``failures``
    (signatures that could not be compiled), ``evictions``, ``entries``, ``size`` (the LRU bound)."""
    with _lock:
        return {"hits": _cache.hits, "compiles": _cache.compiles, "failures": _cache.failures,
                "evictions": _cache.evictions, "entries": len(_cache.entries), "size": _cache.size}


def reset_cache(size: int | None = None) -> None:
    """Drop every compiled signature and zero the counters (``size`` sets a new LRU bound)."""
    global _cache
    with _lock:
        _cache = _Cache(size if size is not None else _cache_size())
        _out_shape_cache.clear()


# ---------------------------------------------------------------------------------------------
# What stays on the host by design
# ---------------------------------------------------------------------------------------------
_HOST_OPS = {
    "_local_scalar_dense": "reads one value to the host",
    "item": "reads one value to the host",
}


def _is_random(op: OpOverload, info: Any) -> bool:
    return info.generator is not None or torch.Tag.nondeterministic_seeded in op.tags


def static_host_reason(op: OpOverload, info: Any) -> str:
    """Why an op runs on the host whatever its arguments ("" if it may become a program). Memoized per op
    (``info`` is the op's own, ``op_call.op_info``)."""
    reason = _static_reasons.get(op)
    if reason is None:
        reason = _static_reasons[op] = _static_host_reason(op, info)
    return reason


_static_reasons: dict[OpOverload, str] = {}


def _static_host_reason(op: OpOverload, info: Any) -> str:
    if info.name in _HOST_OPS:
        return _HOST_OPS[info.name]
    if _is_random(op, info):
        return "random op: draws from the card's host-side generator"
    if not info.returns_only_tensors:
        return "returns a non-tensor value"
    return ""


def call_host_reason(info: Any, bound: list[Any]) -> str:
    """Why this call runs on the host ("" if it may become a program). ``out=`` arguments may still be
    empty here (the op resizes them)."""
    inputs = flat_tensors([v for v, out in zip(bound, info.is_out) if not out])
    if not any(t.device.type == "spyre" for t in inputs):
        return "no spyre tensor input (a factory: its values do not depend on device data)"
    if any(t.numel() == 0 for t in inputs):
        return "a tensor of no elements"
    if any(info.is_write) and _written_overlaps(info, bound):
        return "a written argument overlaps another argument other than as the same view"
    return ""


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _geometry(t: torch.Tensor) -> tuple:
    return (_storage_key(t), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _written_overlaps(info: Any, bound: list[Any]) -> bool:
    """A written tensor sharing storage with another argument that is not the very same view
    (``x.add_(y)`` reaches ``add.out(x, y, out=x)``: that is fine; ``out=x[1:]`` with input ``x`` is not)."""
    written, read = [], []
    for value, w in zip(bound, info.is_write):
        (written if w else read).extend(flat_tensors([value]))
    keys = [_storage_key(t) for t in written]
    if len(set(keys)) != len(keys):
        return True
    for w in written:
        if any(_storage_key(r) == _storage_key(w) and _geometry(r) != _geometry(w) for r in read):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------------------------
def _tensor_signature(t: torch.Tensor, storages: dict[int, int], rows: bool) -> tuple:
    storage = t.untyped_storage()  # (once: the allocation and the storage group both come from it)
    alloc = allocation_of(storage)
    layout = alloc.meta["layout"] if alloc is not None else None
    group = storages.setdefault(storage.data_ptr(), len(storages))
    # The storage offset too: programs are generated per placement, and a view that starts inside a
    # stick can be refused where one on a stick boundary was not. With ``rows``, a view of whole rows is
    # placed at offset 0 wherever its rows are (row_views.py, as SpyreKernel binds it).
    offset: Any = t.storage_offset()
    if (rows and alloc is not None and alloc.meta.get("dtype") is t.dtype
            and row_shift(layout, tuple(t.shape), t.stride(), offset) is not None):
        offset = "rows"
    return ("T", tuple(t.shape), t.stride(), offset, t.dtype, layout, group)


def _value_signature(v: Any, storages: dict[int, int], rows: bool = False) -> Any:
    if isinstance(v, torch.Tensor):
        if v.device.type != "spyre":  # a 0-d CPU scalar: a constant
            return ("C", v.dtype, _value_signature(v.item(), storages))
        return _tensor_signature(v, storages, rows)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value_signature(x, storages, rows) for x in v))
    if isinstance(v, float):
        return ("f", v.hex())  # 0.0 and -0.0, nan: by bits
    return (type(v).__name__, v if isinstance(v, (bool, int, str, type(None))) else repr(v))


def _places_rows(op: OpOverload) -> bool:
    """Whether the key places views of whole rows at offset 0: not with ``row_views`` switched off, nor for
    an op taking a ``storage_offset`` (``as_strided_scatter``: one into the storage, which the traced graph
    keeps). Views of a storage the op only reads may all be placed so (``torch.stack`` of a batch's rows:
    reading through aliases is the same whatever their offsets); a call whose written storage another
    argument reaches as another view never gets here with a key it would use (``call_host_reason`` sends
    it to the host first), so every argument reaching a written storage is that storage's one view."""
    return row_views.enabled() and not _takes_storage_offset(op)


@functools.lru_cache(maxsize=None)
def _takes_storage_offset(op: OpOverload) -> bool:
    return "as_strided" in str(op) or any(a.name == "storage_offset" for a in torch_device.op_schema(op).arguments)


def signature(op: OpOverload, args: tuple, kwargs: dict, card: int) -> tuple:
    """The cache key of an eager op: the op, its arguments' signatures, the card and its configuration, the
    fp32 matmul precision and what else a generated program depends on (the optimizations switched off,
    a forced core count: ``kernel_runtime.generation_key``)."""
    storages: dict[int, int] = {}
    rows = _places_rows(op)
    return (op, tuple([_value_signature(a, storages, rows) for a in args]),
            tuple(sorted([(k, _value_signature(v, storages, rows)) for k, v in kwargs.items()])) if kwargs else (),
            card, id(cards.card(card).config), torch.get_float32_matmul_precision(), generation_key())


# ---------------------------------------------------------------------------------------------
# Building and compiling the one-op graph
# ---------------------------------------------------------------------------------------------
def _template(value: Any, tensors: list[torch.Tensor], shared: dict[int, int] | None = None) -> Any:
    """The argument with each spyre tensor replaced by its index in ``tensors`` (appended) and each
    CPU scalar tensor by a constant of the graph (its value is part of the signature).

    ``shared`` maps the storages the op writes to their slot: every argument reaching a written storage
    takes that one slot (``x.add_(y)`` is ``add.out(x, y, out=x)``, ``x.add_(x)`` passes it thrice), so the
    graph sees one input, not aliasing inputs of which one is mutated. For those aot_autograd builds a
    "synthetic base", at trace time from the fake placeholders (no ``_base``: the whole storage, 1-d) and
    at run time from the real tensors (a view's ``_base``), and torch's graph caches (on disk, shared
    between processes) key neither: the graph's input check then failed (``x[3].add_(z)``; a 1-d
    ``c.add_(z)`` after it) and the op ran on the host.
    :func:`call_host_reason` sent calls whose views of a written storage differ to the host, so the one
    slot's view is every argument's."""
    if isinstance(value, torch.Tensor) and value.device.type != "spyre":
        return _Const(value.item(), value.dtype)
    if isinstance(value, torch.Tensor):
        if shared is not None and (key := _storage_key(value)) in shared:
            if shared[key] < 0:
                shared[key] = len(tensors)
                tensors.append(value)
            return _Slot(shared[key])
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, tensors, shared) for v in value)
    return value


def _written_slots(info: Any, bound: list[Any]) -> dict[int, int] | None:
    """A fresh ``shared`` map for :func:`_template`: each written storage, no slot yet (None: none written)."""
    if not any(info.is_write):
        return None
    return {_storage_key(t): -1 for t in _written(info, bound)}


@dataclass(frozen=True)
class _Slot:
    index: int


@dataclass(frozen=True)
class _Const:
    value: Any
    dtype: torch.dtype


def _fill(value: Any, tensors: tuple) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, _Const):  # a constant of the graph on the card (Inductor folds it into the kernel)
        return torch.full((), value.value, dtype=value.dtype, device=tensors[0].device)
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    return value


def one_op_function(op: OpOverload, info: Any, args: tuple, kwargs: dict):
    """``fn(*tensors) -> tuple`` calling the op once, and the tensors it takes (a written storage's view
    once: :func:`_template`). ``fn`` returns only the results that do not alias an argument (the caller
    returns those arguments themselves)."""
    tensors: list[torch.Tensor] = []
    shared = _written_slots(info, bound_args(info, args, kwargs))
    targs = tuple(_template(a, tensors, shared) for a in args)
    tkwargs = {k: _template(v, tensors, shared) for k, v in kwargs.items()}
    fresh = [i for i, (alias, _) in enumerate(info.returns) if alias is None]

    def fn(*ts):
        out = op(*_fill(targs, ts), **{k: _fill(v, ts) for k, v in tkwargs.items()})
        outs = out if isinstance(out, (tuple, list)) and len(info.returns) > 1 else (out,)
        return tuple(outs[i] for i in fresh)

    return fn, tensors


def out_shapes(op: OpOverload, info: Any, args: tuple, kwargs: dict) -> list[tuple[int, ...]]:
    """The shapes the op gives its written arguments (``out=`` may need a resize), from a fake run.
    ``out=`` arguments that no input shares are fakes of no elements there, which the op resizes
    silently: a fake of the out's own shape made the fake kernel print torch's C++ "was resized"
    warning besides ours (:func:`resize_outs`)."""
    write_only = {id(t) for t in write_only_outs(info, bound_args(info, args, kwargs))}
    with torch_inductor.fake_tensor_mode() as mode:
        def to_fake(x):
            if id(x) in write_only:
                return torch.empty(0, dtype=x.dtype, device=x.device)  # a fake tensor (the mode is on)
            return mode.from_tensor(x)

        fargs = tuple(map_tensors(to_fake, a) for a in args)
        fkwargs = {k: map_tensors(to_fake, v) for k, v in kwargs.items()}
        op(*fargs, **fkwargs)
        return [tuple(t.shape) for t in _written(info, bound_args(info, fargs, fkwargs))]


def resize_outs(op, info: Any, args: tuple, kwargs: dict, bound: list[Any], key: tuple) -> bool:
    """Resize written arguments to the op's result shapes, as the CPU does (its warning when the
    ``out=`` had elements). The target shapes are cached per signature. True if anything was resized."""
    with _lock:
        shapes = _out_shape_cache.get(key)
    if shapes is None:
        try:
            shapes = out_shapes(op, info, args, kwargs)
        except Exception as e:  # noqa: BLE001 - e.g. data-dependent output shapes
            raise HostOp(f"{type(e).__name__}: {_first_line(e)}") from None
        with _lock:
            _out_shape_cache[key] = shapes
            if len(_out_shape_cache) > _cache.size:
                _out_shape_cache.pop(next(iter(_out_shape_cache)))
    resized = False
    for (name, t), shape in zip(written_args(info, bound), shapes):
        resized |= resize_written(info, name, t, shape)  # torch's warning if it held elements, naming the op
    return resized


_out_shape_cache: dict[tuple, list[tuple[int, ...]]] = {}


def _written(info: Any, bound: list[Any]) -> list[torch.Tensor]:
    return flat_tensors([v for v, w in zip(bound, info.is_write) if w])


def compile_one_op(fn: Callable[..., tuple], tensors: list[torch.Tensor]) -> Callable[..., Any]:
    """Trace ``fn`` on fake copies of ``tensors`` and compile the graph with Inductor for spyre."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from . import backend

    backend.register()
    with warnings.catch_warnings():  # the compiler's own warnings (torch internals) are not the op's
        warnings.simplefilter("ignore")
        gm = make_fx(fn, tracing_mode="fake")(*tensors)
        # Fake example inputs: nothing is computed on real tensors while compiling.
        fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        return torch_inductor.compile_graph(gm, fakes)


# ---------------------------------------------------------------------------------------------
# Running an op
# ---------------------------------------------------------------------------------------------
class HostOp(Exception):
    """Raised by :func:`run` when the op must run on the host; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Nested:
    def __enter__(self):
        _local.depth = getattr(_local, "depth", 0) + 1
        if _local.depth == 1:
            _local.nested_host, _local.nested_names = 0, ()

    def __exit__(self, *exc):
        _local.depth -= 1


def note_nested_host(name: str) -> None:
    """Called by the fallback when an op runs on the host inside an eager program's compile or run."""
    _local.nested_host = getattr(_local, "nested_host", 0) + 1
    _local.nested_names = getattr(_local, "nested_names", ()) + (name,)


def _call(compiled: Callable[..., Any], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(compiled(*tensors))


def _compile_entry(op, info, args, kwargs, bound) -> tuple[Entry, list[torch.Tensor] | None]:
    """Compile the signature's program and run it once; an Entry saying why not on any failure."""
    from .kernel_runtime import host_fallback_stats

    fn, tensors = one_op_function(op, info, args, kwargs)
    host_before = sum(host_fallback_stats().values())
    try:
        with torch.no_grad(), _Compiling(), _compile_lock:
            compiled = compile_one_op(fn, tensors)
        outs = _call(compiled, tensors)
    except NoDataError:
        raise  # the op needs values a timing-only tensor does not have: not a refusal to remember
    except Exception as e:  # noqa: BLE001 - any compiler refusal means: no device lowering
        return Entry(None, f"{type(e).__name__}: {_first_line(e)}"), None
    nested = sum(host_fallback_stats().values()) - host_before + getattr(_local, "nested_host", 0)
    if nested:
        names = ", ".join(sorted(set(getattr(_local, "nested_names", ())))) or "an extern kernel"
        return Entry(None, f"no Spyre lowering (its compiled graph runs {names} on the host)"), outs
    return Entry(compiled), outs


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


def run(op: OpOverload, info: Any, args: tuple, kwargs: dict, card: int) -> tuple[Any, str]:
    """Run one op as a program: ``(result, "")``; raise :class:`HostOp` when it must run on the host
    (nothing was computed or written).

    A first call that compiled the op but found host work inside its graph has already computed the
    result (through nested host fallbacks, counted as such): it returns ``(result, reason)``, and later
    calls of that signature raise HostOp without compiling again.
    """
    reason = static_host_reason(op, info)
    # Python numbers in Tensor arguments (C++'s wrapped numbers, unwrapped by the boxed call): 0-d CPU
    # tensors, which the graph takes as constants.
    args, kwargs = rewrap_numbers(info, args, kwargs)
    args, kwargs = _operands_in_walkable_views(info, args, kwargs)
    bound = bound_args(info, args, kwargs)
    reason = reason or call_host_reason(info, bound)
    if reason:
        raise HostOp(reason)
    key = None
    if any(info.is_out):
        key = signature(op, args, kwargs, card)
        if resize_outs(op, info, args, kwargs, bound, key):
            if any(t.numel() == 0 for t in _written(info, bound)):
                raise HostOp("a tensor of no elements")
            key = signature(op, args, kwargs, card)
    outs = _run_with_weight_parts(op, info, bound, card)
    if outs is not None:
        return _results(info, bound, outs), ""
    if key is None:  # (after the weight parts: a matmul running on them needs no key of its own)
        key = signature(op, args, kwargs, card)
    with _lock:
        entry = _cache.get(key)
    if entry is not None and entry.compiled is None:
        raise HostOp(entry.reason)
    with _Nested():
        if entry is None:
            entry, outs = _compile_entry(op, info, args, kwargs, bound)
            with _lock:
                _cache.put(key, entry)
                _cache.compiles += entry.compiled is not None
                _cache.failures += entry.compiled is None
            if outs is None:
                raise HostOp(entry.reason)
        else:
            outs = _call_cached(entry, key, _spyre_tensors(args, kwargs, _written_slots(info, bound)))
    return _results(info, bound, outs), entry.reason


# Whole-op generators read their operands one stride per dim: a view merging dims of its allocation
# (e.g. a [2, 12] index seen as [24]) is copied first.
_WHOLE_OP_GENERATOR_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "embedding", "index_select", "gather", "index"})


def _operands_in_walkable_views(info: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Operands of matmul and gather ops whose view merges dims of their allocation are copied first (a
    copy program), as the compiled path's lowerings do (``lowerings._matmul_operand``,
    ``_gather_operand``); the copy is its own eager op."""
    if info.name.split(".")[0] not in _WHOLE_OP_GENERATOR_OPS:
        return args, kwargs
    written = {i for i, w in enumerate(info.is_write) if w}
    names = list(info.arg_names)

    def fix(i: int, v: Any) -> Any:
        if (i not in written and isinstance(v, torch.Tensor) and v.device.type == "spyre"
                and not walks_allocation_dims(v)):
            return contiguous_copy(v)  # (v.clone(memory_format=torch.contiguous_format), less dispatch)
        return v

    args = tuple(fix(i, v) for i, v in enumerate(args))
    kwargs = {k: fix(names.index(k) if k in names else -1, v) for k, v in kwargs.items()}
    return args, kwargs


# ---------------------------------------------------------------------------------------------
# fp32 matmuls on a weight's cached DLFloat16 parts (weight_parts.py)
# ---------------------------------------------------------------------------------------------
_PARTS_OPERANDS = {"addmm": (1, 2), "mm": (0, 1)}  # positions of A and B in the schema


def _run_with_weight_parts(op: OpOverload, info: Any, bound: list[Any], card: int) -> list[torch.Tensor] | None:
    """An fp32 ``addmm``/``mm`` whose B has a version counter (a weight, not an inference activation) runs
    on B's parts split once (``weight_parts.py``): the matmul's program then splits only A. None when it
    does not apply or a program cannot be made (the op then goes the ordinary way, which writes nothing
    before it succeeds either)."""
    name, _, overload = info.name.partition(".")
    positions = _PARTS_OPERANDS.get(name)
    if positions is None or overload not in ("", "default", "out"):  # not addmm.dtype's out_dtype arguments
        return None
    a, b = bound[positions[0]], bound[positions[1]]
    if not (weight_parts.cacheable(b) and isinstance(a, torch.Tensor) and a.dtype == torch.float32
            and a.device.type == "spyre" and b.dim() == 2 and b.shape[-1] != 1 and weight_parts.enabled()):
        return None
    if any(_storage_key(t) == _storage_key(b) for t in _written(info, bound)):
        return None  # the op writes its weight: nothing to reuse
    if positions == (1, 2) and not (isinstance(bound[0], torch.Tensor) and bound[0].device.type == "spyre"):
        return None  # a CPU scalar bias: the ordinary program takes it as a constant
    parts_key = weight_parts.key_of(b, card, (id(_card_config(card)), generation_key()))
    parts = weight_parts.lookup(b, parts_key)
    if parts is None:
        version = version_of(b)
        parts_op = weight_parts.parts_op()
        try:
            outs = _run_program(("weight_parts", signature(parts_op, (b,), {}, card)), lambda w: (parts_op(w),), [b])
        except torch.OutOfMemoryError:
            weight_parts.clear()  # the cached parts make room; the ordinary program splits in its own call
            return None
        if outs is None:
            return None
        parts = outs[0]
        weight_parts.store(b, parts_key, parts, version)
    matmul = weight_parts.matmul_op()
    if positions == (1, 2):  # addmm(bias, a, b, beta, alpha[, out])
        bias, beta, alpha = bound[0], bound[3], bound[4]
    else:  # mm(a, b[, out])
        bias, beta, alpha = None, 1, 1
    out = bound[-1] if any(info.is_out) else None
    args = [a, parts] + ([bias] if bias is not None else [])
    out_slot = len(args)
    if out is not None:
        # An out= that is the bias or A (the same view: call_host_reason) is that one input (see _template).
        out_slot = next((i for i, t in enumerate(args) if i != 1 and _storage_key(t) == _storage_key(out)), out_slot)
        if out_slot == len(args):
            args.append(out)

    def fn(*ts):
        result = matmul(ts[0], ts[1], ts[2] if bias is not None else None, float(beta), float(alpha))
        if out is None:
            return (result,)
        ts[out_slot].copy_(result)
        return ()

    key = ("weight_parts_matmul", signature(matmul, tuple(args), {"beta": float(beta), "alpha": float(alpha)}, card))
    try:
        return _run_program(key, fn, args)
    except torch.OutOfMemoryError:
        weight_parts.clear()
        return None


def _card_config(card: int) -> Any:
    return cards.card(card).config


def _run_program(key: tuple, fn: Callable[..., tuple], tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Run ``fn`` on ``tensors`` as a program compiled once per ``key`` (kept in the eager cache); None if it
    cannot be compiled or run (remembered)."""
    with _lock:
        entry = _cache.get(key)
    if entry is not None and entry.compiled is None:
        return None
    with _Nested():
        if entry is None:
            try:
                with torch.no_grad(), _Compiling(), _compile_lock:
                    entry = Entry(compile_one_op(fn, tensors))
            except (NoDataError, torch.OutOfMemoryError):
                raise  # not the program's fault: nothing to remember against its key
            except Exception as e:  # noqa: BLE001 - the op's ordinary program is the fallback
                entry = Entry(None, f"{type(e).__name__}: {_first_line(e)}")
            with _lock:
                _cache.put(key, entry)
                _cache.compiles += entry.compiled is not None
                _cache.failures += entry.compiled is None
            if entry.compiled is None:
                return None
        try:
            return _call(entry.compiled, tensors)
        except (NoDataError, torch.OutOfMemoryError):
            raise
        except Exception as e:  # noqa: BLE001
            with _lock:
                _cache.put(key, Entry(None, f"{type(e).__name__}: {_first_line(e)}"))
            return None


def _spyre_tensors(args: tuple, kwargs: dict, shared: dict[int, int] | None = None) -> list[torch.Tensor]:
    """The program's inputs, in the order :func:`one_op_function` takes them (a written storage's view once)."""
    tensors = [t for t in flat_tensors((args, tuple(kwargs.values()))) if t.device.type == "spyre"]
    if not shared:
        return tensors
    once = []
    for t in tensors:
        key = _storage_key(t)
        if key in shared:
            if shared[key] >= 0:
                continue
            shared[key] = len(once)
        once.append(t)
    return once


def _call_cached(entry: Entry, key: tuple, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Launch a cached program. Each kernel's program is generated and checked before it launches, and
    a one-op graph writes the op's arguments only in its last kernel, so a refusal here (a placement
    the signature did not foresee) has not changed them: the signature then goes to the host."""
    try:
        return _call(entry.compiled, tensors)
    except Exception as e:  # noqa: BLE001
        reason = f"{type(e).__name__}: {_first_line(e)}"
        with _lock:
            _cache.put(key, Entry(None, reason))
        raise HostOp(reason) from None


def _results(info: Any, bound: list[Any], fresh: list[torch.Tensor]) -> Any:
    """The op's returns: aliases of arguments are those arguments, the rest the program's outputs."""
    it = iter(fresh)
    results = [bound[alias] if alias is not None else next(it) for alias, _ in info.returns]
    return results[0] if len(results) == 1 else tuple(results)


# ---------------------------------------------------------------------------------------------
# Warnings
# ---------------------------------------------------------------------------------------------
_warned: set[str] = set()
# Host work that is not a computation a program should do: no warning (still counted).
# Calls that cannot compile now, whatever the op: they run on the host without warning, and nothing is
# remembered for their signature (the next call outside those contexts compiles it).
UNDER_NO_DISPATCH = "called with torch dispatch disabled (no_dispatch(): torch computing on real tensors)"
DURING_GRAPH_COMPILE = "called while torch.compile compiles a graph (Inductor cannot compile another inside)"
QUIET_REASONS = {"reads one value to the host", "a tensor of no elements", UNDER_NO_DISPATCH, DURING_GRAPH_COMPILE}


def cannot_compile_now() -> str:
    """Why no op can be compiled in this thread right now ("" if it can). Torch's tracers run eager ops
    on real tensors under ``no_dispatch()`` (fake tensors' constant propagation and fallback kernels,
    Inductor's constant inlining), where tracing the one-op graph with fake tensors fails an assertion;
    and ``torch.compile`` runs some while it compiles a graph (printing tensor constants), where
    Inductor cannot compile another graph. Those failures were remembered as the op's reason to run on
    the host, so every later call of that signature stayed on the host, warning about an
    AssertionError."""
    if torch_device.torch_dispatch_disabled():
        return UNDER_NO_DISPATCH
    if torch_inductor.graph_compile_in_progress():
        return DURING_GRAPH_COMPILE
    return ""


_reasons: dict[str, str] = {}


def host_reasons() -> dict[str, str]:
    """Op name -> the last reason it ran on the host (in compile mode)."""
    with _lock:
        return dict(_reasons)


def warn_host(name: str, reason: str) -> None:
    """Once per op: the op runs on the host, and why."""
    with _lock:
        _reasons[name] = reason
    if reason in QUIET_REASONS:
        return
    with _lock:
        if name in _warned:
            return
        _warned.add(name)
    warnings.warn(f"aten::{name} runs on the host (CPU), not as a Spyre program: {reason.rstrip('.')}. "
                  f"It is counted in torch_spyre.fallback_stats().host.", UserWarning, stacklevel=4)


def reset_warnings() -> None:
    """Warn again for every op (and forget the host reasons)."""
    with _lock:
        _warned.clear()
        _reasons.clear()

"""The runtime objects a compiled spyre graph calls: :class:`SpyreKernel`, :func:`empty_spyre`, the counters.

The generated wrapper (``wrapper.py``) loads each kernel as ``SpyreKernel.load(path)`` and calls
``kernel.run(buffer=..., ...)``; it imports these names from ``torch_spyre.compiler.wrapper``, which
re-exports them.

:class:`SpyreKernel` holds the kernel's :class:`~torch_spyre.compiler.kernel_ir.KernelSpec`. At its first
call with a given placement of its tensors (their stick layouts and storage offsets) it generates the
program (``generators.py`` picks the generator), writes the ``TORCH_SPYRE_DEBUG`` files and prepares it
for the card (validation, timing, patch table); every call then only patches addresses and launches on
the current stream.

Dynamic shapes: a symbolic spec (``spec.symbols``, e.g. ``["s27"]``) is called with the symbols'
values (``spyre_softmax_0.run(arg0_1=arg0_1, buf2=buf2, s27=s27)``); the kernel specializes the spec
for those values and generates per (values, placement). Prepared programs are kept in a per-kernel LRU
(``TORCH_SPYRE_SHAPE_CACHE_SIZE``, default 32), so a varying sequence length costs a bounded number of
card programs; :func:`shape_cache_stats` counts specializations, programs and evictions.

Host fallbacks inside compiled graphs (extern kernels Inductor could not lower) are counted:
:func:`host_fallback_stats` must stay empty for supported ops.

Nothing here imports Inductor: a cached wrapper runs without compiling.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import weakref
from collections import Counter
from typing import Any

import torch

from ..device.copy import contiguous_copy
from ..device.storage import allocation_of
from ..runtime import launch as _launch  # (its launch looked up per call: tests count launches by patching it)
from ..util.bounded_cache import BoundedCache
from . import optimizations, row_views
from .core_count import forced_cores
from .generators import generator_for
from .kernel_spec import KernelSpec, torch_dtype
from .row_views import extent_bytes, row_shift

_fallbacks: Counter[str] = Counter()
_fallback_lock = threading.Lock()


def note_host_fallback(name: str) -> None:
    """Called by generated code right before an op runs on the host inside a compiled graph."""
    with _fallback_lock:
        _fallbacks[name] += 1


_compile_fallback_warned: set[str] = set()


def note_compile_fallback(op: str, reason: str) -> None:
    """Called by generated code right before a compiled graph calls ``op`` eagerly because the compiler
    could not lower it for the card (``fallback.py``): counted in
    ``torch_spyre.fallback_stats().compile_fallbacks``, its work tagged for the profiler, and a warning
    once per op (per process) naming it and why."""
    import warnings

    from ..device.fallback import expect_compile_fallback

    expect_compile_fallback(op)
    with _fallback_lock:
        if op in _compile_fallback_warned:
            return
        _compile_fallback_warned.add(op)
    warnings.warn(f"torch.compile on spyre: {op} has no lowering for the card and runs as the eager op "
                  f"instead ({reason.rstrip('.')}). Counted in torch_spyre.fallback_stats().compile_fallbacks.",
                  UserWarning, stacklevel=2)


def reset_compile_fallback_warnings() -> None:
    """Warn again for every op that falls back."""
    with _fallback_lock:
        _compile_fallback_warned.clear()


def host_fallback_stats() -> dict[str, int]:
    """Op name -> number of host executions inside compiled spyre graphs."""
    with _fallback_lock:
        return dict(_fallbacks)


def reset_host_fallback_stats() -> None:
    with _fallback_lock:
        _fallbacks.clear()


def empty_spyre(size, stride, dtype: torch.dtype, card: int, stick_dim: int | None = None) -> torch.Tensor:
    """A spyre buffer allocated by a compiled graph. ``stick_dim`` (a dim of the dense host shape,
    outermost first) picks the sticked dimension; None keeps the device's default (the unit-stride dim)."""
    from ..device import dtypes, tensor

    layout = None
    if stick_dim is not None:  # (tensor.stick_layout: one memoized StickLayout per distinct layout)
        base = tensor.layout_for(size, stride, dtype)
        layout = tensor.stick_layout(base.host_shape, stick_dim, dtypes.device_dtype(dtype))
    return tensor.empty_strided(size, stride, dtype, card, layout=layout)


# Whole-op programs by what they compute: the six identical matmuls of six transformer layers are
# planned once (operands are role names, so a program fits every kernel with the same key).
_WHOLE_OP_CACHE: dict[tuple, Any] = {}
_WHOLE_OP_CACHE_SIZE = 512


def _whole_op_program(spec: KernelSpec, places: dict[str, Any], config: Any):
    import json

    key = (spec.generator, json.dumps(spec.params, sort_keys=True, default=str),
           tuple((b.name, b.dtype, tuple(b.size), tuple(b.stride), b.offset) for b in spec.buffers),
           tuple(sorted(places.items(), key=lambda kv: kv[0])), id(config), generation_key())
    program = _WHOLE_OP_CACHE.get(key)
    if program is None:
        program = generator_for(spec)(spec, places, config)
        if len(_WHOLE_OP_CACHE) >= _WHOLE_OP_CACHE_SIZE:
            _WHOLE_OP_CACHE.pop(next(iter(_WHOLE_OP_CACHE)))
        _WHOLE_OP_CACHE[key] = program
    return _program_named(program, spec)


def _program_named(program: Any, spec: KernelSpec) -> Any:
    """``program`` (generated for a kernel of the same content) as ``spec``'s kernel's: its name and the
    kernel named in its decisions."""
    from ..program import Program

    if program.name == spec.name:
        return program
    meta = dict(program.metadata)
    if isinstance(meta.get("decisions"), dict):
        meta["decisions"] = {**meta["decisions"], "kernel": spec.name, "source_ops": list(spec.source_ops),
                             "source_lines": list(spec.source_lines)}
    return Program(spec.name, program.operands, program.cores, meta)


SHAPE_CACHE_ENV = "TORCH_SPYRE_SHAPE_CACHE_SIZE"
DEFAULT_SHAPE_CACHE_SIZE = 32

# Over all kernels: "specializations" (symbolic specs made static for new shape values), "programs"
# (programs prepared for a kernel), "shared" (of those, taken from another kernel of the same content),
# "evictions" (prepared programs dropped by a kernel's LRU), "hits", "checked" (programs taken from the
# compile's generation check instead of generated again).
_shape_stats: Counter[str] = Counter()


def shape_cache_stats() -> dict[str, int]:
    """Counters of every :class:`SpyreKernel` since the last :func:`reset_shape_cache_stats`."""
    with _fallback_lock:
        return {k: _shape_stats[k] for k in ("specializations", "programs", "shared", "evictions", "hits",
                                           "checked")}


def reset_shape_cache_stats() -> None:
    with _fallback_lock:
        _shape_stats.clear()


def _count(event: str) -> None:
    with _fallback_lock:
        _shape_stats[event] += 1


def shape_cache_size() -> int:
    """Prepared programs a kernel keeps (per shape values and placement), from ``TORCH_SPYRE_SHAPE_CACHE_SIZE``."""
    text = os.environ.get(SHAPE_CACHE_ENV, str(DEFAULT_SHAPE_CACHE_SIZE))
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"{SHAPE_CACHE_ENV}={text!r}: expected a whole number >= 1 (prepared programs kept per "
                         f"kernel; default {DEFAULT_SHAPE_CACHE_SIZE})")
    return size


def generation_key() -> tuple[str, int | None]:
    """What a generated program depends on besides its spec, placements and card: the optimizations
    switched off and a forced core count. A program prepared under one is never launched under another."""
    return optimizations.fingerprint(), forced_cores()


# Programs the compile made to check that a kernel can be generated (``fallback.check_generates``), for
# the placements the wrapper is expected to bind: the kernel's first call with those takes its program from
# here instead of generating it again. Bounded; an entry is used once. A kernel of the same content as one
# checked already (the same layer of another block) is not generated again: at run time it shares that
# kernel's program (``_shared``).
_CHECKED_SIZE = 256
_checked: BoundedCache[tuple, Any] = BoundedCache(_CHECKED_SIZE)
_checked_contents: BoundedCache[tuple, bool] = BoundedCache(_CHECKED_SIZE)


def _checked_key(spec: KernelSpec, places: dict[str, Any], config: Any) -> tuple:
    return spec.to_json(), tuple(sorted(places.items(), key=lambda kv: kv[0])), config, generation_key()


def check_program(spec: KernelSpec, places: dict[str, Any], config: Any) -> None:
    """Generate ``spec``'s program for ``places`` (its ``LoweringError`` propagates) unless a kernel of the
    same content was generated for the same placements already; keep it for the kernel's first call."""
    names = _local_names(spec)
    content = (_content_of(spec, names), config, _places_content(places, names), generation_key())
    if _checked_contents.get(content):
        return
    program = generator_for(spec)(spec, places, config)
    _checked_contents.put(content, True)
    _checked.put(_checked_key(spec, places, config), program)


def _take_checked_program(spec: KernelSpec, places: dict[str, Any], config: Any) -> Any:
    if not _checked:
        return None
    program = _checked.pop(_checked_key(spec, places, config))
    if program is not None:
        _count("checked")
    return program


class SpyreKernel:
    """One compiled kernel: specializes its spec per shape values, generates and prepares its program per
    (values, placement) in a bounded LRU, launches it per call."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.cache_size = shape_cache_size()
        self._prepared: BoundedCache[tuple, Any] = BoundedCache(self.cache_size)
        self._specialized: BoundedCache[tuple, KernelSpec] = BoundedCache(self.cache_size)
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.last_launch = None
        # Per call, from the spec once: the buffers it binds, and those it only reads.
        self._buffer_names = tuple(b.name for b in spec.buffers)
        self._reads = frozenset(b.name for b in spec.buffers if b.role == "input")

    @classmethod
    def load(cls, path: str) -> "SpyreKernel":
        with open(path) as f:
            return cls(KernelSpec.from_json(f.read()))

    @property
    def name(self) -> str:
        return self.spec.name

    def placements(self, tensors: dict[str, torch.Tensor]):
        """(buffer name -> ``TensorView`` of the whole allocation it lies in, buffer name -> what its operand
        is bound to (the allocation, or ``(address, nbytes)`` for a view of whole rows placed at offset 0:
        ``row_views.py``), card), or Nones when a buffer has no allocation (no elements)."""
        where, allocs, card = self._where(tensors)
        if where is None:
            return None, None, None
        return self._places(where), allocs, card

    def _where(self, tensors: dict[str, torch.Tensor]):
        """Each buffer's (name, allocation layout, storage offset, extent), in buffer order: all a placement
        is (``_places`` makes the TensorViews only when a program is prepared); its bindings; its card. The
        extent is None but for a view of whole rows (:meth:`_rows_at_zero`), placed at storage offset 0."""
        where, allocs, card = [], {}, None
        for name in self._buffer_names:
            t = tensors[name]
            device = t.device
            if device.type != "spyre":
                raise RuntimeError(f"kernel {self.name}: buffer {name} is on {device}, expected a spyre device")
            alloc = allocation_of(t)
            if alloc is None:
                return None, None, None
            c = device.index or 0
            if card is not None and c != card:
                raise RuntimeError(f"kernel {self.name}: tensors on spyre:{card} and spyre:{c}; move them to one card")
            card = c
            where.append((name, alloc.meta["layout"], int(t.storage_offset()), None))
            allocs[name] = alloc
        return self._rows_at_zero(tensors, where, allocs), allocs, card

    def _rows_at_zero(self, tensors: dict[str, torch.Tensor], where: list, allocs: dict[str, Any]) -> tuple:
        """Buffers that are views of whole rows (``row_views.row_shift``) placed at storage offset 0 and
        bound where their rows start, declared as the bytes they reach from there: the same program then
        serves every row offset. Views of an allocation the kernel writes through one buffer and binds to
        another as another view keep their offsets (that aliasing stays placed as it was); views of one
        allocation that is only read are all moved (``torch.stack`` of a batch's rows)."""
        shifts = {}
        for name, layout, offset, _ in where:
            t = tensors[name]
            if allocs[name].meta.get("dtype") is t.dtype:
                shift = row_shift(layout, tuple(t.shape), t.stride(), offset)
                if shift is not None:
                    shifts[name] = shift
        if not shifts or not row_views.enabled():
            return tuple(where)
        written = [allocs[n] for n, *_ in where if n not in self._reads]
        for name in [n for n in shifts if any(allocs[n] is w for w in written)]:
            t, alloc = tensors[name], allocs[name]
            geometry = (t.storage_offset(), t.shape, t.stride(), t.dtype)
            if any(allocs[n] is alloc and (u := tensors[n]) is not t
                   and (u.storage_offset(), u.shape, u.stride(), u.dtype) != geometry for n, *_ in where):
                del shifts[name]
        out = []
        for name, layout, offset, extent in where:
            shift = shifts.get(name)
            if shift is None:
                out.append((name, layout, offset, extent))
                continue
            out.append((name, layout, 0, extent_bytes(layout, tensors[name].numel())))
            if shift:
                alloc, nbytes = allocs[name], shift * layout.itemsize
                allocs[name] = (alloc.address + nbytes, alloc.nbytes - nbytes)
        return tuple(out)

    @staticmethod
    def _places(where: tuple) -> dict[str, Any]:
        from .access import TensorView

        return {name: TensorView.whole(name, layout, offset) for name, layout, offset, _ in where}

    def run(self, **args: Any) -> None:
        """``args``: the kernel's buffers by name, and the values of its shape symbols (``s27=...``)."""
        values = self._symbol_values(args)
        args = self._cpu_scalars_on_card(args)
        args = self._operands_in_walkable_views(args)
        where, allocs, card = self._where(args)
        if where is None:  # a tensor of no elements: nothing to compute
            return
        # (name, layout, offset) determines the placement's TensorView: the key needs no TensorViews.
        key = (values, card, where, generation_key())
        prepared = self._prepared.get(key)
        if prepared is not None:
            with self._lock:
                self._note("hits")
        if prepared is None:
            prepared = self._prepare(self._places(where), card, key)
        self.last_launch = _launch.launch(prepared, allocs)

    def _cpu_scalars_on_card(self, args: dict[str, Any]) -> dict[str, Any]:
        """A 0-dim CPU tensor the kernel only reads, copied to the card of the kernel's other tensors.

        Eager torch lets a 0-dim CPU tensor meet device tensors (``x / torch.log(torch.tensor(2.0))``,
        SEW-D's ``torch.tensor(mid - 1)``), so Inductor computes it in a CPU kernel and hands the buffer to
        the device kernel reading it; on a GPU it passes the value (``zero_dim_cpu_tensor_list``). Here
        it is copied, one stick, per call (the value may change between calls). Anything else on the CPU
        (a non-0-dim tensor, or one the kernel writes) is still refused by ``placements``: torch refuses
        to mix those with device tensors too."""
        scalars = [n for n in self._reads if (v := args.get(n)) is not None and isinstance(v, torch.Tensor)
                   and v.is_cpu and v.dim() == 0]
        if not scalars:
            return args
        card = next((args[b.name].device for b in self.spec.buffers if isinstance(args.get(b.name), torch.Tensor)
                     and args[b.name].device.type == "spyre"), None)
        if card is None:
            return args  # nothing on a card to copy it to: placements says so
        self.stats["cpu_scalar_copies"] += 1  # per kernel only: not a shape-cache event
        # In the spec's dtype: a float64 scalar comes as fp32 (kernel_ir._loaded_dtype).
        dtypes = {b.name: torch_dtype(b.dtype) for b in self.spec.buffers}
        return {**args, **{n: args[n].to(dtypes[n]).to(card) for n in scalars}}

    def _operands_in_walkable_views(self, args: dict[str, Any]) -> dict[str, Any]:
        """The matmul and gather generators read each operand as one stride per dim of its allocation (a
        gathered row is a fixed set of sticks). The lowering copies views inside the graph that do not
        (``lowerings._matmul_operand``, ``_gather_operand``), but a graph *input* may itself be such a view
        (``torch.compile(f)(y.view(32, 64))`` with ``y`` allocated [4, 8, 64]; JetMoE's router gathers
        rows of ``hidden.view(-1, D)``): only the bound tensor shows it, so a contiguous one is copied here
        (a device copy, with the same strides the kernel's spec expects) before the kernel runs."""
        if self.spec.generator not in ("matmul", "gather"):
            return args
        inputs = {b.name for b in self.spec.buffers if b.role == "input"}

        def copied(name: str, v: Any) -> Any:
            if (name in inputs and isinstance(v, torch.Tensor) and v.device.type == "spyre" and v.is_contiguous()
                    and not walks_allocation_dims(v)):
                return contiguous_copy(v)  # (v.clone() of a contiguous v, less dispatch)
            return v

        return {name: copied(name, v) for name, v in args.items()}

    def _symbol_values(self, args: dict[str, Any]) -> tuple[tuple[str, int], ...]:
        if not self.spec.symbols:  # (eager programs are static)
            return ()
        missing = [s for s in self.spec.symbols if s not in args]
        if missing:
            raise TypeError(f"kernel {self.name} is symbolic in {self.spec.symbols} and was called without "
                            f"{missing}; pass their values (the generated wrapper does: {missing[0]}={missing[0]})")
        return tuple((s, int(args[s])) for s in self.spec.symbols)

    def specialized(self, values: dict[str, int]) -> KernelSpec:
        """The static spec for these shape-symbol values (cached alongside the prepared programs)."""
        key = tuple(sorted(values.items()))
        spec = self._specialized.get(key)
        if spec is None:
            spec = self.spec.specialize(values)
            if self.spec.symbols:
                self._note("specializations")
            self._specialized.put(key, spec)
        return spec

    def program_for(self, places: dict[str, Any], config: Any, values: dict[str, int] | None = None):
        spec = self.specialized(values or {})
        if not spec.generator:
            program = _take_checked_program(spec, places, config)
            return program if program is not None else generator_for(spec)(spec, places, config)
        return _whole_op_program(spec, places, config)

    def _prepare(self, places: dict[str, Any], card: int, key: tuple):
        """Generate and prepare the program for ``key`` = (shape values, card, placements)."""
        from ..device import cards
        from ..runtime.launch import prepare
        from . import debug

        values = dict(key[0])
        with self._lock:
            if key in self._prepared:
                return self._prepared.get(key)
            c = cards.card(card)
            spec = self.specialized(values)
            names = _local_names(spec)
            extents = tuple((names.index(n), e) for n, _, _, e in key[2] if e is not None)
            content = (_content_of(spec, names), c.config, _places_content(places, names), key[3], extents)
            shared = _shared.get(content, c)
            if shared is not None:  # another kernel of the same content (the same layer of another block)
                first, first_names = shared
                rename = dict(zip(first_names, names))  # same content: the same number of names
                program = _program_named(_with_operands_renamed(first.program, rename), spec)
                prepared = first.renamed(program)
                self._note("shared")
            else:
                program = _with_extents(self.program_for(places, c.config, values), key[2])
                prepared = prepare(program, c)
                _shared.put(content, prepared, names)
            debug.dump_kernel(spec, prepared.program)
            self._note("programs")
            evicted = self._prepared.evictions
            self._prepared.put(key, prepared)
            for _ in range(self._prepared.evictions - evicted):
                self._note("evictions")
            return prepared

    def _note(self, event: str) -> None:
        self.stats[event] += 1
        _count(event)

    def __repr__(self) -> str:
        sym = f", symbolic in {', '.join(self.spec.symbols)}" if self.spec.symbols else ""
        return f"<SpyreKernel {self.name}: {len(self._prepared)} prepared program(s){sym}>"


def _with_extents(program: Any, where: tuple) -> Any:
    """``program`` with each operand placed by its rows (an extent in ``where``) declared as that many bytes:
    it is bound where its rows start, so the rest of the layout may lie past its allocation's end
    (``validate`` at prepare refuses a program reaching further)."""
    from dataclasses import replace

    from ..program import Program

    extents = {n: e for n, _, _, e in where if e is not None}
    if not extents:
        return program
    operands = [replace(o, nbytes=extents[o.name]) if o.name in extents else o for o in program.operands]
    return Program(program.name, operands, program.cores, program.metadata)


def _local_names(spec: KernelSpec) -> list[str]:
    """The names a kernel's spec gives its buffers (operands first, in order) and scheduler nodes: the
    graph numbers them, so the same layer of another block has other ones."""
    names = [b.name for b in spec.buffers]
    names += [n for n in spec.internal if n not in names]
    names += [n.name for n in spec.nodes if n.name not in names]
    return names


def _content_of(spec: KernelSpec, names: list[str]) -> str:
    """The spec but its name and its buffers' names (each replaced by its position): what a generated
    program depends on besides placements, card and :func:`generation_key`. A program's name is its
    kernel's, and its operands are the kernel's buffers by name; nothing else in it comes from names."""
    from dataclasses import replace

    text = replace(spec, name="").to_json()
    return _names_pattern(names).sub(lambda m: f"@{names.index(m.group(0))}", text) if names else text


def _names_pattern(names: list[str]) -> "re.Pattern[str]":
    return re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                      + r")(?![\w.])")


def _places_content(places: dict[str, Any], names: list[str]) -> tuple:
    from dataclasses import replace

    return tuple(sorted((names.index(n), replace(v, name="")) for n, v in places.items()))


def _with_operands_renamed(program: Any, rename: dict[str, str]) -> Any:
    """``program`` with operand ``a`` called ``rename[a]`` everywhere: operands, the DMA instructions'
    addresses and the names in its metadata (the decisions name the buffers)."""
    from dataclasses import replace

    from ..program import Addr, DmaGather, DmaLoad, DmaStore, Program

    rename = {a: b for a, b in rename.items() if a != b}
    if not rename:
        return program
    pattern = _names_pattern(list(rename))

    def instruction(ins: Any) -> Any:
        if isinstance(ins, (DmaLoad, DmaGather)) and ins.src.operand in rename:
            return replace(ins, src=Addr(rename[ins.src.operand], ins.src.offset))
        if isinstance(ins, DmaStore) and ins.dst.operand in rename:
            return replace(ins, dst=Addr(rename[ins.dst.operand], ins.dst.offset))
        return ins

    def text(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda m: rename[m.group(0)], value)
        if isinstance(value, dict):
            return {text(k): text(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(text(v) for v in value)
        return value

    operands = [replace(o, name=rename.get(o.name, o.name)) for o in program.operands]
    cores = {core: [instruction(i) for i in ins] for core, ins in program.cores.items()}
    return Program(program.name, operands, cores, text(program.metadata))


class _SharedPrograms:
    """Prepared programs by content, shared by every kernel of that content: a model's repeated blocks
    compile to kernels that differ only in name (Inductor numbers them), and each would otherwise
    generate, validate, time and prove (its first, checked launch) the same program again. A kernel
    launches the shared one under its own names (:meth:`PreparedProgram.renamed`). Entries are weak:
    a program lives only while a kernel's own LRU keeps it, so ``TORCH_SPYRE_SHAPE_CACHE_SIZE`` still
    bounds what is kept; an entry prepared for a card since replaced (another configuration) is not used."""

    def __init__(self, size: int):
        self.size = size
        self._entries: BoundedCache[tuple, tuple[Any, list[str]]] = BoundedCache(size)

    def get(self, content: tuple, card: Any) -> tuple[Any, list[str]] | None:
        """(the prepared program, its kernel's local names), if one is alive and prepared for ``card``."""
        entry = self._entries.get(content)
        prepared = entry[0]() if entry is not None else None
        if prepared is None or prepared.card is not card:
            if entry is not None and prepared is None:
                self._entries.pop(content)
            return None
        return prepared, entry[1]

    def put(self, content: tuple, prepared: Any, names: list[str]) -> None:
        self._entries.put(content, (weakref.ref(prepared), names))


_shared = _SharedPrograms(1024)


def walks_allocation_dims(t: torch.Tensor) -> bool:
    """``access.walks_layout_dims`` for a spyre tensor and its allocation (a Linear on a 3-d input hands
    addmm a [B*S, K] view of a [B, S, K] allocation, which does not)."""
    alloc = allocation_of(t)
    return alloc is None or _walks_layout_dims(alloc.meta["layout"], t.shape, t.stride())


@functools.lru_cache(maxsize=4096)
def _walks_layout_dims(layout: Any, shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """(Memoized: every matmul and gather launch asks of each operand, eager ops twice; the answer depends
    only on the immutable layout and the view's geometry.)"""
    from .access import walks_layout_dims

    return walks_layout_dims(layout, shape, stride)

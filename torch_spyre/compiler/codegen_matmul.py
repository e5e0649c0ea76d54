"""The matmul family as Spyre programs: mm, bmm, addmm, baddbmm and linear.

    C[b, m, n] = alpha * sum_k A[b, m, k] * B[b, k, n]  (+ beta * bias[b, m, n], broadcast)

:func:`build_matmul` turns a :class:`MatmulSpec` (named device buffers with their stick layouts and the
strided views over them) into a :class:`~torch_spyre.program.Program` and the
:class:`~torch_spyre.compiler.decisions.KernelDecisions` that explain it. It is independent of Inductor:
the integrator builds a spec (the ``*_spec`` helpers below) and calls it.

How a program is shaped (docs/compiler.md, "The matmul family"):

- **Layouts.** The PE arrays stream activations sticked on K and hold weights sticked on N; the output
  is sticked on N. An operand sticked the other way is loaded as it lies and transposed in scratchpad on
  the vector unit (its cost is charged); :func:`preferred_layouts` tells the integrator which layout
  would avoid that, so a weight can be given the layout its matmul wants once, at load time.
- **Work division** over (batch, M rows, N sticks, K-split), every candidate from the divisors, chosen
  by an analytic cost model: PE time at the card's matmul rate, vector time, per-core DMA time, shared
  DRAM time, and the busiest ring link (DRAM traffic rides the ring to the memory stop; K-split partial
  sums ride the reduction ring or the data ring). K-split partners are adjacent ring stops.
- **Tiling.** M-, N- and K-tiles (N and K in whole sticks) shrink until the buffers fit
  ``scratchpad_plannable_bytes`` (checked with :func:`~torch_spyre.compiler.scratchpad.plan`).
- **Order.** Weight-stationary: for each N tile, for each K tile, one B tile stays while A tiles stream
  through it; A stays resident in scratchpad when it fits. A, B (and transposition staging) buffers and
  the fp32 accumulators are double-buffered, so loads overlap PE work and one tile's epilogue overlaps
  the next tile's matmuls. The epilogue (alpha, beta * bias, an activation, a residual) runs in fp32
  and rounds once to the output dtype.
- **K-split.** Partners each accumulate a K slice; partial sums (fp32) flow down a chain of adjacent
  partners, chunk by chunk, alternating direction so both ring directions work; the last partner of a
  chain adds the epilogue and stores. Receive buffers are reused with credit tokens (signal/wait).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import SpyreError
from ..card import costs
from ..card.config import CardConfig
from ..card.layout import StickLayout
from ..program import (
    dram_spans,
    STICK_BYTES,
    TRANSCENDENTAL_OPS,
    UNARY_OPS,
    Addr,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Operand,
    Program,
    RingRecv,
    RingSend,
    Scalar,
    Signal,
    SpTensor,
    Wait,
)
from .decisions import BufferDecision, KernelDecisions
from .scratchpad import SpBuffer, plan

DL, F32 = "dlfloat16", "float32"
UNIT = 64  # elements of one fp16 stick: N and K are tiled in whole units of it
OVERLAP_LOSS = 0.25  # share of the shorter of compute and data movement that double buffering leaves exposed
INPUT_DTYPES = (DL,)  # what the PE arrays multiply (fp16 and bf16 are stored as DLFloat16)
OUTPUT_DTYPES = (DL, F32)
KINDS = ("mm", "bmm", "addmm", "baddbmm", "linear")
ACTIVATIONS = frozenset(UNARY_OPS - {"copy", "cast"})


class MatmulSpecError(SpyreError, ValueError):
    """A matmul the card cannot run as specified (bad shapes, dtypes, layouts or address span)."""


# =============================================================================================
# The spec
# =============================================================================================
@dataclass(frozen=True)
class TensorView:
    """A strided view over a device buffer: element (i0, i1, ...) is host element
    ``offset + sum(i_d * strides[d])`` of the allocation described by ``layout``."""

    name: str
    layout: StickLayout
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def whole(name: str, layout: StickLayout) -> "TensorView":
        """The whole allocation, as allocated."""
        return TensorView(name, layout, layout.host_shape, layout.host_strides, 0)

    def transposed(self, d0: int = -2, d1: int = -1) -> "TensorView":
        shape, strides = list(self.shape), list(self.strides)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return replace(self, shape=tuple(shape), strides=tuple(strides))

    def expanded(self, batch: int) -> "TensorView":
        """A batch dimension of stride 0 in front (a weight shared by every batch)."""
        return replace(self, shape=(batch, *self.shape), strides=(0, *self.strides))


@dataclass(frozen=True)
class MatmulSpec:
    """``out = alpha * a @ b (+ beta * bias)``. ``a`` is [M, K] or [batch, M, K], ``b`` [K, N] or
    [batch, K, N] (a stride-0 batch dimension shares it), ``out`` [M, N] or [batch, M, N]; ``bias``
    broadcasts to ``out`` (numpy rules; typically [N], [M, N] or [batch, M, N]). The output dtype is
    ``out.layout.device_dtype`` (dlfloat16 for fp16/bf16, or float32)."""

    a: TensorView
    b: TensorView
    out: TensorView
    bias: TensorView | None = None
    alpha: float = 1.0
    beta: float = 1.0
    kind: str = "mm"
    name: str = "matmul"
    source_ops: tuple[str, ...] = ()
    # Fused epilogue, applied in fp32 before the one rounding: out = act(alpha*a@b + beta*bias) + residual
    activation: str | None = None  # a unary vector op: "gelu", "gelu_tanh", "relu", "silu", "tanh", ...
    residual: TensorView | None = None  # broadcast to out like the bias

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(batch, M, N, K)."""
        a = _as3(self.a.shape)
        b = _as3(self.b.shape)
        return max(a[0], b[0]), a[1], b[2], a[2]


def mm_spec(a: TensorView, b: TensorView, out: TensorView, name: str = "mm") -> MatmulSpec:
    return MatmulSpec(a, b, out, kind="mm", name=name, source_ops=("aten.mm.default",))


def bmm_spec(a: TensorView, b: TensorView, out: TensorView, name: str = "bmm") -> MatmulSpec:
    return MatmulSpec(a, b, out, kind="bmm", name=name, source_ops=("aten.bmm.default",))


def addmm_spec(bias: TensorView, a: TensorView, b: TensorView, out: TensorView, beta: float = 1.0,
               alpha: float = 1.0, name: str = "addmm") -> MatmulSpec:
    return MatmulSpec(a, b, out, bias, alpha, beta, "addmm", name, ("aten.addmm.default",))


def baddbmm_spec(bias: TensorView, a: TensorView, b: TensorView, out: TensorView, beta: float = 1.0,
                 alpha: float = 1.0, name: str = "baddbmm") -> MatmulSpec:
    return MatmulSpec(a, b, out, bias, alpha, beta, "baddbmm", name, ("aten.baddbmm.default",))


def linear_spec(x: TensorView, weight: TensorView, out: TensorView, bias: TensorView | None = None,
                name: str = "linear") -> MatmulSpec:
    """``out = x @ weight^T + bias`` with ``weight`` [N, K] as nn.Linear keeps it; a 3-D ``x`` shares the
    weight across its batch (a stride-0 batch view)."""
    if len(weight.shape) != 2:
        raise MatmulSpecError(f"linear weight must be 2-d [N, K], got shape {list(weight.shape)}")
    b = weight.transposed()
    if len(x.shape) == 3:
        b = b.expanded(x.shape[0])
    return MatmulSpec(x, b, out, bias, 1.0, 1.0, "linear", name, ("aten.linear.default",))


# =============================================================================================
# Views bound to device memory
# =============================================================================================
def _as3(shape: Sequence[int]) -> tuple[int, int, int]:
    return (1, *shape) if len(shape) == 2 else tuple(shape)  # type: ignore[return-value]


def _device_byte_strides(layout: StickLayout) -> tuple[dict[int, int], int]:
    """Bytes per index step of each non-stick host dim, and bytes per stick of the stick dim."""
    elem, acc = {}, 1
    for d, size in zip(reversed(layout.device_dims), reversed(layout.device_size)):
        elem[d] = acc
        acc *= size
    per_dim = {d: elem[d] * layout.itemsize for d in layout.device_dims if isinstance(d, int)}
    return per_dim, elem["sticks"] * layout.itemsize


@dataclass(frozen=True)
class _Bound:
    """An operand as three role dims (batch, rows, cols) over device bytes. ``lane_dim`` is the role dim
    that runs along sticks (its stride is bytes per stick); stride 0 means broadcast."""

    name: str
    layout: StickLayout
    sizes: tuple[int, int, int]
    strides: tuple[int, int, int]
    lane_dim: int
    base: int

    @property
    def lanes(self) -> int:
        return self.layout.lanes

    @property
    def itemsize(self) -> int:
        return self.layout.itemsize

    def box(self, lo: Sequence[int], n: Sequence[int]) -> tuple[int, list[int], list[int]]:
        """Device offset, loop counts and device strides of the sticks holding box [lo, lo+n). The lane
        dim is the innermost loop (whole sticks); broadcast dims collapse to one iteration."""
        offset, shape, strides = self.base, [], []
        for d in range(3):
            if d == self.lane_dim:
                continue
            if self.strides[d]:
                offset += lo[d] * self.strides[d]
            shape.append(n[d] if self.strides[d] else 1)
            strides.append(self.strides[d])
        L = self.lane_dim
        offset += (lo[L] // self.lanes) * self.strides[L]
        shape.append(-(-n[L] // self.lanes))
        strides.append(self.strides[L])
        return offset, shape, strides

    def dma(self, lo: Sequence[int], n: Sequence[int], sp_offset: int, store: bool = False,
            row_bytes: int | None = None) -> Instruction:
        """Move box [lo, lo+n) between device memory and a row-major scratchpad block (outer dims, then
        the lane dim's sticks); ``row_bytes`` is the block's row pitch when rows are wider than the box
        (a tile buffer sized for the largest tile)."""
        offset, shape, dram = self.box(lo, n)
        sp, acc = [], STICK_BYTES
        for i, size in enumerate(reversed(shape)):
            sp.append(acc)
            acc = row_bytes if i == 0 and row_bytes else acc * size
        sp.reverse()
        # Walk device memory in address order (the smallest stride innermost): consecutive sticks then
        # form one DRAM burst instead of a burst per stick. The scratchpad side keeps its arrangement.
        order = sorted(range(len(shape)), key=lambda i: -dram[i])
        pattern = DmaPattern(tuple(shape[i] for i in order), tuple(dram[i] for i in order), tuple(sp[i] for i in order))
        return (DmaStore if store else DmaLoad)(Addr(self.name, offset), sp_offset, pattern)

    def span(self, lo: Sequence[int], n: Sequence[int]) -> tuple[int, int]:
        offset, shape, strides = self.box(lo, n)
        return offset, offset + sum((s - 1) * st for s, st in zip(shape, strides)) + STICK_BYTES


def _bind(view: TensorView, role: str, want_lane: int, out_shape: tuple[int, int, int] | None = None) -> _Bound:
    """Map a view's dims onto its layout: each view dim walks one host dim (or broadcasts)."""
    lay = view.layout
    if len(view.shape) != len(view.strides):
        raise MatmulSpecError(f"{role} %{view.name}: shape {list(view.shape)} and strides {list(view.strides)} differ in rank")
    shape, strides = list(view.shape), list(view.strides)
    if out_shape is not None:  # the bias: right-align and broadcast to the output
        if len(shape) > 3:
            raise MatmulSpecError(f"bias %{view.name} has rank {len(shape)}; at most 3 (batch, M, N)")
        shape, strides = [1] * (3 - len(shape)) + shape, [0] * (3 - len(strides)) + strides
        for d in range(3):
            if shape[d] not in (1, out_shape[d]):
                raise MatmulSpecError(f"bias %{view.name} of shape {list(view.shape)} does not broadcast to the "
                                      f"output shape {list(out_shape)}")
            if shape[d] == 1 and out_shape[d] != 1:
                shape[d], strides[d] = out_shape[d], 0
    elif len(shape) == 2:
        shape, strides = [1] + shape, [0] + strides
    if len(shape) != 3:
        raise MatmulSpecError(f"{role} %{view.name} has shape {list(view.shape)}; the matmul family takes 2-d or 3-d "
                              "operands (reshape extra batch dims into one)")
    hshape = lay.host_shape if lay.host_shape else (1,)
    if view.offset < 0 or view.offset >= max(lay.numel, 1):
        raise MatmulSpecError(f"{role} %{view.name}: storage offset {view.offset} is outside its {lay.numel}-element buffer")
    coords = [int(c) for c in np.unravel_index(view.offset, hshape)]
    host_of: dict[int, int] = {}
    for d in range(3):
        if shape[d] > 1 and strides[d] != 0:
            host_of[d] = _host_dim(view, role, d, strides[d], shape[d], coords, hshape, set(host_of.values()))
    stick = lay.stick_dim
    lane = next((d for d, h in host_of.items() if h == stick), None)
    if lane is None and shape[want_lane] == 1 and want_lane not in host_of:
        lane, host_of[want_lane] = want_lane, stick  # a size-1 dim can stand for the stick dim
    if lane is None:
        raise MatmulSpecError(f"{role} %{view.name}: no dimension of the view runs along the buffer's stick dimension "
                              f"({lay.describe()}); relayout it first")
    if coords[stick] % lay.lanes:
        raise MatmulSpecError(f"{role} %{view.name}: the view starts at element {coords[stick]} of the stick dimension, "
                              f"not on a stick boundary (multiples of {lay.lanes}); DMA moves whole sticks")
    per_dim, per_stick = _device_byte_strides(lay)
    base = sum(c * per_dim[h] for h, c in enumerate(coords) if h != stick) + (coords[stick] // lay.lanes) * per_stick
    byte_strides = tuple(per_stick if d == lane else (per_dim[host_of[d]] if d in host_of else 0) for d in range(3))
    return _Bound(view.name, lay, tuple(shape), byte_strides, lane, base)  # type: ignore[arg-type]


def _host_dim(view: TensorView, role: str, d: int, stride: int, size: int, coords: list[int],
              hshape: tuple[int, ...], taken: set[int]) -> int:
    hs = view.layout.host_strides
    for h in range(len(hshape)):
        if hs[h] == stride and hshape[h] > 1 and h not in taken and coords[h] + size <= hshape[h]:
            return h
    raise MatmulSpecError(f"{role} %{view.name}: view dim {d} (size {size}, stride {stride}) does not walk one dimension "
                          f"of its buffer {list(hshape)} (host strides {list(hs)}); give the matmul a permuted/sliced view "
                          "or a contiguous copy")


# =============================================================================================
# The checked problem
# =============================================================================================
@dataclass(frozen=True)
class _Problem:
    spec: MatmulSpec
    a: _Bound  # (batch, M, K)
    b: _Bound  # (batch, K, N)
    out: _Bound  # (batch, M, N)
    bias: _Bound | None
    residual: _Bound | None
    batch: int
    M: int
    N: int
    K: int

    @property
    def a_transposed(self) -> bool:  # A sticked on M: loaded as A^T, transposed in scratchpad
        return self.a.lane_dim == 1

    @property
    def b_transposed(self) -> bool:  # B sticked on K (nn.Linear's default weight layout)
        return self.b.lane_dim == 1

    @property
    def b_shared(self) -> bool:  # one B for every batch: batches fold into rows
        return self.b.strides[0] == 0 or self.b.sizes[0] == 1

    @property
    def out_dtype(self) -> str:
        return self.out.layout.device_dtype

    @property
    def n_units(self) -> int:
        return -(-self.N // UNIT)

    @property
    def k_units(self) -> int:
        return -(-self.K // UNIT)

    @property
    def needs_epilogue(self) -> bool:
        return bool(self.epilogue_steps) or self.out_dtype != F32

    @property
    def epilogue_steps(self) -> list[str]:
        """The fp32 vector ops between the accumulator and the output, in order."""
        spec, steps = self.spec, []
        if self.bias is not None:
            steps += (["mul"] if spec.beta != 1.0 else []) + ["fma"]
        elif spec.alpha != 1.0:
            steps.append("mul")
        if spec.activation:
            steps.append(spec.activation)
        if self.residual is not None:
            steps.append("add")
        return steps

    def describe(self) -> str:
        b = f"{self.batch}x" if self.batch > 1 else ""
        return f"{self.spec.kind} {b}{self.M}x{self.K}x{self.N} (batch x M x K x N)"


def _check(spec: MatmulSpec) -> _Problem:
    if spec.kind not in KINDS:
        raise MatmulSpecError(f"unknown matmul kind {spec.kind!r}; known: {', '.join(KINDS)}")
    for role, v in (("a", spec.a), ("b", spec.b)):
        if v.layout.device_dtype not in INPUT_DTYPES:
            raise MatmulSpecError(f"{role} %{v.name} is {v.layout.device_dtype}: the PE arrays multiply fp16/bf16 "
                                  f"(stored as {DL}); cast it to fp16 first")
    if spec.out.layout.device_dtype not in OUTPUT_DTYPES:
        raise MatmulSpecError(f"out %{spec.out.name} is {spec.out.layout.device_dtype}; the matmul writes "
                              f"{' or '.join(OUTPUT_DTYPES)} (fp16/bf16 or fp32)")
    a, b, o = (_as3(v.shape) if len(v.shape) in (2, 3) else None for v in (spec.a, spec.b, spec.out))
    if a is None or b is None or o is None:
        raise MatmulSpecError(f"{spec.kind}: operands must be 2-d or 3-d, got a{list(spec.a.shape)} "
                              f"b{list(spec.b.shape)} out{list(spec.out.shape)}")
    batch = max(a[0], b[0])
    if a[2] != b[1] or a[0] not in (1, batch) or b[0] not in (1, batch) or o != (batch, a[1], b[2]):
        raise MatmulSpecError(f"{spec.kind}: shapes do not agree: a{list(spec.a.shape)} @ b{list(spec.b.shape)} -> "
                              f"out{list(spec.out.shape)}; need a[batch, M, K], b[batch, K, N], out[batch, M, N]")
    if min(o) == 0 or a[2] == 0:
        raise MatmulSpecError(f"{spec.kind}: empty matmul a{list(spec.a.shape)} @ b{list(spec.b.shape)}")
    A, B = _bind(spec.a, "a", 2), _bind(spec.b, "b", 2)
    A = _broadcast_batch(A, batch)
    B = _broadcast_batch(B, batch)
    O = _bind(spec.out, "out", 2)
    if O.lane_dim != 2:
        raise MatmulSpecError(f"out %{spec.out.name} must be sticked on N (its last dim); it is sticked on view dim "
                              f"{O.lane_dim}: give the output the layout preferred_layouts() names")
    if any(O.strides[d] == 0 and O.sizes[d] > 1 for d in (0, 1)):
        raise MatmulSpecError(f"out %{spec.out.name} has a broadcast (stride 0) dimension: results would overlap")
    _check_out_sticks(spec.out, O)
    bias, residual = (_bind_addend(v, role, (batch, a[1], b[2])) for v, role in ((spec.bias, "bias"), (spec.residual, "residual")))
    if spec.activation is not None and spec.activation not in ACTIVATIONS:
        raise MatmulSpecError(f"activation {spec.activation!r} is not a vector-unit op; known: {', '.join(sorted(ACTIVATIONS))}")
    for role, bound, want in (("a", A, (2, 1)), ("b", B, (2, 1))):
        if bound.lane_dim not in want:
            raise MatmulSpecError(f"{role} %{bound.name}: sticked on its batch dim; relayout it first")
    return _Problem(spec, A, B, O, bias, residual, batch, a[1], b[2], a[2])


def _bind_addend(view: TensorView | None, role: str, out_shape: tuple[int, int, int]) -> _Bound | None:
    """A bias or residual: broadcast to the output, sticked on N, fp16/bf16 or fp32."""
    if view is None:
        return None
    if view.layout.device_dtype not in OUTPUT_DTYPES:
        raise MatmulSpecError(f"{role} %{view.name} is {view.layout.device_dtype}; use fp16/bf16 or fp32")
    bound = _bind(view, role, 2, out_shape)
    if bound.lane_dim != 2:
        raise MatmulSpecError(f"{role} %{view.name} must vary along N in sticks (sticked on its last dim)")
    return bound


def _broadcast_batch(x: _Bound, batch: int) -> _Bound:
    if x.sizes[0] == batch:
        return x
    return replace(x, sizes=(batch, *x.sizes[1:]), strides=(0, *x.strides[1:]))


def _check_out_sticks(view: TensorView, out: _Bound) -> None:
    """Whole-stick stores must not clobber elements outside the view."""
    lay = view.layout
    coords = np.unravel_index(view.offset, lay.host_shape if lay.host_shape else (1,))
    end = int(coords[lay.stick_dim]) + out.sizes[2]
    if end % lay.lanes and end != lay.host_shape[lay.stick_dim]:
        raise MatmulSpecError(f"out %{view.name}: the view ends at element {end} of the stick dimension, inside a "
                              f"stick shared with elements outside the view; whole-stick stores would overwrite them")


# =============================================================================================
# Plans: a work division and tiles
# =============================================================================================
@dataclass(frozen=True)
class Split:
    """Cores along batch, M (rows), N (sticks) and K (partners summing partial results)."""

    batch: int
    m: int
    n: int
    k: int

    @property
    def cores(self) -> int:
        return self.batch * self.m * self.n * self.k

    def __str__(self) -> str:
        return f"b{self.batch} m{self.m} n{self.n} k{self.k}"


@dataclass(frozen=True)
class Tiles:
    """Per core: ``bt`` batches x ``mt`` rows per A tile, ``nt`` and ``kt`` sticks (of 64) per B tile;
    ``a_resident``: the core's whole A slice stays in scratchpad across N tiles."""

    bt: int
    mt: int
    nt: int
    kt: int
    a_resident: bool
    network: str = ""  # where K-split partial sums travel: "reduce" or "data" ring ("" without a K-split)
    # Two accumulators let one N tile's epilogue run behind the next tile's matmuls; one accumulator
    # halves that space for wider N tiles (less A traffic) at the cost of a serial epilogue per tile.
    acc_double: bool = True

    def __str__(self) -> str:
        res = ", A resident" if self.a_resident else ""
        rows = f"{self.bt}x{self.mt}" if self.bt > 1 else f"{self.mt}"
        net = f", sums over the {self.network} ring" if self.network else ""
        acc = "" if self.acc_double else ", one accumulator"
        return f"M {rows} rows, N {self.nt} sticks, K {self.kt} sticks{res}{net}{acc}"


def _chunks(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """[start, size) of ``parts`` nearly equal pieces in multiples of ``align`` (the last may be short)."""
    step = -(-(-(-total // parts)) // align) * align
    out, s = [], 0
    while s < total:
        out.append((s, min(step, total - s)))
        s += step
    return out


@dataclass(frozen=True)
class _CoreWork:
    core: int
    batches: tuple[int, int]  # [start, count)
    rows: tuple[int, int]  # M
    ncols: tuple[int, int]  # N elements
    kcols: tuple[int, int]  # K elements
    partner: int  # index among K-split partners
    group: tuple[int, ...]  # the partners' cores, in ring order


def _row_align(p: _Problem) -> int:
    return p.a.lanes if p.a_transposed else 1


def _assign(p: _Problem, s: Split, cfg: CardConfig) -> list[_CoreWork] | None:
    """Core -> its box; None if a split leaves a core without work. K-split partners sit on adjacent
    ring stops, in partner order."""
    bs = _chunks(p.batch, s.batch)
    ms = _chunks(p.M, s.m, _row_align(p))
    ns = [(a * UNIT, min(n * UNIT, p.N - a * UNIT)) for a, n in _chunks(p.n_units, s.n)]
    ks = [(a * UNIT, min(n * UNIT, p.K - a * UNIT)) for a, n in _chunks(p.k_units, s.k)]
    if (len(bs), len(ms), len(ns), len(ks)) != (s.batch, s.m, s.n, s.k):
        return None
    starts = _group_starts(s.cores // s.k, s.k, cfg.num_cores, cfg.memory_ring_stop)
    work, g = [], 0
    for b in bs:
        for m in ms:
            for n in ns:
                group = tuple((starts[g] + q) % cfg.num_cores for q in range(s.k))
                work += [_CoreWork(group[q], b, m, n, k, q, group) for q, k in enumerate(ks)]
                g += 1
    return work


def _group_starts(groups: int, k: int, n: int, mem: int) -> list[int]:
    """First ring stop of each group of k partners. DRAM traffic leaves the memory stop in both ring
    directions, one link each way: groups alternate between the two sides of the memory stop, so a
    kernel on fewer cores than the card has loads both links instead of queueing on one."""
    starts, up, down = [], mem, mem
    for g in range(groups):
        if g % 2 == 0:
            starts.append(up % n)
            up += k
        else:
            down -= k
            starts.append(down % n)
    return starts


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factors(extent: int, cores: int) -> list[int]:
    """Ways to cut one dimension: divisors of the card's core count (the usual, even divisions) and of
    the extent itself (12 heads on 12 or 24 cores), never more pieces than the extent has."""
    return sorted({d for d in _divisors(cores) + _divisors(extent) if d <= min(extent, cores)})


def _splits(p: _Problem, cfg: CardConfig) -> list[Split]:
    """Every split over at most the card's cores that gives each core work."""
    n, out = cfg.num_cores, []
    for pb in _factors(p.batch, n):
        for pm in _factors(p.M, n // pb):
            for pn in _factors(p.n_units, n // pb // pm):
                for pk in _factors(p.k_units, n // pb // pm // pn):
                    s = Split(pb, pm, pn, pk)
                    if _assign(p, s, cfg) is not None:
                        out.append(s)
    return out


# =============================================================================================
# Scratchpad buffers of one core
# =============================================================================================
@dataclass(frozen=True)
class _Shape:
    """The sizes one core works with (its largest box)."""

    groups: int  # passes over B: batches one by one, or one pass when B is shared
    group_rows: int  # rows per pass (batches x M when B is shared)
    kt_el: int
    nt_el: int
    tile_rows: int
    chunk_rows: int
    n_tiles: int
    k_tiles: int
    row_tiles: int
    recv_slots: int = 0


def _core_shape(p: _Problem, s: Split, t: Tiles, w: _CoreWork) -> _Shape:
    nb, nm = w.batches[1], w.rows[1]
    groups, group_rows = (1, nb * nm) if p.b_shared else (nb, nm)
    tile_rows = t.bt * t.mt
    row_tiles = (-(-nb // t.bt) if p.b_shared else 1) * -(-nm // t.mt)
    chunk_rows = _chunk_rows(t, s)
    slots = 0
    if s.k > 1:
        rts = _row_tiles(p, t, w, None if p.b_shared else w.batches[0])
        slots = 2 * -(-len(_epilogue_chunks(rts, chunk_rows)) // 2)
    return _Shape(groups, group_rows, t.kt * UNIT, t.nt * UNIT, tile_rows, chunk_rows,
                  -(-w.ncols[1] // (t.nt * UNIT)), -(-w.kcols[1] // (t.kt * UNIT)), row_tiles, slots)


def _chunk_rows(t: Tiles, s: Split) -> int:
    """Rows per epilogue chunk: with a K-split, smaller chunks pipeline the partial-sum chain."""
    if s.k == 1:
        return t.mt
    return max(64, -(-t.mt // (2 * s.k)))


def _buffers(p: _Problem, s: Split, t: Tiles, sh: _Shape) -> list[SpBuffer]:
    """Every scratchpad buffer one core needs. All live for the whole kernel (the loops reuse them)."""
    rows, kt, nt = sh.tile_rows, sh.kt_el, sh.nt_el
    bufs = []
    if t.a_resident:
        bufs.append(SpBuffer("a", sh.row_tiles * sh.k_tiles * rows * kt * 2))
    else:
        bufs += [SpBuffer(f"a{i}", rows * kt * 2) for i in range(2)]
    if p.a_transposed:
        bufs += [SpBuffer(f"a_t{i}", t.bt * kt * _round(t.mt, p.a.lanes) * 2) for i in range(2)]
    bufs += [SpBuffer(f"b{i}", kt * nt * 2) for i in range(2)]
    if p.b_transposed:
        bufs += [SpBuffer(f"b_t{i}", nt * kt * 2) for i in range(2)]
    n_acc = 2 if t.acc_double and sh.n_tiles * sh.groups > 1 else 1
    bufs += [SpBuffer(f"acc{i}", sh.row_tiles * rows * nt * 4) for i in range(n_acc)]
    chunk = sh.chunk_rows if s.k > 1 else rows
    if p.needs_epilogue:
        bufs += [SpBuffer(f"o{i}", chunk * nt * p.out.itemsize) for i in range(2)]
    if p.bias is not None:
        bufs += [SpBuffer(f"bias{i}", chunk * nt * p.bias.itemsize) for i in range(2)]
        if p.spec.beta != 1.0:
            bufs.append(SpBuffer("bias_scaled", chunk * nt * 4))
    if p.residual is not None:
        bufs += [SpBuffer(f"res{i}", chunk * nt * p.residual.itemsize) for i in range(2)]
    if s.k > 1:  # receive slots from the upstream neighbour of each direction
        bufs += [SpBuffer(f"recv{d}", sh.recv_slots * chunk * nt * 4) for d in range(2)]
    return bufs


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def _fits(p: _Problem, s: Split, t: Tiles, sh: _Shape, cfg: CardConfig) -> bool:
    need = sum(b.aligned_bytes for b in _buffers(p, s, t, sh))
    return need <= cfg.scratchpad_plannable_bytes


# =============================================================================================
# The analytic cost model
# =============================================================================================
@dataclass
class Estimate:
    total_s: float
    parts: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"total_us": round(self.total_s * 1e6, 2), **{k: round(v * 1e6, 2) for k, v in self.parts.items()}}


def _matmul_cycles(cfg: CardConfig, rows: int, k: int, n: int) -> int:
    return costs.pe_matmul_cycles(cfg, rows, k, n)


def _vector_cycles(cfg: CardConfig, elements: int, itemsize: int) -> int:
    return costs.vector_cycles(cfg, elements, itemsize)


def _counted(sizes: list[int]) -> list[tuple[int, int]]:
    """Distinct sizes with how often they occur (tiles are all full but the last)."""
    out: dict[int, int] = {}
    for x in sizes:
        out[x] = out.get(x, 0) + 1
    return list(out.items())


def _pieces(total: int, step: int) -> list[int]:
    return [min(step, total - s) for s in range(0, total, step)]


@dataclass
class _SplitTraffic:
    """The DRAM and ring traffic of a split that does not depend on the tiles: per core, bytes of A (to be
    multiplied by how often A is reloaded), other reads and writes; per ring link, the same summed over
    the cores whose DRAM traffic crosses it, and how many K-split neighbour pairs it joins."""

    work: list[_CoreWork]
    a: list[int]
    other_reads: list[int]
    writes: list[int]
    link_a: dict[tuple, int]
    link_other: dict[tuple, int]
    chain_pairs: dict[tuple, int]


def _split_traffic(p: _Problem, s: Split, cfg: CardConfig) -> _SplitTraffic:
    work = _assign(p, s, cfg)
    assert work is not None
    a, other, writes = [], [], []
    for w in work:
        ab, ob, wb = _core_dram_bytes(p, s, w)
        a.append(ab), other.append(ob), writes.append(wb)
    n, mem = cfg.num_cores, cfg.memory_ring_stop
    link_a: dict[tuple, int] = {}
    link_other: dict[tuple, int] = {}
    pairs: dict[tuple, int] = {}
    for i, w in enumerate(work):
        for l in costs.ring_path(mem, w.core, n):
            link_a[l] = link_a.get(l, 0) + a[i]
            link_other[l] = link_other.get(l, 0) + other[i]
        for l in costs.ring_path(w.core, mem, n):
            link_other[l] = link_other.get(l, 0) + writes[i]
        if w.partner < s.k - 1:
            nxt = w.group[w.partner + 1]
            for l in costs.ring_path(w.core, nxt, n) + costs.ring_path(nxt, w.core, n):
                pairs[l] = pairs.get(l, 0) + 1
    return _SplitTraffic(work, a, other, writes, link_a, link_other, pairs)


def estimate(p: _Problem, s: Split, t: Tiles, cfg: CardConfig, traffic: _SplitTraffic | None = None) -> Estimate:
    """Seconds for plan (s, t): fixed cost + pipeline fill + busy time + drain + exposed latency. Busy
    time combines compute (PE arrays, vector unit of the busiest core) and data movement (its DMA
    channels, the shared DRAM, the busiest ring link)."""
    tr = traffic or _split_traffic(p, s, cfg)
    sh = _core_shape(p, s, t, tr.work[0])  # the first core has the largest box
    steady = {"pe": _pe_seconds(p, t, sh, tr.work[0], cfg), "vector": _vector_seconds(p, s, t, sh, tr.work[0], cfg),
              **_memory_seconds(p, s, t, sh, tr, cfg)}
    fill, drain = _fill_seconds(sh, len(tr.work), cfg), _drain_seconds(p, s, t, sh, len(tr.work), cfg)
    exposed = _exposed_latency(p, t, sh, cfg, steady["pe"])
    tiles = sh.n_tiles * (1 if p.b_shared else sh.groups)
    if not t.acc_double and tiles > 1:
        exposed += (tiles - 1) * drain  # each tile's epilogue now runs alone, like the last one's
    compute = max(steady["pe"], steady["vector"])
    memory = max(steady["dma_core"], steady["dram"], steady["ring"])
    # Two double-buffered sides never overlap perfectly: a share of the shorter one shows.
    busy = max(compute, memory) + OVERLAP_LOSS * min(compute, memory)
    total = cfg.kernel_fixed_cost_s + fill + busy + drain + exposed
    return Estimate(total, {**steady, "fill": fill, "drain": drain, "exposed_latency": exposed})


def _pe_seconds(p: _Problem, t: Tiles, sh: _Shape, w: _CoreWork, cfg: CardConfig) -> float:
    """The core's matmuls at the PE arrays' rate (summed over the distinct tile sizes)."""
    rows = _counted(_row_pieces(p, t, w))
    kp, np_ = _counted(_pieces(w.kcols[1], sh.kt_el)), _counted(_pieces(w.ncols[1], sh.nt_el))
    per_pass = sum(_matmul_cycles(cfg, r, k, n) * cr * ck * cn for r, cr in rows for k, ck in kp for n, cn in np_)
    return per_pass * (1 if p.b_shared else sh.groups) / cfg.clock_hz


def _vector_seconds(p: _Problem, s: Split, t: Tiles, sh: _Shape, w: _CoreWork, cfg: CardConfig) -> float:
    """Epilogue ops (fp32), K-split adds and in-scratchpad transposes of the core."""
    elems_out = sh.group_rows * w.ncols[1] * (1 if p.b_shared else sh.groups)
    vec = 0
    for op in p.epilogue_steps or (["cast"] if p.needs_epilogue else []):
        slow = 1 + cfg.vector_transcendental_cycles if op in TRANSCENDENTAL_OPS else 1
        vec += _vector_cycles(cfg, elems_out, 4) * slow
    if s.k > 1:
        vec += _vector_cycles(cfg, elems_out, 4)  # one add of a partner's partial per element
    if p.b_transposed:
        vec += _vector_cycles(cfg, sh.groups * w.kcols[1] * w.ncols[1], 2)
    if p.a_transposed:
        a_reload = 1 if t.a_resident else sh.n_tiles
        vec += _vector_cycles(cfg, w.batches[1] * w.rows[1] * w.kcols[1] * a_reload, 2)
    return vec / cfg.clock_hz


def _memory_seconds(p: _Problem, s: Split, t: Tiles, sh: _Shape, tr: _SplitTraffic, cfg: CardConfig) -> dict[str, float]:
    """The busiest core's DMA channel, the shared LPDDR5 (with read/write turnaround), and the busiest
    ring link (DRAM traffic to and from the memory stop, plus K-split partial sums)."""
    a_reload = 1 if t.a_resident else sh.n_tiles
    reads = [a * a_reload + o for a, o in zip(tr.a, tr.other_reads)]
    dma_core = max(max(reads), max(tr.writes)) / (cfg.dma_bytes_per_cycle * cfg.clock_hz)
    dram = sum(reads) / cfg.dram_read_bandwidth + sum(tr.writes) / cfg.dram_write_bandwidth
    dram += _turnaround(p, t, sh, tr, reads, cfg)
    link_bw = _chain_link_bandwidth(t, cfg)
    half = sh.group_rows * _round(tr.work[0].ncols[1], UNIT) * 4 * (1 if p.b_shared else sh.groups) / 2
    load = {l: tr.link_a.get(l, 0) * a_reload + tr.link_other.get(l, 0) for l in set(tr.link_a) | set(tr.link_other)}
    ring = max(load.values(), default=0) / cfg.ring_link_bandwidth
    if s.k > 1:  # chunks alternate direction: half the partial sums cross each link each way
        if t.network == "data":
            ring = max([ring] + [(load.get(l, 0) + c * half) / link_bw for l, c in tr.chain_pairs.items()])
        else:
            ring = max(ring, max(c * half for c in tr.chain_pairs.values()) / link_bw)
    return {"dma_core": dma_core, "dram": dram, "ring": ring}


def _chain_link_bandwidth(t: Tiles, cfg: CardConfig) -> float:
    if t.network == "reduce":
        return cfg.reduction_ring_bytes_per_cycle * cfg.clock_hz * cfg.ring_efficiency
    return cfg.ring_link_bandwidth


def _fill_seconds(sh: _Shape, cores: int, cfg: CardConfig) -> float:
    """The first A and B tiles load before any PE work, every core at once over the shared DRAM."""
    first = (sh.tile_rows * sh.kt_el + sh.kt_el * sh.nt_el) * 2
    return cfg.dram_latency_s + max(first / (cfg.dma_bytes_per_cycle * cfg.clock_hz), first * cores / cfg.dram_read_bandwidth)


def _drain_seconds(p: _Problem, s: Split, t: Tiles, sh: _Shape, cores: int, cfg: CardConfig) -> float:
    """The last N tile's epilogue cannot hide behind matmuls: its vector work, stores and K-split chain."""
    clock, link_bw = cfg.clock_hz, _chain_link_bandwidth(t, cfg)
    tail = sh.group_rows * sh.nt_el
    storing = cores if s.k == 1 else 2 * cores // s.k
    out_bytes = tail * p.out.itemsize / (1 if s.k == 1 else 2)
    drain = cfg.dram_latency_s + max(out_bytes / (cfg.dma_bytes_per_cycle * clock), out_bytes * storing / cfg.dram_write_bandwidth)
    drain += _vector_cycles(cfg, tail, 4) * (2 if s.k > 1 else 1) / clock
    if s.k > 1:
        chunk = min(sh.chunk_rows, sh.group_rows) * sh.nt_el
        drain += (s.k - 1) * (chunk * 4 / link_bw + _vector_cycles(cfg, chunk, 4) / clock)
        drain += max(0, tail - chunk) * 4 / link_bw / 2
    return drain


def _turnaround(p: _Problem, t: Tiles, sh: _Shape, tr: _SplitTraffic, reads: list[int], cfg: CardConfig) -> float:
    """LPDDR5 read/write turnaround: the stores of every N tile but the last run while later tiles load
    (all but the first tile's loads); interleaved, each of those bytes loses the mixed-traffic efficiency."""
    tiles = sh.n_tiles * (1 if p.b_shared else sh.groups)
    if tiles < 2:
        return 0.0
    first = sum(tr.a) if t.a_resident else 0  # a resident A is loaded with the first tile
    r = (sum(reads) - first) * (tiles - 1) / tiles
    w = sum(tr.writes) * (tiles - 1) / tiles
    t_r, t_w = 1 / cfg.dram_read_bandwidth, 1 / cfg.dram_write_bandwidth
    t_turn = max(0.0, 2 / (cfg.dram_peak_bandwidth * cfg.dram_mixed_efficiency) - t_r - t_w)
    # Only part of that traffic is in flight at the same moment (loads run ahead of the stores).
    return t_turn * r * w / (r + w) if r + w else 0.0


def _exposed_latency(p: _Problem, t: Tiles, sh: _Shape, cfg: CardConfig, pe_s: float) -> float:
    """DMA latency the double buffering cannot hide: a load issued behind a matmul shorter than the
    DRAM latency leaves the PE arrays waiting for the difference. (The throughput terms above do not
    see latency; this is what stops the model from preferring tiny tiles whenever PE is not the bound.)"""
    passes = sh.groups if not p.b_shared else 1
    matmuls = sh.row_tiles * sh.k_tiles * sh.n_tiles * passes
    loads = matmuls // sh.n_tiles * (1 if t.a_resident else sh.n_tiles) + sh.k_tiles * sh.n_tiles * passes
    per_matmul = pe_s / max(1, matmuls)
    return loads * max(0.0, cfg.dram_latency_s - per_matmul)


def _row_pieces(p: _Problem, t: Tiles, w: _CoreWork) -> list[int]:
    """Rows of each A tile one core streams per (K tile, N tile) pass."""
    ms = _pieces(w.rows[1], t.mt)
    if p.b_shared:
        bs = _pieces(w.batches[1], t.bt)
        return [b * m for b in bs for m in ms]
    return ms


def _core_dram_bytes(p: _Problem, s: Split, w: _CoreWork) -> tuple[int, int, int]:
    """Bytes one core moves (whole sticks): A read once, B and bias reads, output writes."""
    nb, nm = w.batches[1], w.rows[1]
    k_el, n_el = w.kcols[1], w.ncols[1]
    groups = 1 if p.b_shared else nb
    if p.a_transposed:
        a = nb * k_el * _round(nm, p.a.lanes) * 2
    else:
        a = nb * nm * _round(k_el, UNIT) * 2
    if p.b_transposed:
        b = groups * n_el * _round(k_el, UNIT) * 2
    else:
        b = groups * k_el * _round(n_el, p.b.lanes) * 2
    stores = w.partner in (0, s.k - 1)
    share = 1.0 if s.k == 1 else 0.5  # the two ends of a chain each finish half the chunks
    out = nb * nm * _round(n_el, p.out.lanes) * p.out.itemsize * share if stores else 0
    addends = 0.0
    for x in (p.bias, p.residual):
        if x is not None and stores:
            rows = (nb if x.strides[0] else 1) * (nm if x.strides[1] else 1)
            addends += rows * _round(n_el, x.lanes) * x.itemsize * share
    return a, b + int(addends), int(out)


# =============================================================================================
# Choosing the plan
# =============================================================================================
def _tile_options(total: int, limit: int = 12) -> list[int]:
    """Tile sizes worth trying for ``total`` units: equal pieces (largest first)."""
    out = sorted({-(-total // d) for d in range(1, total + 1)}, reverse=True)
    return out[:limit]


def _candidate_tiles(p: _Problem, s: Split, cfg: CardConfig) -> Iterable[Tiles]:
    work = _assign(p, s, cfg)
    w = work[0]
    nb, nm = w.batches[1], w.rows[1]
    ku, nu = -(-w.kcols[1] // UNIT), -(-w.ncols[1] // UNIT)
    align = _row_align(p)
    mts = sorted({_round(-(-nm // d), align) for d in (1, 2, 3, 4, 6, 8, 12, 16)} | {min(nm, 64)}, reverse=True)
    bts = _tile_options(nb, 4) if p.b_shared else [1]
    networks = ("reduce", "data") if s.k > 1 else ("",)
    for nt in _tile_options(nu, 6):
        for kt in _tile_options(ku, 6):
            for mt in mts:
                for bt in bts:
                    if bt > 1 and mt < nm:
                        continue  # several batches per tile only with every row of each
                    for res in (True, False):
                        if res and -(-nu // nt) == 1 and -(-ku // kt) == 1:
                            continue  # nothing to reuse
                        for net in networks:
                            yield Tiles(bt, mt, nt, kt, res, net)
                            if -(-nu // nt) > 1:
                                yield Tiles(bt, mt, nt, kt, res, net, acc_double=False)


@dataclass
class Plan:
    """A work division, its tiles and the cost model's estimate."""

    split: Split
    tiles: Tiles
    est: Estimate


def _best_tiles(p: _Problem, s: Split, cfg: CardConfig) -> Plan | None:
    """The cheapest tiles for split ``s`` that fit the scratchpad. Estimates within 1 % of the best count
    as a tie, settled by the fewest instructions (a smaller program, faster to prepare and simulate)."""
    traffic = _split_traffic(p, s, cfg)
    w = traffic.work[0]
    scored = []
    for t in _candidate_tiles(p, s, cfg):
        sh = _core_shape(p, s, t, w)
        if not t.acc_double and _fits(p, s, replace(t, acc_double=True), sh, cfg):
            continue  # one accumulator only pays when two do not fit
        if _fits(p, s, t, sh, cfg):
            scored.append((estimate(p, s, t, cfg, traffic), _instructions(sh), t))
    if not scored:
        return None
    best = min(e.total_s for e, _, _ in scored)
    e, _, t = min((c for c in scored if c[0].total_s <= 1.01 * best), key=lambda c: (c[1], c[0].total_s))
    return Plan(s, t, e)


def _instructions(sh: _Shape) -> int:
    """Matmul and load instructions of the busiest core (the bulk of its program)."""
    return sh.groups * sh.n_tiles * sh.k_tiles * (2 * sh.row_tiles + 1)


def _span_ok(p: _Problem, s: Split, cfg: CardConfig) -> bool:
    return max(_core_span(p, w) for w in _assign(p, s, cfg)) <= cfg.core_address_span_bytes


def _core_span(p: _Problem, w: _CoreWork) -> int:
    """Device bytes one core addresses (the sum over operands of max - min), as validate counts it."""
    (b0, nb), (m0, nm), (n0, nn), (k0, nk) = w.batches, w.rows, w.ncols, w.kcols
    boxes = [(p.a, (b0, m0, k0), (nb, nm, nk)), (p.b, (b0, k0, n0), (nb, nk, nn))]
    boxes += [(x, (b0, m0, n0), (nb, nm, nn)) for x in (p.out, p.bias, p.residual) if x is not None]
    total = 0
    for bound, lo, n in boxes:
        start, end = bound.span(lo, n)
        total += end - start
    return total


def rank_plans(spec: MatmulSpec, config: CardConfig, top: int | None = None) -> list[Plan]:
    """Every feasible split with its best tiles, cheapest estimate first."""
    p = _check(spec)
    choices, over_span = [], 0
    for s in _splits(p, config):
        if not _span_ok(p, s, config):
            over_span += 1
            continue
        c = _best_tiles(p, s, config)
        if c is not None:
            choices.append(c)
    if not choices:
        if over_span:
            raise MatmulSpecError(
                f"{p.describe()}: every work division leaves some core addressing more than "
                f"config.core_address_span_bytes = {config.core_address_span_bytes} bytes of device memory "
                f"(a: {p.a.layout.nbytes} B, b: {p.b.layout.nbytes} B, out: {p.out.layout.nbytes} B); "
                "split the matmul into several kernels")
        raise MatmulSpecError(f"{p.describe()}: no tiling fits {config.scratchpad_plannable_bytes} plannable "
                              "scratchpad bytes per core")
    choices.sort(key=lambda c: c.est.total_s)
    return choices[:top] if top else choices


# =============================================================================================
# Program generation
# =============================================================================================
def _row_tiles(p: _Problem, t: Tiles, w: _CoreWork, batch: int | None) -> list[tuple[int, int, int, int, int]]:
    """(batch0, nb, m0, nm, row offset in the accumulator) for each A tile of one pass over B."""
    out, r = [], 0
    bs = _chunks(w.batches[1], -(-w.batches[1] // t.bt)) if batch is None else [(batch - w.batches[0], 1)]
    for b0, nb in bs:
        for m0, nm in _chunks(w.rows[1], -(-w.rows[1] // t.mt), _row_align(p)):
            out.append((w.batches[0] + b0, nb, w.rows[0] + m0, nm, r))
            r += nb * nm
    return out


def _epilogue_chunks(rts, chunk_rows: int) -> list[tuple[int, int, int, int, int, int]]:
    """Epilogue chunks (batch0, nb, m0, nm, acc row, chain direction), at most ``chunk_rows`` rows each and
    contiguous in the accumulator; K-split partners list the same chunks."""
    out = []
    for b0, nb, m0, nm, r in rts:
        if nb > 1 and nm <= chunk_rows:
            per = max(1, chunk_rows // nm)
            for bb, cnt in _chunks(nb, -(-nb // per)):
                out.append((b0 + bb, cnt, m0, nm, r + bb * nm))
        else:
            for bb in range(nb):
                for mm, cnt in _chunks(nm, -(-nm // chunk_rows)):
                    out.append((b0 + bb, 1, m0 + mm, cnt, r + bb * nm + mm))
    return [(*c, i % 2) for i, c in enumerate(out)]


class _Emitter:
    """Instructions of one core."""

    def __init__(self, p: _Problem, s: Split, t: Tiles, w: _CoreWork, offsets: dict[str, int], cfg: CardConfig,
                 slots: "_Slots | None" = None):
        self.p, self.s, self.t, self.w, self.off, self.cfg, self.slots = p, s, t, w, offsets, cfg, slots
        self.sh = _core_shape(p, s, t, w)
        self.ins: list[Instruction] = []
        self.toggles: dict[str, int] = {}

    def buf(self, name: str) -> int:
        """Alternate between name0 and name1 (double buffering)."""
        if name + "0" not in self.off:
            return self.off[name]
        i = self.toggles.get(name, 0)
        self.toggles[name] = i ^ 1
        return self.off[f"{name}{i}"] if f"{name}{i}" in self.off else self.off[f"{name}0"]

    def row_tiles(self, batch: int | None) -> list[tuple[int, int, int, int, int]]:
        return _row_tiles(self.p, self.t, self.w, batch)

    def run(self) -> list[Instruction]:
        passes = [None] if self.p.b_shared else list(range(self.w.batches[0], sum(self.w.batches)))
        n_tiles = [(self.w.ncols[0] + a, n) for a, n in _chunks_el(self.w.ncols[1], self.sh.nt_el)]
        k_tiles = [(self.w.kcols[0] + a, n) for a, n in _chunks_el(self.w.kcols[1], self.sh.kt_el)]
        pending = None
        for batch in passes:
            rts = self.row_tiles(batch)
            resident: dict[tuple[int, int], int] = {}
            for n0, nn in n_tiles:
                acc = self.buf("acc")
                self.zero_acc_pad(acc, rts, nn)
                for kk, (k0, kn) in enumerate(k_tiles):
                    b_off = self.load_b(batch, k0, kn, n0, nn)
                    for i, rt in enumerate(rts):
                        a_off = self.load_a(rt, kk, k0, kn, i, resident)
                        self.matmul(acc, rt, a_off, b_off, kn, nn, kk > 0)
                if pending is not None:  # the previous tile's epilogue runs behind these matmuls
                    self.epilogue(*pending)
                pending = (acc, rts, n0, nn)
                if "acc1" not in self.off:  # one accumulator: its epilogue must finish before reuse
                    self.epilogue(*pending)
                    pending = None
        if pending is not None:
            self.epilogue(*pending)
        return self.ins

    # --- loads -----------------------------------------------------------------------------------
    def load_b(self, batch: int | None, k0: int, kn: int, n0: int, nn: int) -> int:
        p, dst = self.p, self.buf("b")
        bb = 0 if batch is None else batch
        nt = _round(nn, UNIT)
        if not p.b_transposed:  # [K rows, N sticks]: the PE arrays' order
            self.ins.append(p.b.dma((bb, k0, n0), (1, kn, nn), dst, row_bytes=nt * 2))
            return dst
        stage, kt = self.buf("b_t"), _round(kn, p.b.lanes)
        self.ins.append(p.b.dma((bb, k0, n0), (1, kn, nn), stage))  # [N rows, K sticks]
        self.ins.append(Elementwise("copy", SpTensor(dst, DL, (kn, nn), (nt, 1)),
                                    (SpTensor(stage, DL, (kn, nn), (1, kt)),)))
        return dst

    def load_a(self, rt, kk: int, k0: int, kn: int, i: int, resident: dict) -> int:
        p, t = self.p, self.t
        b0, nb, m0, nm, _ = rt
        kt = self.sh.kt_el
        if t.a_resident:
            key = (i, kk)
            if key in resident:
                return resident[key]
            dst = self.off["a"] + (kk * self.sh.row_tiles + i) * self.sh.tile_rows * kt * 2
            resident[key] = dst
        else:
            dst = self.buf("a")
        if not p.a_transposed:
            self.ins.append(p.a.dma((b0, m0, k0), (nb, nm, kn), dst, row_bytes=kt * 2))  # [rows, K sticks]
            return dst
        stage, ms = self.buf("a_t"), _round(nm, p.a.lanes)
        self.ins.append(p.a.dma((b0, m0, k0), (nb, nm, kn), stage))  # [batch, K rows, M sticks]
        self.ins.append(Elementwise("copy", SpTensor(dst, DL, (nb, nm, kn), (nm * kt, kt, 1)),
                                    (SpTensor(stage, DL, (nb, nm, kn), (kn * ms, 1, ms)),)))
        return dst

    def zero_acc_pad(self, acc: int, rts, nn: int) -> None:
        """Columns past N in the last stick are never computed; zero them so whole sticks can move."""
        nt = _round(nn, UNIT)
        if nt == nn:
            return
        rows = sum(nb * nm for _, nb, _, nm, _ in rts)
        self.ins.append(Elementwise("copy", SpTensor(acc + nn * 4, F32, (rows, nt - nn), (nt, 1)), (Scalar(0.0),)))

    def matmul(self, acc: int, rt, a_off: int, b_off: int, kn: int, nn: int, accumulate: bool) -> None:
        _, nb, _, nm, r = rt
        nt, kt = _round(nn, UNIT), self.sh.kt_el
        rows = nb * nm
        self.ins.append(MatMul(SpTensor(acc + r * nt * 4, F32, (rows, nn), (nt, 1)),
                               SpTensor(a_off, DL, (rows, kn), (kt, 1)),
                               SpTensor(b_off, DL, (kn, nn), (nt, 1)), accumulate))

    # --- epilogue: K-split chain, bias, alpha/beta, rounding, store --------------------------------
    def epilogue(self, acc: int, rts, n0: int, nn: int) -> None:
        nt = _round(nn, UNIT)
        for chunk in self.chain_order(self.chunks(rts)):
            b0, nb, m0, nm, r, direction = chunk
            src = acc + r * nt * 4
            if self.s.k > 1 and not self.chain_step(src, nb * nm * nt * 4, direction):
                continue  # a partial sum passed on: another partner finishes this chunk
            self.finish(src, (b0, nb, m0, nm), n0, nn)

    def chain_order(self, chunks: list[tuple]) -> list[tuple]:
        """This core's order for the chunks: by when their partial sums reach it. A chunk going up the
        core ids reaches partner q after q hops, one going down after k-1-q; an in-order vector unit that
        took them in list order would make each direction wait for the other's whole chain."""
        if self.s.k == 1:
            return chunks
        q, k = self.w.partner, self.s.k
        hops = (q, k - 1 - q)
        keyed = sorted((i // 2 + hops[c[-1]], i) for i, c in enumerate(chunks))
        return [chunks[i] for _, i in keyed]

    def chunks(self, rts) -> list[tuple[int, int, int, int, int, int]]:
        return _epilogue_chunks(rts, self.sh.chunk_rows)

    def chain_step(self, src: int, nbytes: int, direction: int) -> bool:
        """Pass this chunk's partial sum along the chain (direction 0: up the core ids, 1: down). Returns
        True on the chain's last partner, which finishes the chunk."""
        q, k, g = self.w.partner, self.s.k, self.w.group
        pos = q if direction == 0 else k - 1 - q  # position along this chunk's chain
        step = 1 if direction == 0 else -1
        if pos > 0:
            up = g[q - step]
            slot = self.slots.next_recv(up, self.w.core)
            self.ins.append(RingRecv(up, tag=0))
            rows_bytes = SpTensor(src, F32, (nbytes // 4,))
            self.ins.append(Elementwise("add", rows_bytes, (rows_bytes, SpTensor(slot.offset, F32, (nbytes // 4,)))))
            if slot.credit:  # the upstream partner reuses this slot later: say it is free
                self.ins.append(Signal(up, tag=1))
        if pos == k - 1:
            return True
        down = g[q + step]
        slot = self.slots.next_send(self.w.core, down)
        if slot.wait:
            self.ins.append(Wait(down, tag=1))
        self.ins.append(RingSend(down, src, slot.offset, nbytes, tag=0, network=self.t.network))
        return False

    def finish(self, src: int, box: tuple[int, int, int, int], n0: int, nn: int) -> None:
        p, spec = self.p, self.p.spec
        b0, nb, m0, nm = box
        nt = _round(nn, UNIT)
        shape3, dense = (nb, nm, nn), (nm * nt, nt, 1)
        acc = SpTensor(src, F32, shape3, dense)
        if not p.needs_epilogue:  # fp32 out, nothing to add: store the accumulator as it is
            self.ins.append(p.out.dma((b0, m0, n0), (nb, nm, nn), src, store=True, row_bytes=nt * 4))
            return
        out_off = self.buf("o")
        out = SpTensor(out_off, p.out_dtype, shape3, dense)
        steps = []  # (op, inputs): each works on the fp32 accumulator in place; the last writes out
        if p.bias is not None:
            bias = self.load_addend(p.bias, "bias", box, n0, nn)
            if spec.beta != 1.0:
                scaled = SpTensor(self.off["bias_scaled"], F32, shape3, dense)
                self.ins.append(Elementwise("mul", scaled, (bias, Scalar(spec.beta))))
                bias = scaled
            steps.append(("fma", (acc, Scalar(spec.alpha), bias)))
        elif spec.alpha != 1.0:
            steps.append(("mul", (acc, Scalar(spec.alpha))))
        if spec.activation:
            steps.append((spec.activation, (acc,)))
        if p.residual is not None:
            steps.append(("add", (acc, self.load_addend(p.residual, "res", box, n0, nn))))
        if not steps:
            steps.append(("cast", (acc,)))  # the one rounding to the output dtype
        for i, (op, inputs) in enumerate(steps):
            self.ins.append(Elementwise(op, out if i == len(steps) - 1 else acc, inputs))
        if nt != nn:
            pad = SpTensor(out_off + nn * p.out.itemsize, p.out_dtype, (nb, nm, nt - nn), dense)
            self.ins.append(Elementwise("copy", pad, (Scalar(0.0),)))
        self.ins.append(p.out.dma((b0, m0, n0), (nb, nm, nn), out_off, store=True, row_bytes=nt * p.out.itemsize))

    def load_addend(self, x: _Bound, buf: str, box: tuple[int, int, int, int], n0: int, nn: int) -> SpTensor:
        """A bias or residual box, loaded once per distinct row (broadcast dims collapse), viewed at the
        chunk's shape through stride-0 dims."""
        b0, nb, m0, nm = box
        nt = _round(nn, UNIT)
        dst = self.buf(buf)
        self.ins.append(x.dma((b0, m0, n0), (nb, nm, nn), dst, row_bytes=nt * x.itemsize))
        sb = nm * nt if x.strides[0] and x.strides[1] else nt
        strides = (sb if x.strides[0] else 0, nt if x.strides[1] else 0, 1)
        return SpTensor(dst, x.layout.device_dtype, (nb, nm, nn), strides)


def _chunks_el(total: int, step: int) -> list[tuple[int, int]]:
    return [(s, min(step, total - s)) for s in range(0, total, step)]


@dataclass
class _Slot:
    offset: int
    credit: bool = False  # receiver: signal after use
    wait: bool = False  # sender: wait for the credit before sending


class _Slots:
    """Receive slots for partial sums, per (sender, receiver) pair, used round-robin. A reused slot needs a
    credit: the receiver signals after adding it, the sender waits for that before overwriting it."""

    def __init__(self, offsets: dict[str, int], uses: dict[tuple[int, int], int], count: int, nbytes: int,
                 cores: int):
        self.off, self.uses, self.count, self.nbytes, self.cores = offsets, uses, count, nbytes, cores
        self.sent: dict[tuple[int, int], int] = {}
        self.recv: dict[tuple[int, int], int] = {}

    def _offset(self, src: int, dst: int, n: int) -> int:
        return self.off[f"recv{0 if (dst - src) % self.cores == 1 else 1}"] + (n % self.count) * self.nbytes

    def next_send(self, src: int, dst: int) -> _Slot:
        n = self.sent.get((src, dst), 0)
        self.sent[(src, dst)] = n + 1
        return _Slot(self._offset(src, dst, n), wait=n >= self.count)

    def next_recv(self, src: int, dst: int) -> _Slot:
        n = self.recv.get((src, dst), 0)
        self.recv[(src, dst)] = n + 1
        return _Slot(self._offset(src, dst, n), credit=n + self.count < self.uses[(src, dst)])


def _count_chain_uses(p: _Problem, s: Split, t: Tiles, work: list[_CoreWork], offsets: dict[str, int],
                      cfg: CardConfig) -> dict[tuple[int, int], int]:
    """How many chunks each partner sends to each neighbour (both ends must agree on credits)."""
    uses: dict[tuple[int, int], int] = {}
    for w in work:
        em = _Emitter(p, s, t, w, offsets, cfg)
        n_passes = 1 if p.b_shared else w.batches[1]
        n_tiles = len(_chunks_el(w.ncols[1], em.sh.nt_el))
        chunks = em.chunks(em.row_tiles(None if p.b_shared else w.batches[0]))
        for d in (0, 1):
            cnt = sum(1 for c in chunks if c[-1] == d) * n_tiles * n_passes
            q = w.partner
            pos = q if d == 0 else s.k - 1 - q
            if pos < s.k - 1:
                down = w.group[q + (1 if d == 0 else -1)]
                uses[(w.core, down)] = uses.get((w.core, down), 0) + cnt
    return uses


def generate(spec: MatmulSpec, split: Split, tiles: Tiles, config: CardConfig) -> Program:
    """The program for one plan (used for the chosen plan and, in tests and benchmarks, alternatives)."""
    p = _check(spec)
    work = _assign(p, split, config)
    if work is None:
        raise MatmulSpecError(f"{p.describe()}: split {split} leaves cores without work")
    if split.k > 1 and tiles.network not in ("reduce", "data"):
        raise MatmulSpecError(f"a K-split sends partial sums over the 'reduce' or the 'data' ring, got {tiles.network!r}")
    sh = _core_shape(p, split, tiles, work[0])
    sp_plan = plan(_buffers(p, split, tiles, sh), config.scratchpad_plannable_bytes)
    offsets = {b.name: b.offset for b in sp_plan.buffers}
    uses = _count_chain_uses(p, split, tiles, work, offsets, config) if split.k > 1 else {}
    slots = _Slots(offsets, uses, sh.recv_slots, sh.chunk_rows * sh.nt_el * 4, config.num_cores)
    cores = {}
    for w in work:
        cores[w.core] = _Emitter(p, split, tiles, w, offsets, config, slots).run()
    _check_spans(p, cores, config)
    return Program(spec.name, _operands(p), cores, {"kind": spec.kind, "split": str(split), "tiles": str(tiles)})


def _operands(p: _Problem) -> list[Operand]:
    out = []
    seen = set()
    for bound, access in ((p.a, "in"), (p.b, "in"), (p.bias, "in"), (p.residual, "in"), (p.out, "out")):
        if bound is None or bound.name in seen:
            continue
        seen.add(bound.name)
        lay = bound.layout
        out.append(Operand(bound.name, lay.nbytes, access, lay.device_dtype, lay.host_shape, lay.stick_dim))
    return out


def _check_spans(p: _Problem, cores: dict[int, list[Instruction]], cfg: CardConfig) -> None:
    for core, ins in cores.items():
        total = sum(hi - lo for lo, hi in dram_spans(ins).values())
        if total > cfg.core_address_span_bytes:
            raise MatmulSpecError(f"{p.describe()}: core {core} would address {total} bytes of device memory, more "
                                  f"than config.core_address_span_bytes = {cfg.core_address_span_bytes}")


# =============================================================================================
# Entry points
# =============================================================================================
def preferred_layouts(spec: MatmulSpec) -> dict[str, StickLayout]:
    """The layout each operand buffer would ideally have: A sticked on K, B and the output (and bias) on
    N. The integrator can give a weight this layout once (a relayout at load time) instead of paying the
    in-kernel transpose on every call. Keys are buffer names."""
    out = {}
    for view in (spec.a, spec.b, spec.out):  # K is a's last dim, N b's and out's
        out[view.name] = _layout_with_stick(view, -1)
    if spec.bias is not None:
        out.setdefault(spec.bias.name, _layout_with_stick(spec.bias, -1))
    return out


def preferred_view_dim(role: str) -> int | None:
    """The dim of a role's view whose host dim should be sticked (for the graph's layout plan): the last
    one for every operand (A: K; B, the output, bias and residual: N); None for an unknown role."""
    return -1 if role in ("a", "b", "out", "bias", "residual") else None


def _layout_with_stick(view: TensorView, view_dim: int) -> StickLayout:
    """The view's buffer sticked on the host dim that ``view_dim`` walks."""
    lay, stride = view.layout, view.strides[view_dim]
    hshape = lay.host_shape if lay.host_shape else (1,)
    cands = [h for h in range(len(hshape)) if lay.host_strides[h] == stride and hshape[h] > 1]
    if view.shape[view_dim] <= 1 or stride == 0 or not cands:
        return lay
    return StickLayout(lay.host_shape, cands[0], lay.device_dtype)


def build_matmul(spec: MatmulSpec, config: CardConfig, verify_top: int = 0) -> tuple[Program, KernelDecisions]:
    """The program for ``spec`` on a card with ``config`` and the record of what was decided and why.

    The plan is the analytic cost model's cheapest. With ``verify_top`` = n > 1, the model's n cheapest
    plans are generated and timed with the card's timing model and the fastest is kept (an autotuning
    step: slower to compile, for kernels run often)."""
    ranked = rank_plans(spec, config)
    simulated: dict[int, float] = {}
    if verify_top > 1:
        from ..card.timing import time_program  # the card's own clock, used only when asked

        for i, c in enumerate(ranked[:verify_top]):
            simulated[i] = time_program(generate(spec, c.split, c.tiles, config), config).total_s
        best = min(simulated, key=simulated.get)
        ranked = [ranked[best]] + ranked[:best] + ranked[best + 1:]
        simulated = {0: simulated[best], **{i + (1 if i < best else 0): t for i, t in simulated.items() if i != best}}
    best = ranked[0]
    program = generate(spec, best.split, best.tiles, config)
    decisions = _decisions(spec, config, ranked, simulated)
    program.metadata["decisions"] = decisions.to_dict()
    return program, decisions


def naive_split(spec: MatmulSpec, config: CardConfig) -> Split:
    """The naive division, for comparison: output rows only (batch, then M), as many cores as give every
    core work, no N split and no K-split."""
    p = _check(spec)
    best = Split(1, 1, 1, 1)
    for pb in _divisors(config.num_cores):
        for pm in _divisors(config.num_cores // pb):
            s = Split(pb, pm, 1, 1)
            if s.cores > best.cores and pb <= p.batch and pm <= p.M and _assign(p, s, config) is not None:
                best = s
    return best


def plan_for_split(spec: MatmulSpec, split: Split, config: CardConfig) -> Plan:
    """The best tiles for a given split (for comparing alternatives)."""
    p = _check(spec)
    if _assign(p, split, config) is None:
        raise MatmulSpecError(f"{p.describe()}: split {split} leaves cores without work")
    c = _best_tiles(p, split, config)
    if c is None:
        raise MatmulSpecError(f"no tiles fit the scratchpad for split {split}")
    return c


def _decisions(spec: MatmulSpec, cfg: CardConfig, ranked: list[Plan],
               simulated: dict[int, float] | None = None) -> KernelDecisions:
    p = _check(spec)
    best = ranked[0]
    s, t = best.split, best.tiles
    work = _assign(p, s, cfg)
    sh = _core_shape(p, s, t, work[0])
    sp_plan = plan(_buffers(p, s, t, sh), cfg.scratchpad_plannable_bytes)
    d = KernelDecisions(spec.name, "matmul", list(spec.source_ops))
    for bound, kind in ((p.a, "input"), (p.b, "weight"), (p.bias, "input"), (p.residual, "input"), (p.out, "output")):
        if bound is not None:
            d.buffers.append(BufferDecision(bound.name, kind, bound.layout.describe()))
    d.work_division = {"cores": s.cores, "split": {"batch": s.batch, "M": s.m, "N_sticks": s.n, "K_split": s.k},
                       "k_partners": "adjacent ring stops" if s.k > 1 else "none",
                       "k_network": t.network if s.k > 1 else None,
                       "max_core_span_bytes": max(_core_span(p, w) for w in work)}
    d.tiling = {"rows": t.bt * t.mt, "batches_per_tile": t.bt, "M_tile": t.mt, "N_tile_sticks": t.nt,
                "K_tile_sticks": t.kt, "a_resident": t.a_resident, "order": "weight-stationary: N tile > K tile > A rows",
                "n_tiles": sh.n_tiles, "k_tiles": sh.k_tiles, "row_tiles": sh.row_tiles, "epilogue_rows": sh.chunk_rows}
    d.scratchpad = {"peak_bytes": sp_plan.peak_bytes, "capacity": cfg.scratchpad_plannable_bytes,
                    "buffers": {b.name: b.aligned_bytes for b in sp_plan.buffers}}
    d.overlap = {"double_buffered": [b.name[:-1] for b in sp_plan.buffers if b.name.endswith("0")],
                 "accumulate": "fp32 in scratchpad, one rounding to " + p.out_dtype, "estimate": best.est.to_dict()}
    simulated = simulated or {}
    seen = set()
    picks = list(range(min(8, len(ranked)))) + [i for i, c in enumerate(ranked) if c.split.k == 1][:1]
    for i in picks:
        c = ranked[i]
        if str(c.split) in seen:
            continue
        seen.add(str(c.split))
        alt = {"split": str(c.split), "tiles": str(c.tiles), "estimate_us": round(c.est.total_s * 1e6, 2)}
        if i in simulated:
            alt["simulated_us"] = round(simulated[i] * 1e6, 2)
        d.alternatives.append(alt)
    naive = naive_split(spec, cfg)
    nc = _best_tiles(p, naive, cfg) if _span_ok(p, naive, cfg) else None
    if nc is not None:
        d.alternatives.append({"split": f"{naive} (naive: output rows only)", "tiles": str(nc.tiles),
                               "estimate_us": round(nc.est.total_s * 1e6, 2)})
    if simulated:
        d.notes.append(f"plan verified: the cost model's {len(simulated)} cheapest plans timed on the card model; "
                       "the fastest kept")
    d.notes += _layout_notes(p, spec, cfg, best)
    return d


def _layout_notes(p: _Problem, spec: MatmulSpec, cfg: CardConfig, best: Plan) -> list[str]:
    """What a transposed operand costs here, against relayouting it once in its own kernel."""
    notes = []
    for role, flag, bound in (("b", p.b_transposed, p.b), ("a", p.a_transposed, p.a)):
        if not flag:
            continue
        straight = _straight_problem(p, role)
        c = _best_tiles(straight, best.split, cfg)
        in_kernel = best.est.total_s - (c.est.total_s if c else best.est.total_s)
        nbytes = bound.layout.nbytes
        relayout = cfg.kernel_fixed_cost_s + nbytes / cfg.dram_read_bandwidth + nbytes / cfg.dram_write_bandwidth
        notes.append(f"{role} %{bound.name} is sticked on K, not N: transposed in scratchpad on the vector unit "
                     f"(estimated +{in_kernel * 1e6:.2f} us per call) vs. a relayout kernel "
                     f"(~{relayout * 1e6:.2f} us once, e.g. at weight load); preferred_layouts() names the layout")
    return notes


def _straight_problem(p: _Problem, role: str) -> _Problem:
    """The same problem as if ``role`` had the preferred layout (for costing only)."""
    if role == "b":
        return replace(p, b=replace(p.b, lane_dim=2))
    return replace(p, a=replace(p.a, lane_dim=2))

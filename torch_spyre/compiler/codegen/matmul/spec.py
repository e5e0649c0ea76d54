"""The matmul spec, and the spec bound to device memory and checked.

A :class:`MatmulSpec` names the operands as :class:`~torch_spyre.compiler.access.TensorView` s (device
buffers with their stick layouts and the strided views over them); the ``*_spec`` helpers build one per
ATen op. :func:`_check` turns it into a :class:`_Problem`: every operand bound to three role dims
(batch, rows, cols) over device bytes (:class:`_Bound`, which also writes the DMA of a box), shapes,
dtypes and layouts checked, with errors that say which operand is wrong and what to do.
:func:`preferred_layouts` / :func:`preferred_view_dim` tell the integrator which layouts avoid an
in-kernel transpose.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ....card.layout import StickLayout
from ....program import STICK_BYTES, UNARY_OPS, Addr, DmaLoad, DmaPattern, DmaStore, Instruction
from ...access import CodegenError, TensorView

DL, F32 = "dlfloat16", "float32"
UNIT = 64  # elements of one fp16 stick: N and K are tiled in whole units of it
INPUT_DTYPES = (DL,)  # what the PE arrays multiply (fp16 and bf16 are stored as DLFloat16)
OUTPUT_DTYPES = (DL, F32)
KINDS = ("mm", "bmm", "addmm", "baddbmm", "linear")
ACTIVATIONS = frozenset(UNARY_OPS - {"copy", "cast"})


class MatmulSpecError(CodegenError):
    """A matmul the card cannot run as specified (bad shapes, dtypes, layouts or address span)."""


# =============================================================================================
# The spec
# =============================================================================================
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
    # A LayerNorm over N after the epilogue (its whole rows on one core): out = norm(...) * weight + bias
    # (both [N], optional), in fp32 before the one rounding; None: no norm.
    norm_eps: float | None = None
    norm_weight: TensorView | None = None
    norm_bias: TensorView | None = None

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
        offset += (lo[L] // self.layout.lanes) * self.strides[L]
        shape.append(-(-n[L] // self.layout.lanes))
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
    lay = view.layout  # (TensorView itself checks that shape and strides have one rank)
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
    if view.storage_offset < 0 or view.storage_offset >= max(lay.numel, 1):
        raise MatmulSpecError(f"{role} %{view.name}: storage offset {view.storage_offset} is outside its {lay.numel}-element buffer")
    coords = [int(c) for c in np.unravel_index(view.storage_offset, hshape)]
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
    norm_weight: _Bound | None = None
    norm_bias: _Bound | None = None

    @property
    def has_norm(self) -> bool:  # a LayerNorm over N in the epilogue: a core must hold whole rows
        return self.spec.norm_eps is not None

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
        if self.has_norm:  # row sums, mean, centring, squares, their sums, rsqrt(var + eps), scaling
            steps += ["sum", "mul", "sub", "mul", "sum", "fma", "rsqrt", "mul"]
            steps += (["mul"] if self.norm_weight is not None else []) + (["add"] if self.norm_bias is not None else [])
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
    norm = {}
    if spec.norm_eps is not None:
        if not (isinstance(spec.norm_eps, float) and spec.norm_eps >= 0):
            raise MatmulSpecError(f"norm_eps must be a float >= 0, got {spec.norm_eps!r}")
        for role, v in (("norm_weight", spec.norm_weight), ("norm_bias", spec.norm_bias)):
            if v is not None and (len(v.shape) != 1 or v.shape[0] != b[2]):
                raise MatmulSpecError(f"{role} %{v.name} must be [N] = [{b[2]}], got {list(v.shape)}")
            norm[role] = _bind_addend(v, role, (batch, a[1], b[2]))
            if norm[role] is not None and norm[role].lane_dim != 2:
                raise MatmulSpecError(f"{role} %{v.name} must be sticked on N")
    return _Problem(spec, A, B, O, bias, residual, batch, a[1], b[2], a[2], **norm)


def _bind_addend(view: TensorView | None, role: str, out_shape: tuple[int, int, int]) -> _Bound | None:
    """A bias or residual: broadcast to the output, fp16/bf16 or fp32, sticked on N or on M (then loaded as
    it lies and read through a transposed view: a residual's layout is its producer's choice)."""
    if view is None:
        return None
    if view.layout.device_dtype not in OUTPUT_DTYPES:
        raise MatmulSpecError(f"{role} %{view.name} is {view.layout.device_dtype}; use fp16/bf16 or fp32")
    bound = _bind(view, role, 2, out_shape)
    if bound.lane_dim not in (1, 2):
        raise MatmulSpecError(f"{role} %{view.name} is sticked on its batch dim; relayout it first (sticked on its "
                              "last dim)")
    return bound


def _broadcast_batch(x: _Bound, batch: int) -> _Bound:
    if x.sizes[0] == batch:
        return x
    return replace(x, sizes=(batch, *x.sizes[1:]), strides=(0, *x.strides[1:]))


def _check_out_sticks(view: TensorView, out: _Bound) -> None:
    """Whole-stick stores must not clobber elements outside the view."""
    lay = view.layout
    coords = np.unravel_index(view.storage_offset, lay.host_shape if lay.host_shape else (1,))
    end = int(coords[lay.stick_dim]) + out.sizes[2]
    if end % lay.lanes and end != lay.host_shape[lay.stick_dim]:
        raise MatmulSpecError(f"out %{view.name}: the view ends at element {end} of the stick dimension, inside a "
                              f"stick shared with elements outside the view; whole-stick stores would overwrite them")



# =============================================================================================
# Layouts the operands would ideally have
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
    return -1 if role in ("a", "b", "out", "bias", "residual", "norm_weight", "norm_bias") else None


def _layout_with_stick(view: TensorView, view_dim: int) -> StickLayout:
    """The view's buffer sticked on the host dim that ``view_dim`` walks."""
    lay, stride = view.layout, view.strides[view_dim]
    hshape = lay.host_shape if lay.host_shape else (1,)
    cands = [h for h in range(len(hshape)) if lay.host_strides[h] == stride and hshape[h] > 1]
    if view.shape[view_dim] <= 1 or stride == 0 or not cands:
        return lay
    return StickLayout(lay.host_shape, cands[0], lay.device_dtype)


"""The fused MLP spec, and the spec bound to device memory and checked.

``out = act(x @ w_up + b_up) [* (x @ w_gate + b_gate) ...] @ w_down + b_down``; precisely, with a gate
(SwiGLU: ``act`` = SiLU, GeGLU: GELU) ``h = act(x @ w_gate + b_gate) * (x @ w_up + b_up)``, without one
``h = act(x @ w_up + b_up)``, and ``out = h @ w_down + b_down``; with ``norm_eps``, ``out =
LayerNorm(h @ w_down + b_down + residual) * norm_weight + norm_bias`` over H (a post-LN block's residual
and norm, ``compiler/mlp_norm.py``), on the fp32 sums before the one rounding. ``x`` is [M, H] or [B, S, H]; the
weights are views [H, I] (up, gate) and [I, H] (down), as ``nn.Linear``'s weights transposed; the biases
are [I] and [H]. Operands are :class:`~torch_spyre.compiler.access.TensorView` s bound to device bytes
with the matmul generator's binder (``codegen/matmul/spec.py``), so views are read in place.

Layouts: x and the output sticked on H; the weights best on their last view dim (up/gate on I, down on
H), as the matmul's B wants them (the graph's layout plan gives weights that layout once). A weight
sticked the other way (``nn.Linear``'s own layout, when the plan keeps it) is loaded as it lies and
transposed in scratchpad on the vector unit, as the matmul does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...access import CodegenError, TensorView
from ..matmul.spec import ACTIVATIONS, DL, F32, UNIT, _bind, _bind_addend, _Bound


class MlpSpecError(CodegenError):
    """A fused MLP the generator cannot run as specified (bad shapes, dtypes or layouts)."""


@dataclass(frozen=True)
class MlpSpec:
    x: TensorView
    w_up: TensorView
    w_down: TensorView
    out: TensorView
    w_gate: TensorView | None = None
    b_up: TensorView | None = None
    b_gate: TensorView | None = None
    b_down: TensorView | None = None
    activation: str = "silu"
    name: str = "fused_mlp"
    source_ops: tuple[str, ...] = ()
    residual: TensorView | None = None  # [.., H] like out
    norm_weight: TensorView | None = None  # [H]
    norm_bias: TensorView | None = None  # [H]
    norm_eps: float | None = None  # a LayerNorm over H after the residual (None: none)


@dataclass(frozen=True)
class _MlpProblem:
    spec: MlpSpec
    x: _Bound  # (batch, S, H)
    w_up: _Bound  # (1, H, I)
    w_gate: _Bound | None
    w_down: _Bound  # (1, I, H)
    out: _Bound  # (batch, S, H)
    b_up: _Bound | None  # (1, 1, I)
    b_gate: _Bound | None
    b_down: _Bound | None  # (1, 1, H)
    batch: int
    S: int
    H: int
    I: int
    residual: _Bound | None = None  # (batch, S, H)
    norm_weight: _Bound | None = None  # (1, 1, H)
    norm_bias: _Bound | None = None

    @property
    def has_norm(self) -> bool:  # the finisher keeps a row tile's whole rows to normalize them
        return self.spec.norm_eps is not None

    @property
    def gated(self) -> bool:
        return self.w_gate is not None

    @property
    def rows(self) -> int:
        return self.batch * self.S

    @property
    def i_sticks(self) -> int:
        return -(-self.I // UNIT)

    @property
    def h_sticks(self) -> int:
        return -(-self.H // UNIT)

    def describe(self) -> str:
        kind = f"gated ({self.spec.activation})" if self.gated else self.spec.activation
        return f"fused MLP {kind} {self.rows} tokens x hidden {self.H} x intermediate {self.I}"


def _shape3(view: TensorView) -> tuple[int, ...]:
    return (1, *view.shape) if len(view.shape) == 2 else tuple(view.shape)


def check(spec: MlpSpec) -> _MlpProblem:
    """Shapes, dtypes and layouts, with errors naming the operand and what to do."""
    if spec.activation not in ACTIVATIONS:
        raise MlpSpecError(f"activation {spec.activation!r} is not a vector-unit op; known: {', '.join(sorted(ACTIVATIONS))}")
    if len(spec.x.shape) not in (2, 3) or len(spec.out.shape) != len(spec.x.shape):
        raise MlpSpecError(f"x must be [M, H] or [B, S, H] and out the same rank; got x{list(spec.x.shape)} "
                           f"out{list(spec.out.shape)}")
    for role, w in (("w_up", spec.w_up), ("w_gate", spec.w_gate), ("w_down", spec.w_down)):
        if w is not None and len(w.shape) != 2:
            raise MlpSpecError(f"{role} must be 2-d, got shape {list(w.shape)}")
    b, s, h = _shape3(spec.x)
    i = spec.w_up.shape[1]
    if tuple(spec.w_up.shape) != (h, i) or (spec.w_gate is not None and tuple(spec.w_gate.shape) != (h, i)) \
            or tuple(spec.w_down.shape) != (i, h) or _shape3(spec.out) != (b, s, h):
        raise MlpSpecError(f"shapes do not agree: x{list(spec.x.shape)}, w_up{list(spec.w_up.shape)}, w_gate"
                           f"{list(spec.w_gate.shape) if spec.w_gate is not None else None}, w_down"
                           f"{list(spec.w_down.shape)}, out{list(spec.out.shape)}; need x[.., H], w_up and w_gate "
                           "[H, I], w_down [I, H], out[.., H]")
    if min(b, s, h, i) == 0:
        raise MlpSpecError(f"empty MLP: x{list(spec.x.shape)}, intermediate {i}")
    for role, v in (("x", spec.x), ("w_up", spec.w_up), ("w_gate", spec.w_gate), ("w_down", spec.w_down)):
        if v is not None and v.layout.device_dtype != DL:
            raise MlpSpecError(f"{role} %{v.name} is {v.layout.device_dtype}: the PE arrays multiply fp16/bf16 "
                               f"(stored as {DL})")
    if spec.out.layout.device_dtype not in (DL, F32):
        raise MlpSpecError(f"out %{spec.out.name} is {spec.out.layout.device_dtype}; fp16/bf16 or fp32")
    x = _bind(spec.x, "x", 2)
    out = _bind(spec.out, "out", 2)
    wu, wd = _bind(spec.w_up, "w_up", 2), _bind(spec.w_down, "w_down", 2)
    wg = _bind(spec.w_gate, "w_gate", 2) if spec.w_gate is not None else None
    for role, bound in (("x", x), ("out", out)):
        if bound.lane_dim != 2:
            raise MlpSpecError(f"{role} %{bound.name} must be sticked on its last view dim ({bound.layout.describe()}); "
                               "the fused MLP reads x and writes out sticked on H: relayout it")
    for role, bound in (("w_up", wu), ("w_gate", wg), ("w_down", wd)):
        if bound is not None and bound.lane_dim not in (1, 2):
            raise MlpSpecError(f"{role} %{bound.name} is sticked on its batch dim; relayout it")
    biases = []
    for role, v, n in (("b_up", spec.b_up, i), ("b_gate", spec.b_gate, i), ("b_down", spec.b_down, h)):
        if v is not None and (len(v.shape) != 1 or v.shape[0] != n):
            raise MlpSpecError(f"{role} %{v.name} has shape {list(v.shape)}; it must be [{n}]")
        bound = _bind_addend(v, role, (1, 1, n))
        if bound is not None and bound.lane_dim != 2:
            raise MlpSpecError(f"{role} %{v.name} must be sticked on its one dim")
        biases.append(bound)
    if spec.b_gate is not None and spec.w_gate is None:
        raise MlpSpecError("b_gate without w_gate")
    norm = []
    if spec.norm_eps is None and any(v is not None for v in (spec.residual, spec.norm_weight, spec.norm_bias)):
        raise MlpSpecError("residual, norm_weight and norm_bias come with norm_eps (the LayerNorm after the MLP)")
    if spec.residual is not None and _shape3(spec.residual) != (b, s, h):
        raise MlpSpecError(f"residual %{spec.residual.name} has shape {list(spec.residual.shape)}; it must be the "
                           f"output's {list(spec.out.shape)}")
    for role, v, shape in (("residual", spec.residual, (b, s, h)), ("norm_weight", spec.norm_weight, (1, 1, h)),
                           ("norm_bias", spec.norm_bias, (1, 1, h))):
        if v is not None and role != "residual" and (len(v.shape) != 1 or v.shape[0] != h):
            raise MlpSpecError(f"{role} %{v.name} has shape {list(v.shape)}; it must be [{h}]")
        bound = _bind_addend(v, role, shape)
        if bound is not None and bound.lane_dim != 2:
            raise MlpSpecError(f"{role} %{v.name} must be sticked on H ({bound.layout.describe()}): relayout it")
        norm.append(bound)
    return _MlpProblem(spec, x, wu, wg, wd, out, *biases, b, s, h, i, *norm)

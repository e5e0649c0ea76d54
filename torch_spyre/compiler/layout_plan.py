"""The graph's layout plan: which stick dimension every buffer the wrapper allocates gets, and which
weights are relayouted once to the layout their matmul wants.

Built at wrapper codegen time from a plain description of the graph (:class:`Operand` uses of each
whole-op kernel, :class:`BufferInfo` producers; ``wrapper.py`` reads them from Inductor) and nothing
else: not the layouts of the graph's inputs (Inductor's FX graph cache key does not hold them, and the
programs adapt to the bound tensors' placements at run time).

Rules (each choice is recorded with its reason in the plan's :class:`KernelDecisions`):

- **What consumers want.** Whole-op generators read a role best with one host dim sticked: the matmul
  wants A sticked on K and B, bias and output on N (``codegen.matmul.preferred_view_dim``); attention
  reads q/k/v/mask rows along the stick dim and the gather reads source rows of whole sticks (the last
  view dim in both). Pointwise kernels read any layout.
- **What producers can write.** A pointwise kernel writes any layout, so a buffer it produces gets the
  stick dim its whole-op consumers agree on (none, or disagreeing consumers: the default, unit-stride
  dim). Whole-op kernels write their output in a fixed layout (the matmul's sticked on N).
- **Weights** (the graph's static inputs: parameters and buffers of the module, as AOTAutograd reports
  them) read by whole-op kernels that all want one stick dim are relayouted in place at the first call
  (:func:`ensure_weight_layout`); later calls find the layout right and do nothing. Only in inference
  graphs: a training step's backward reads a weight W as B of ``grad @ W``, sticked the other way, and
  the two graphs would relayout it back and forth on every step. A weight whose consumers disagree
  (a tied embedding + lm_head: the gather wants rows sticked on D, the matmul wants N = V) keeps its
  layout.
  The in-kernel transpose of a K-sticked B only ever adds vector work per call (card timing model:
  +0.15 to +1.31 us per call at MiniLM's shapes, 0 to +0.05 us at 4096 rows or 512x4096x2048), while
  the relayout runs once; pricing every weight with the timing model at compile time would cost 7-64 s
  of host time per shape, so weights are not priced per compile (docs/compiler.md, "Layout").
- A buffer produced in a fixed layout and read by a matmul that wants another stick dim gets a relayout
  kernel before its first reader only when the card's timing model prices the relayout below the
  readers' in-kernel handling (:class:`Costs`; both figures are recorded either way).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..program import row_major_strides
from .decisions import BufferDecision, KernelDecisions

# Roles of the other whole-op generators that read rows along the stick dim (their last view dim):
# codegen.attention (q/k/v/mask rows, head dim in sticks), codegen.gather (rows of whole sticks).
_ROW_READERS = {"attention": ("query", "key", "value", "attn_mask"), "gather": ("source",),
                # codegen.mlp: x sticked on H, the weights on their last view dim (up/gate: I, down: H);
                # the residual and the norm's weight and bias (mlp_norm.py) on H too
                "mlp": ("x", "w_up", "w_gate", "w_down", "b_up", "b_gate", "b_down", "residual", "norm_weight",
                        "norm_bias")}
# Producers that write any layout (the pointwise generator); the others write a fixed layout.
FLEXIBLE_PRODUCERS = ("pointwise",)


@dataclass(frozen=True)
class Operand:
    """One operand of one whole-op kernel: the buffer it reads (or writes, role "out") and the view."""

    kernel: str  # how the plan names the kernel: "the addmm writing buf3"
    generator: str  # "matmul", "attention", "gather"
    role: str
    buffer: str
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class BufferInfo:
    """A buffer of the graph: its dense geometry and who writes it."""

    name: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    producer: str  # "pointwise", "matmul", "attention", "gather", "weight", "input", "other"
    device_dtype: str = "dlfloat16"
    mutated: bool = False  # written again after its producer (a relayouted copy would miss the write)


@dataclass
class Choice:
    buffer: str
    stick_dim: int  # a dim of the buffer's dense host shape (outermost first)
    host_shape: tuple[int, ...]
    # "allocate": a buffer the wrapper allocates in this layout; "weight": relayouted in place once at run
    # time; "relayout": a relayout kernel runs right before the kernel writing ``before`` and the buffer's
    # name is bound to the relayouted tensor from then on
    kind: str
    reason: str
    before: str = ""


@dataclass
class LayoutPlan:
    choices: dict[str, Choice] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def stick_dim(self, buffer: str) -> int | None:
        c = self.choices.get(buffer)
        return c.stick_dim if c is not None and c.kind == "allocate" else None

    def weights(self) -> list[Choice]:
        return [c for c in self.choices.values() if c.kind == "weight"]

    def relayouts_before(self, buffer: str) -> list[Choice]:
        """The relayouts to run right before the kernel that writes ``buffer``."""
        return [c for c in self.choices.values() if c.kind == "relayout" and c.before == buffer]

    def reusable(self, buffer: str) -> bool:
        """False for buffers a relayout rebinds or that a relayout must precede (they get their own
        allocation line, so that the relayout has one place in the generated code)."""
        return not any(c.kind == "relayout" and buffer in (c.buffer, c.before) for c in self.choices.values())

    def to_json(self) -> str:
        return json.dumps({"choices": [asdict(c) for c in self.choices.values()], "notes": self.notes})

    @classmethod
    def from_json(cls, text: str) -> "LayoutPlan":
        d = json.loads(text)
        choices = {c["buffer"]: Choice(**{**c, "host_shape": tuple(c["host_shape"])}) for c in d["choices"]}
        return cls(choices, list(d["notes"]))

    def decisions(self, name: str) -> KernelDecisions:
        """The plan as a decision record (one buffer line each, the reasons as notes)."""
        d = KernelDecisions(name, "layout")
        for c in self.choices.values():
            role = "weight" if c.kind == "weight" else "intermediate"
            d.buffers.append(BufferDecision(c.buffer, role, f"host {list(c.host_shape)} sticked on dim {c.stick_dim}"))
            d.notes.append(f"{c.buffer}: {c.reason}")
        d.notes += self.notes
        return d


# --- geometry ------------------------------------------------------------------------------------
def dense_host_dims(size: tuple[int, ...], stride: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """The dense host shape of a buffer as (extent, stride) per host dim, outermost first (size-1 dims
    dropped, as ``device.tensor.layout_for`` does); None for a buffer that is not dense."""
    from ..device.tensor import dense_order

    if len(size) != len(stride):  # Inductor gives some eager out= buffers a layout of another rank
        return None
    order = dense_order(size, stride)
    return None if order is None else [(size[d], stride[d]) for d in order]


def host_dim_of(buffer: BufferInfo, view_size: int, view_stride: int) -> int | None:
    """The host dim of ``buffer`` a view dim of this size and stride walks (None: broadcast or no match)."""
    host = dense_host_dims(buffer.size, buffer.stride)
    if host is None or view_size <= 1 or view_stride == 0:
        return None
    match = [h for h, (n, st) in enumerate(host) if st == view_stride and n > 1]
    return match[0] if match else None


def _preferred_view_dim(generator: str, role: str) -> int | None:
    if generator in ("matmul", "matmul_group"):
        from .codegen.matmul import preferred_view_dim

        return preferred_view_dim(role.rstrip("0123456789"))  # a group's members: b0, bias1, ...
    return -1 if role.rstrip("0123456789") in _ROW_READERS.get(generator, ()) else None  # group members: source0, ...


def _role_name(op: Operand) -> str:
    what = {"a": "A (K)", "b": "B (N)", "bias": "bias (N)", "residual": "residual (N)", "out": "output (N)"}
    return what.get(op.role, op.role) if op.generator == "matmul" else op.role


# --- the plan --------------------------------------------------------------------------------------
def wanted_stick_dims(buffer: BufferInfo, operands: list[Operand]) -> dict[int, list[str]]:
    """Host dim -> the consumers (kernel and role) that want ``buffer`` sticked on it."""
    wants: dict[int, list[str]] = {}
    for op in operands:
        if op.buffer != buffer.name or op.role == "out":
            continue
        vd = _preferred_view_dim(op.generator, op.role)
        if vd is None or not op.size:
            continue
        h = host_dim_of(buffer, op.size[vd], op.stride[vd])
        if h is not None:
            wants.setdefault(h, []).append(f"{op.kernel}'s {_role_name(op)}")
    return wants


def plan_layouts(buffers: list[BufferInfo], operands: list[Operand], inference: bool,
                 costs: "Costs | None" = None) -> LayoutPlan:
    """The layout plan of one graph (see the module docstring for the rules). ``costs`` prices a relayout
    against the consumers' in-kernel handling (default: the card's timing model on the programs)."""
    plan = LayoutPlan()
    by_name = {b.name: b for b in buffers}
    for b in buffers:
        host = dense_host_dims(b.size, b.stride)
        wants = wanted_stick_dims(b, operands) if host is not None else {}
        if not wants or b.producer == "input":
            continue
        shape = tuple(n for n, _ in host)
        default = len(shape) - 1
        if b.producer not in (*FLEXIBLE_PRODUCERS, "weight"):
            _fixed_producer(plan, b, shape, wants, operands, by_name, costs)
            continue
        if len(wants) > 1:
            plan.notes.append(f"{b.name}: consumers disagree ({_describe(wants)}); keeps its layout")
            continue
        (dim, who), = wants.items()
        if b.producer == "weight":
            if len(shape) < 2:
                continue  # one dim: one possible layout
            if not inference:
                if dim == default:
                    continue
                plan.notes.append(f"{b.name} (weight): {', '.join(who)} want it sticked on dim {dim}; kept as it is "
                                  "in a training graph (the backward reads it sticked the other way)")
                continue
            plan.choices[b.name] = Choice(b.name, dim, shape, "weight",
                                          f"sticked on dim {dim} for {', '.join(who)} (a weight: relayouted in "
                                          "place once, at the first call, if it is not; read every call)")
        elif dim != default:
            plan.choices[b.name] = Choice(b.name, dim, shape, "allocate",
                                          f"sticked on dim {dim} for {', '.join(who)} (its pointwise producer "
                                          "writes any layout)")
    return plan


def _fixed_producer(plan: LayoutPlan, b: BufferInfo, shape: tuple[int, ...], wants: dict[int, list[str]],
                    operands: list[Operand], by_name: dict[str, BufferInfo], costs: "Costs | None") -> None:
    """A buffer its producer writes in a fixed layout (sticked on its last dim): when whole-op consumers
    want another stick dim, a relayout kernel before the first of them, or their in-kernel handling,
    whichever the card's timing model finds cheaper."""
    default = len(shape) - 1
    other = {d: who for d, who in wants.items() if d != default}
    if not other:
        return
    if len(wants) > 1:
        plan.notes.append(f"{b.name}: consumers disagree ({_describe(wants)}); keeps its producer's layout")
        return
    (dim, who), = other.items()
    readers = [op for op in operands if op.buffer == b.name and op.role != "out"]
    if tuple(b.stride) != tuple(row_major_strides(b.size)):
        plan.notes.append(f"{b.name} is read by {', '.join(who)} wanting dim {dim}; kept as its {b.producer} producer "
                          "writes it (not row-major: a relayouted copy would change its strides)")
        return
    unpriced = [op for op in readers
                if op.generator != "matmul" and _preferred_view_dim(op.generator, op.role) is not None]
    if b.mutated or unpriced:
        plan.notes.append(f"{b.name} is read by {', '.join(who)} wanting dim {dim}; kept as its {b.producer} producer "
                          "writes it (mutated later, or read by a kernel the plan cannot price)")
        return
    costs = costs or Costs()
    try:
        in_kernel = sum(costs.matmul_saving_s(op.kernel, b.name, dim, operands, by_name) for op in readers
                        if op.generator == "matmul")
        relayout = costs.relayout_s(shape, b.device_dtype, default, dim)
    except Exception as e:  # noqa: BLE001 - a consumer the generators refuse: they will say so at run time
        plan.notes.append(f"{b.name}: no relayout priced ({type(e).__name__}: {e})")
        return
    first = next((op.buffer for op in operands if op.kernel == readers[0].kernel and op.role == "out"), None)
    if first is None:  # its output's size is symbolic (left out of the plan): nowhere to put a relayout
        plan.notes.append(f"{b.name} is read by {', '.join(who)} wanting dim {dim}; kept as its {b.producer} producer "
                          "writes it (the reader's output has symbolic sizes)")
        return
    figures = (f"in-kernel handling costs {in_kernel * 1e6:.2f} us per call, a relayout kernel "
               f"{relayout * 1e6:.2f} us (card timing model)")
    if in_kernel > relayout:
        plan.choices[b.name] = Choice(b.name, dim, shape, "relayout",
                                      f"relayout inserted (from dim {default}, as its {b.producer} producer writes it) "
                                      f"to be sticked on dim {dim} for {', '.join(who)}: {figures}", before=first)
    else:
        plan.notes.append(f"{b.name} is read by {', '.join(who)} wanting dim {dim}; kept as its {b.producer} producer "
                          f"writes it: {figures}")


class Costs:
    """Prices for the plan, from the card's timing model on the programs the generators would emit
    (the matmul's analytic estimate does not see the in-scratchpad transposes it hides behind the PE
    arrays). Programs are cached per shape and layouts."""

    def __init__(self, config: Any = None):
        if config is None:
            from ..device import cards

            config = cards.config()
        self.config = config
        self._times: dict[tuple, float] = {}

    def _timed(self, key: tuple, make: Any) -> float:
        if key not in self._times:
            from ..card.timing import time_program

            self._times[key] = time_program(make(), self.config).total_s
        return self._times[key]

    def relayout_s(self, shape: tuple[int, ...], device_dtype: str, src_dim: int, dst_dim: int) -> float:
        from ..card.layout import StickLayout
        from .relayout import copy_choice

        # the program relayout_buffer will run: the on-chip exchange or the device-memory kernel, the faster
        src, dst = StickLayout(shape, src_dim, device_dtype), StickLayout(shape, dst_dim, device_dtype)
        return copy_choice(src, dst, self.config)[2]

    def matmul_saving_s(self, kernel: str, buffer: str, dim: int, operands: list[Operand],
                        buffers: dict[str, BufferInfo]) -> float:
        """Simulated seconds the matmul ``kernel`` saves per call when ``buffer`` is sticked on ``dim``
        instead of its last dim (every other operand in its default layout)."""
        as_is, relaid = (self._matmul_spec(kernel, operands, buffers, {buffer: d}) for d in (None, dim))
        return self._matmul_s(as_is) - self._matmul_s(relaid)

    def _matmul_s(self, spec: Any) -> float:
        from .codegen.matmul import build_matmul

        key = ("matmul", spec.a, spec.b, spec.out, spec.bias, spec.residual)
        return self._timed(key, lambda: build_matmul(spec, self.config)[0])

    @staticmethod
    def _matmul_spec(kernel: str, operands: list[Operand], buffers: dict[str, BufferInfo],
                     sticks: dict[str, int | None]) -> Any:
        from ..card.layout import StickLayout
        from .access import TensorView
        from .codegen import matmul as mm

        views = {}
        for op in operands:
            if op.kernel != kernel:
                continue
            b = buffers[op.buffer]
            shape = tuple(n for n, _ in dense_host_dims(b.size, b.stride))
            stick = sticks.get(op.buffer)
            layout = StickLayout(shape, len(shape) - 1 if stick is None else stick, b.device_dtype)
            views[op.role] = TensorView(op.role, layout, op.size, op.stride, 0)
        kind = ("addmm" if len(views["out"].shape) == 2 else "baddbmm") if "bias" in views else \
            ("mm" if len(views["out"].shape) == 2 else "bmm")
        return mm.MatmulSpec(views["a"], views["b"], views["out"], views.get("bias"), kind=kind, name=kernel,
                             residual=views.get("residual"))


def _describe(wants: dict[int, list[str]]) -> str:
    return "; ".join(f"dim {d}: {', '.join(who)}" for d, who in sorted(wants.items()))


# --- run time ----------------------------------------------------------------------------------------
_stats: Counter[str] = Counter()
_stats_lock = threading.Lock()
_dumped: set[str] = set()
_CLAIM = "weight_layout_for"  # Allocation.meta key: (stick dim, why) of the first kernel that set a weight's layout


def layout_stats() -> dict[str, int]:
    """``weight_relayouts``: weights relayouted in place; ``weights_kept``: calls that left a weight as it
    is (a view of a larger storage, a new layout that would not fit its allocation, or a storage that an
    earlier kernel already wants sticked otherwise, e.g. a tied embedding + lm_head)."""
    with _stats_lock:
        return dict(_stats)


def reset_layout_stats() -> None:
    with _stats_lock:
        _stats.clear()


def _count(key: str) -> None:
    with _stats_lock:
        _stats[key] += 1


def ensure_weight_layout(t: Any, stick_dim: int, host_shape: tuple[int, ...], reason: str) -> None:
    """Called by the generated wrapper before the kernels: relayout weight ``t`` in place so that dim
    ``stick_dim`` of its dense host shape ``host_shape`` is sticked, unless it already is (the cheap check
    every later call makes). A weight that is a view of a larger storage, or whose new layout would need
    more device bytes than its allocation has, keeps its layout (the kernels read it as it lies)."""
    from ..card.layout import StickLayout
    from ..device import storage, tensor
    from . import debug
    from .relayout import RelayoutError, relayout_in_place

    if t.device.type != "spyre":
        raise RelayoutError(f"ensure_weight_layout expects a spyre tensor, got one on {t.device}: the graph was "
                            "compiled for this input on a spyre device; move it there (module.to('spyre'))")
    alloc = storage.allocation_of(t)
    if alloc is None:
        return
    layout = alloc.meta["layout"]
    if layout.host_shape == tuple(host_shape) and layout.stick_dim == stick_dim:
        alloc.meta.setdefault(_CLAIM, (stick_dim, reason))
        return
    claim = alloc.meta.get(_CLAIM)
    if claim is not None and claim[0] != stick_dim:
        # Another kernel (this graph, through an aliased input, or another graph) wants this storage
        # sticked otherwise and had it first: relayouting would ping-pong on every call.
        _count("weights_kept")
        return
    if layout.host_shape != tuple(host_shape) or not tensor.get_layout(t).is_whole:
        _count("weights_kept")  # a view of a larger storage: relayouting it would move other tensors' sticks
        return
    if StickLayout(layout.host_shape, stick_dim, layout.device_dtype).nbytes > alloc.nbytes:
        _count("weights_kept")
        return
    record = relayout_in_place(t, stick_dim, reason)
    alloc.meta[_CLAIM] = (stick_dim, reason)
    _count("weight_relayouts")
    if record is not None and debug.enabled():
        _dump_weight_relayout(t, layout, stick_dim, reason, record)


def _dump_weight_relayout(t: Any, old: Any, stick_dim: int, reason: str, record: Any) -> None:
    """The relayout program's debug files, with why it ran (``TORCH_SPYRE_DEBUG=1``)."""
    from ..device import storage
    from ..program import Program
    from . import debug
    from .relayout import _prepared_relayout, onchip_fallback

    card = t.device.index or 0
    new = storage.allocation_of(t).meta["layout"]
    onchip = record.program.endswith("_onchip")
    program = _prepared_relayout(card, old, new, in_place=onchip).program
    meta = dict(program.metadata)
    d = dict(meta.get("decisions", {}))
    how = ("on chip: no copy back" if onchip else
           f"+ the copy back into its allocation; not on chip: {onchip_fallback(old, new, card)}")
    d["notes"] = list(d.get("notes", [])) + [f"weight {list(t.shape)} relayouted in place: {reason}",
                                             f"simulated {round((record.end - record.start) * 1e6, 2)} us once "
                                             f"({how})"]
    meta["decisions"] = d
    debug.dump_kernel(None, Program(program.name, program.operands, program.cores, meta))


def relayout_buffer(t: Any, stick_dim: int) -> Any:
    """Called by the generated wrapper where the plan inserted a relayout: ``t``'s values in a new
    allocation sticked on ``stick_dim`` (the relayout program, timed on the current stream: the on-chip
    exchange or the device-memory kernel, whichever the timing model finds faster, ``relayout.copy_choice``)."""
    from .relayout import relayout

    _count("relayout_kernels")
    return relayout(t, stick_dim)


def note_plan(name: str, plan_json: str) -> None:
    """Called once when a generated wrapper module loads: writes the plan's decisions
    (``<name>.decisions.txt``) when ``TORCH_SPYRE_DEBUG=1``."""
    import os

    from . import debug

    if not debug.enabled() or name in _dumped:
        return
    _dumped.add(name)
    out = debug.debug_dir()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.decisions.txt"), "w") as f:
        f.write(LayoutPlan.from_json(plan_json).decisions(name).format() + "\n")


__all__ = ["BufferInfo", "Choice", "Costs", "LayoutPlan", "Operand", "ensure_weight_layout", "layout_stats",
           "note_plan", "plan_layouts", "relayout_buffer", "reset_layout_stats"]

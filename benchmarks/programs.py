"""Hand-written Spyre programs: the card's examples, tests and calibration workloads.

Every ``build_*`` returns a :class:`Built` ``(program, make_inputs, reference)``:
- ``program``: the :class:`~torch_spyre.program.Program`;
- ``make_inputs(seed=0)``: a dict operand name -> CPU tensor (fp16 for dlfloat16 operands);
- ``reference(inputs)``: a dict operand name -> the expected result, computed with torch on the CPU.

:func:`run_on_card` runs a built program end to end on a :class:`~torch_spyre.card.Card`: allocate
the operands, write the inputs in their stick layouts, validate, execute, read the outputs back.

All tensors here are 2-D (or 1-D) and sticked on their last dimension, IBM's default layout: a host
``[R, C]`` tensor lives on the device as ``[C / lanes sticks, R rows, lanes]``, so stick ``s`` of row
``r`` is at byte ``(s * R + r) * 128``. A block of rows and sticks is then one 2-loop DMA pattern.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from torch_spyre.card.dlfloat16 import from_float32, to_float32
from torch_spyre.card.execute import ExecutionStats, execute, resolve_addresses
from torch_spyre.card.layout import StickLayout
from torch_spyre.card.validate import validate
from torch_spyre.program import (
    STICK_BYTES,
    Addr,
    DmaLoad,
    DmaPattern,
    DmaStore,
    Elementwise,
    Instruction,
    MatMul,
    Operand,
    Program,
    Reduce,
    RingRecv,
    RingSend,
    Scalar,
    SpTensor,
)

DL = "dlfloat16"
F32 = "float32"


class Built(NamedTuple):
    program: Program
    make_inputs: Callable[..., dict[str, torch.Tensor]]
    reference: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceTensor:
    """A program operand holding a 1-D or 2-D host tensor sticked on its last dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: str = DL
    access: str = "in"

    @property
    def layout(self) -> StickLayout:
        return StickLayout(self.shape, len(self.shape) - 1, self.dtype)

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def lanes(self) -> int:
        return self.layout.lanes

    def operand(self) -> Operand:
        return Operand(self.name, self.layout.nbytes, self.access, self.dtype, self.shape, len(self.shape) - 1)

    def pattern(self, r0: int, nr: int, s0: int, ns: int, sticks_outer: bool = False) -> tuple[int, DmaPattern]:
        """Rows [r0, r0+nr) x sticks [s0, s0+ns): the device offset and the DMA pattern. In scratchpad the
        block is row-major [nr, ns * lanes], or with ``sticks_outer`` stick-major [ns, nr, lanes]."""
        if r0 + nr > self.rows or s0 + ns > self.layout.n_sticks:
            raise ValueError(f"block rows {r0}+{nr}, sticks {s0}+{ns} is outside {self.name}{list(self.shape)}")
        row, stick = STICK_BYTES, self.rows * STICK_BYTES
        if sticks_outer:
            pat = DmaPattern((ns, nr), (stick, row), (nr * STICK_BYTES, STICK_BYTES))
        else:
            pat = DmaPattern((nr, ns), (row, stick), (ns * STICK_BYTES, STICK_BYTES))
        return (s0 * self.rows + r0) * STICK_BYTES, pat

    def load(self, sp_offset: int, r0: int, nr: int, c0: int, nc: int, sticks_outer: bool = False) -> DmaLoad:
        """Load rows [r0, r0+nr) x columns [c0, c0+nc) (whole sticks) to scratchpad."""
        off, pat = self.pattern(r0, nr, *self._sticks(c0, nc), sticks_outer)
        return DmaLoad(Addr(self.name, off), sp_offset, pat)

    def store(self, sp_offset: int, r0: int, nr: int, c0: int, nc: int, sticks_outer: bool = False) -> DmaStore:
        off, pat = self.pattern(r0, nr, *self._sticks(c0, nc), sticks_outer)
        return DmaStore(Addr(self.name, off), sp_offset, pat)

    def _sticks(self, c0: int, nc: int) -> tuple[int, int]:
        if c0 % self.lanes or nc % self.lanes:
            raise ValueError(f"columns {c0}+{nc} of {self.name} are not whole sticks of {self.lanes}")
        return c0 // self.lanes, nc // self.lanes


class Scratch:
    """A bump allocator of stick-aligned scratchpad buffers for one core."""

    def __init__(self) -> None:
        self.top = 0

    def alloc(self, dtype: str, shape: tuple[int, ...]) -> SpTensor:
        t = SpTensor(self.top, dtype, shape)
        self.top += -(-t.numel * t.itemsize // STICK_BYTES) * STICK_BYTES
        return t


def view(t: SpTensor, shape: tuple[int, ...], strides: tuple[int, ...], elem_offset: int = 0) -> SpTensor:
    """Another view of ``t``'s bytes (e.g. a stride-0 broadcast, a transpose, a column slice)."""
    return SpTensor(t.offset + elem_offset * t.itemsize, t.dtype, shape, strides)


def rows_bcast(col: SpTensor, cols: int) -> SpTensor:
    """A [R, 1] tensor broadcast across ``cols`` columns."""
    return view(col, (col.shape[0], cols), (col.strides[0], 0))


def cols_bcast(row: SpTensor, rows: int) -> SpTensor:
    """A [1, C] (or [C]) tensor broadcast down ``rows`` rows."""
    return view(row, (rows, row.shape[-1]), (0, row.strides[-1]))


def ew(op: str, out: SpTensor, *inputs: SpTensor | float) -> Elementwise:
    return Elementwise(op, out, tuple(x if isinstance(x, SpTensor) else Scalar(x) for x in inputs))


def _program(name: str, tensors: list[DeviceTensor], cores: dict[int, list[Instruction]], **meta: Any) -> Program:
    return Program(name, [t.operand() for t in tensors], cores, dict(meta))


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).half()


# ---------------------------------------------------------------------------------------------
# Running a built program
# ---------------------------------------------------------------------------------------------
def encode(values: torch.Tensor | np.ndarray, device_dtype: str) -> np.ndarray:
    """Host values in the card's representation of ``device_dtype`` (fp16 -> DLFloat16 bits)."""
    arr = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if device_dtype == DL:
        return from_float32(arr.astype(np.float32))
    return arr.astype(StickLayout((1,), 0, device_dtype).storage_dtype)


def decode(bits: np.ndarray, device_dtype: str) -> torch.Tensor:
    if device_dtype == DL:
        return torch.from_numpy(to_float32(bits))
    return torch.from_numpy(np.array(bits))


def operand_layout(op: Operand) -> StickLayout:
    if op.device_dtype is None or op.host_shape is None:
        raise ValueError(f"operand %{op.name} does not describe its data (device_dtype, host_shape, stick_dim)")
    return StickLayout(op.host_shape, op.stick_dim if op.stick_dim is not None else -1, op.device_dtype)


def run_on_card(card: Any, program: Program, inputs: dict[str, torch.Tensor], check: bool = True,
                times: dict[str, float] | None = None) -> tuple[dict[str, torch.Tensor], ExecutionStats]:
    """Allocate every operand on ``card``, write ``inputs``, validate and execute ``program``, and return
    the out/inout operands as CPU tensors (float32 for dlfloat16) with the execution stats. ``times``,
    if given, receives ``execute_s``: the host seconds spent in :func:`execute` alone."""
    if check:
        validate(program, card.config)
    allocs = {op.name: card.memory.allocate(op.nbytes) for op in program.operands}
    try:
        for op in program.operands:
            if op.name in inputs:
                lay = operand_layout(op)
                card.memory.write(allocs[op.name].address, lay.pack(encode(inputs[op.name], op.device_dtype)))
        bases = {name: a.address for name, a in allocs.items()}
        addresses = resolve_addresses(program, bases)
        start = time.perf_counter()
        stats = execute(card, program, addresses)
        if times is not None:
            times["execute_s"] = time.perf_counter() - start
        outputs = {}
        for op in program.operands:
            if op.access in ("out", "inout"):
                lay = operand_layout(op)
                raw = card.memory.read(allocs[op.name].address, lay.nbytes).view(lay.storage_dtype)
                outputs[op.name] = decode(lay.unpack(raw), op.device_dtype).reshape(op.host_shape)
        return outputs, stats
    finally:
        for a in allocs.values():
            card.memory.free(a)


# ---------------------------------------------------------------------------------------------
# (a) elementwise: y = exp(x) * 2 + 1
# ---------------------------------------------------------------------------------------------
def build_elementwise(rows: int = 512, cols: int = 1024, num_cores: int = 32) -> Built:
    """Rows split evenly over cores; exp into an fp32 temporary, then one fma rounds once to fp16."""
    x, y = DeviceTensor("x", (rows, cols)), DeviceTensor("y", (rows, cols), access="out")
    per = rows // num_cores
    cores = {}
    for c in range(num_cores):
        sp = Scratch()
        xs, ts, ys = sp.alloc(DL, (per, cols)), sp.alloc(F32, (per, cols)), sp.alloc(DL, (per, cols))
        cores[c] = [
            x.load(xs.offset, c * per, per, 0, cols),
            ew("exp", ts, xs),
            ew("fma", ys, ts, 2.0, 1.0),
            y.store(ys.offset, c * per, per, 0, cols),
        ]
    prog = _program(f"elementwise_exp_{rows}x{cols}", [x, y], cores, expression="y = exp(x) * 2 + 1")

    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        return {"x": _randn(torch.Generator().manual_seed(seed), rows, cols, scale=2.0)}

    def reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"y": inp["x"].float().exp() * 2 + 1}

    return Built(prog, make_inputs, reference)


# ---------------------------------------------------------------------------------------------
# (b) reduction: row sums and row maxima
# ---------------------------------------------------------------------------------------------
def build_row_reduce(rows: int = 512, cols: int = 1024) -> Built:
    """64 rows per core, so that each core's results fill exactly one output stick (1-D outputs)."""
    per = 64
    x = DeviceTensor("x", (rows, cols))
    s, m = DeviceTensor("row_sum", (rows,), access="out"), DeviceTensor("row_max", (rows,), access="out")
    cores = {}
    for c in range(rows // per):
        sp = Scratch()
        xs = sp.alloc(DL, (per, cols))
        acc, sums, maxes = sp.alloc(F32, (per, 1)), sp.alloc(DL, (per, 1)), sp.alloc(DL, (per, 1))
        cores[c] = [
            x.load(xs.offset, c * per, per, 0, cols),
            Reduce("sum", acc, xs, axis=1),  # fp32 accumulation
            ew("cast", sums, acc),
            Reduce("max", maxes, xs, axis=1),
            s.store(sums.offset, 0, 1, c * per, per),
            m.store(maxes.offset, 0, 1, c * per, per),
        ]
    prog = _program(f"row_reduce_{rows}x{cols}", [x, s, m], cores)

    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        return {"x": _randn(torch.Generator().manual_seed(seed), rows, cols)}

    def reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        xf = inp["x"].float()
        return {"row_sum": xf.sum(1), "row_max": xf.amax(1)}

    return Built(prog, make_inputs, reference)


# ---------------------------------------------------------------------------------------------
# Matmuls
# ---------------------------------------------------------------------------------------------
def _matmul_operands(M: int, K: int, N: int) -> tuple[DeviceTensor, DeviceTensor, DeviceTensor]:
    # Activations sticked on K, weights and output on N: the layouts the PE arrays stream.
    return DeviceTensor("a", (M, K)), DeviceTensor("b", (K, N)), DeviceTensor("c", (M, N), access="out")


def _matmul_reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"c": inp["a"].float() @ inp["b"].float()}


def _matmul_inputs(M: int, K: int, N: int) -> Callable[..., dict[str, torch.Tensor]]:
    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        # Scaled so that c has unit variance whatever K is.
        return {"a": _randn(g, M, K), "b": _randn(g, K, N, scale=1 / math.sqrt(K))}

    return make_inputs


def build_matmul(M: int = 1024, K: int = 1024, N: int = 1024, grid: tuple[int, int] = (4, 8)) -> Built:
    """c = a @ b, output tiles on a grid_m x grid_n core grid; each core holds its whole K in scratchpad
    and runs one matmul (fp32 accumulation, rounded once to fp16)."""
    a, b, c = _matmul_operands(M, K, N)
    gm, gn = grid
    tm, tn = M // gm, N // gn
    cores = {}
    for core in range(gm * gn):
        mi, ni = divmod(core, gn)
        sp = Scratch()
        As, Bs, Cs = sp.alloc(DL, (tm, K)), sp.alloc(DL, (K, tn)), sp.alloc(DL, (tm, tn))
        cores[core] = [
            a.load(As.offset, mi * tm, tm, 0, K),
            b.load(Bs.offset, 0, K, ni * tn, tn),
            MatMul(Cs, As, Bs),
            c.store(Cs.offset, mi * tm, tm, ni * tn, tn),
        ]
    prog = _program(f"matmul_{M}x{K}x{N}", [a, b, c], cores, grid=list(grid))
    return Built(prog, _matmul_inputs(M, K, N), _matmul_reference)


def build_matmul_1024() -> Built:
    """(e) The 1024^3 fp16 matmul over 32 cores: 256x128 output tiles."""
    return build_matmul(1024, 1024, 1024, (4, 8))


def build_matmul_ksplit(M: int = 256, K: int = 1024, N: int = 256, tile: int = 64) -> Built:
    """(c) 16 output tiles x 2 halves of K = 32 cores. The odd core of each pair sends its fp32 partial
    sum over the reduction ring to its even neighbour, which adds it and stores the tile: partners sit
    next to each other on the ring, as IBM's K-split placement puts them."""
    a, b, c = _matmul_operands(M, K, N)
    gn = N // tile
    kh = K // 2
    cores = {}
    for core in range((M // tile) * gn * 2):
        t, half = divmod(core, 2)
        mi, ni = divmod(t, gn)
        sp = Scratch()
        As, Bs = sp.alloc(DL, (tile, kh)), sp.alloc(DL, (kh, tile))
        part, recv, out = sp.alloc(F32, (tile, tile)), sp.alloc(F32, (tile, tile)), sp.alloc(DL, (tile, tile))
        ins: list[Instruction] = [
            a.load(As.offset, mi * tile, tile, half * kh, kh),
            b.load(Bs.offset, half * kh, kh, ni * tile, tile),
            MatMul(part, As, Bs),
        ]
        nbytes = tile * tile * 4
        if half:
            ins.append(RingSend(core - 1, part.offset, recv.offset, nbytes, tag=t, network="reduce"))
        else:
            ins += [
                RingRecv(core + 1, tag=t),
                ew("add", out, part, recv),
                c.store(out.offset, mi * tile, tile, ni * tile, tile),
            ]
        cores[core] = ins
    prog = _program(f"matmul_ksplit_{M}x{K}x{N}", [a, b, c], cores, k_split=2)
    return Built(prog, _matmul_inputs(M, K, N), _matmul_reference)


# ---------------------------------------------------------------------------------------------
# (d) ring exchange: all-to-all
# ---------------------------------------------------------------------------------------------
def build_all_to_all(num_cores: int = 32, piece_rows: int = 16) -> Built:
    """Core i holds rows [i*P, (i+1)*P) of x [n*P, n*64]; piece j is its stick column j. Core i sends
    piece j to core j, so y[j*P + p, i*64 + l] = x[i*P + p, j*64 + l]: a block transpose on chip."""
    n, P = num_cores, piece_rows
    x, y = DeviceTensor("x", (n * P, n * 64)), DeviceTensor("y", (n * P, n * 64), access="out")
    piece = P * STICK_BYTES
    cores = {}
    for i in range(n):
        sp = Scratch()
        send, recv = sp.alloc(DL, (n, P, 64)), sp.alloc(DL, (n, P, 64))
        ins: list[Instruction] = [x.load(send.offset, i * P, P, 0, n * 64, sticks_outer=True)]
        ins += [RingSend(j, send.offset + j * piece, recv.offset + i * piece, piece, tag=0)
                for j in range(n) if j != i]
        own = lambda base: SpTensor(base + i * piece, DL, (P, 64))  # noqa: E731
        ins.append(ew("copy", own(recv.offset), own(send.offset)))
        ins += [RingRecv(j, tag=0) for j in range(n) if j != i]
        ins.append(y.store(recv.offset, i * P, P, 0, n * 64, sticks_outer=True))
        cores[i] = ins
    prog = _program(f"all_to_all_{n}x{P}", [x, y], cores)

    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        # Multiples of 1/8 below 64: exact in fp16 and in DLFloat16, so the exchange is bit-exact.
        g = torch.Generator().manual_seed(seed)
        return {"x": (torch.randint(-512, 512, (n * P, n * 64), generator=g) / 8).half()}

    def reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"y": inp["x"].float().reshape(n, P, n, 64).permute(2, 1, 0, 3).reshape(n * P, n * 64)}

    return Built(prog, make_inputs, reference)


# ---------------------------------------------------------------------------------------------
# (g) softmax of 512x1024 on one core, two ways
# ---------------------------------------------------------------------------------------------
SOFTMAX_CHUNK = 64  # rows per chunk: one output stick of row statistics


def _softmax_io(rows: int, cols: int) -> tuple[DeviceTensor, DeviceTensor]:
    return DeviceTensor("x", (rows, cols)), DeviceTensor("y", (rows, cols), access="out")


def _softmax_inputs(rows: int, cols: int) -> Callable[..., dict[str, torch.Tensor]]:
    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        return {"x": _randn(torch.Generator().manual_seed(seed), rows, cols, scale=2.0)}

    return make_inputs


def _softmax_reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"y": torch.softmax(inp["x"].float(), dim=1)}


def build_softmax_scratchpad(rows: int = 512, cols: int = 1024) -> Built:
    """Softmax with every intermediate planned in scratchpad: per 64-row chunk, load x, then max, x - max,
    exp, sum, reciprocal and scale on chip, and store y. Two buffer sets alternate between chunks so a
    timing model may overlap one chunk's DMA with the other's compute."""
    x, y = _softmax_io(rows, cols)
    R = SOFTMAX_CHUNK
    sp = Scratch()
    bufs = [(sp.alloc(DL, (R, cols)), sp.alloc(F32, (R, cols)), sp.alloc(DL, (R, cols)),
             sp.alloc(F32, (R, 1)), sp.alloc(F32, (R, 1))) for _ in range(2)]
    ins: list[Instruction] = []
    for k in range(rows // R):
        xs, e, ys, mx, sm = bufs[k % 2]
        ins += [
            x.load(xs.offset, k * R, R, 0, cols),
            Reduce("max", mx, xs, axis=1),
            ew("sub", e, xs, rows_bcast(mx, cols)),
            ew("exp", e, e),
            Reduce("sum", sm, e, axis=1),
            ew("reciprocal", sm, sm),
            ew("mul", ys, e, rows_bcast(sm, cols)),
            y.store(ys.offset, k * R, R, 0, cols),
        ]
    prog = _program(f"softmax_scratchpad_{rows}x{cols}", [x, y], {0: ins}, calibration="softmax 512x1024 fp16, "
                    "one core, scratchpad-planned: 23.67 us on a real card")
    return Built(prog, _softmax_inputs(rows, cols), _softmax_reference)


def build_softmax_roundtrip(rows: int = 512, cols: int = 1024, fuse_sub_exp: bool = True) -> Built:
    """Softmax as unfused kernels run it, each a pass over the tensor whose result goes to device memory
    in fp16 and is loaded back by the next pass: amax, exp(x - max), sum, div (6MN + 4N elements of
    device-memory traffic for M rows of N). With ``fuse_sub_exp=False``, sub and exp are separate
    kernels too, the 8MN + 4N elements IBM's scratchpad-planning page gives for its round trip.
    (The timing model's calibration, benchmarks/calibration.py, uses the default.)"""
    x, y = _softmax_io(rows, cols)
    row_max = DeviceTensor("row_max", (rows,), access="out")
    shifted = DeviceTensor("shifted", (rows, cols), access="out")
    exps = DeviceTensor("exps", (rows, cols), access="out")
    row_sum = DeviceTensor("row_sum", (rows,), access="out")
    R = SOFTMAX_CHUNK
    sp = Scratch()
    xs, ys = sp.alloc(DL, (R, cols)), sp.alloc(DL, (R, cols))
    st, acc = sp.alloc(DL, (R, 1)), sp.alloc(F32, (R, 1))
    chunks = range(rows // R)
    ins: list[Instruction] = []
    for k in chunks:  # amax
        ins += [x.load(xs.offset, k * R, R, 0, cols), Reduce("max", st, xs, axis=1),
                row_max.store(st.offset, 0, 1, k * R, R)]
    for k in chunks:  # exp(x - max) in one kernel, or x - max and then (below) exp
        ins += [x.load(xs.offset, k * R, R, 0, cols), row_max.load(st.offset, 0, 1, k * R, R),
                ew("sub", ys, xs, rows_bcast(st, cols))]
        ins += [ew("exp", ys, ys), exps.store(ys.offset, k * R, R, 0, cols)] if fuse_sub_exp else \
            [shifted.store(ys.offset, k * R, R, 0, cols)]
    if not fuse_sub_exp:
        for k in chunks:
            ins += [shifted.load(xs.offset, k * R, R, 0, cols), ew("exp", ys, xs),
                    exps.store(ys.offset, k * R, R, 0, cols)]
    for k in chunks:  # row sum (fp32 accumulation, stored as fp16)
        ins += [exps.load(xs.offset, k * R, R, 0, cols), Reduce("sum", acc, xs, axis=1), ew("cast", st, acc),
                row_sum.store(st.offset, 0, 1, k * R, R)]
    for k in chunks:  # divide
        ins += [exps.load(xs.offset, k * R, R, 0, cols), row_sum.load(st.offset, 0, 1, k * R, R),
                ew("div", ys, xs, rows_bcast(st, cols)), y.store(ys.offset, k * R, R, 0, cols)]
    intermediates = [row_max] + ([] if fuse_sub_exp else [shifted]) + [exps, row_sum]
    prog = _program(f"softmax_roundtrip_{rows}x{cols}" + ("" if fuse_sub_exp else "_5kernels"),
                    [x, y, *intermediates], {0: ins}, intermediates=[t.name for t in intermediates],
                    calibration="softmax 512x1024 fp16, one core, through device memory: 32.51 us on a real card")
    return Built(prog, _softmax_inputs(rows, cols), _softmax_reference)


# ---------------------------------------------------------------------------------------------
# (f) one MiniLM layer (all-MiniLM-L6: hidden 384, 12 heads of 32, intermediate 1536), seq 128
# ---------------------------------------------------------------------------------------------
SEQ, HIDDEN, HEADS, HEAD_DIM, FFN = 128, 384, 12, 32, 1536
LN_EPS = 1e-12


def build_linear(name: str, M: int, K: int, N: int, grid: tuple[int, int], activation: str | None = None,
                 residual: bool = False) -> Built:
    """out = act(x @ w + bias) (+ res): output tiles on a core grid, bias broadcast down the rows
    through a stride-0 view, everything in fp32 until one rounding to fp16 at the end."""
    x, w, bias = DeviceTensor("x", (M, K)), DeviceTensor("w", (K, N)), DeviceTensor("bias", (N,))
    res = DeviceTensor("res", (M, N))
    out = DeviceTensor("out", (M, N), access="out")
    gm, gn = grid
    tm, tn = M // gm, N // gn
    cores = {}
    for core in range(gm * gn):
        mi, ni = divmod(core, gn)
        sp = Scratch()
        xs, ws, bs = sp.alloc(DL, (tm, K)), sp.alloc(DL, (K, tn)), sp.alloc(DL, (1, tn))
        acc, os = sp.alloc(F32, (tm, tn)), sp.alloc(DL, (tm, tn))
        ins: list[Instruction] = [
            x.load(xs.offset, mi * tm, tm, 0, K),
            w.load(ws.offset, 0, K, ni * tn, tn),
            bias.load(bs.offset, 0, 1, ni * tn, tn),
            MatMul(acc, xs, ws),
        ]
        steps: list[tuple[str, list[SpTensor]]] = [("add", [acc, cols_bcast(bs, tm)])]
        if activation:
            steps.append((activation, [acc]))
        if residual:
            rs = sp.alloc(DL, (tm, tn))
            ins.append(res.load(rs.offset, mi * tm, tm, ni * tn, tn))
            steps.append(("add", [acc, rs]))
        # fp32 in between; only the last step rounds, into the fp16 output tile.
        ins += [ew(op, os if n == len(steps) - 1 else acc, *args) for n, (op, args) in enumerate(steps)]
        ins.append(out.store(os.offset, mi * tm, tm, ni * tn, tn))
        cores[core] = ins
    tensors = [x, w, bias] + ([res] if residual else []) + [out]
    prog = _program(name, tensors, cores, grid=list(grid), activation=activation, residual=residual)

    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        inp = {"x": _randn(g, M, K), "w": _randn(g, K, N, scale=1 / math.sqrt(K)), "bias": _randn(g, N, scale=0.1)}
        if residual:
            inp["res"] = _randn(g, M, N)
        return inp

    def reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        o = inp["x"].float() @ inp["w"].float() + inp["bias"].float()
        if activation:
            o = {"gelu": torch.nn.functional.gelu, "relu": torch.relu, "silu": torch.nn.functional.silu,
                 "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[activation](o)
        if residual:
            o = o + inp["res"].float()
        return {"out": o}

    return Built(prog, make_inputs, reference)


def build_attention(seq: int = SEQ, heads: int = HEADS, head_dim: int = HEAD_DIM) -> Built:
    """ctx = softmax(q k^T / sqrt(d)) v for every head, from the fused qkv projection [seq, 3 * hidden].
    One core per stick of head columns (64 / head_dim heads): it loads that stick of q, k and v; a
    head's q and v are column slices of the stick and k^T is a transposed view, so no relayout is needed."""
    hidden = heads * head_dim
    per_stick = 64 // head_dim
    qkv = DeviceTensor("qkv", (seq, 3 * hidden))
    ctx = DeviceTensor("ctx", (seq, hidden), access="out")
    n_sticks = hidden // 64
    cores = {}
    for c in range(n_sticks):
        sp = Scratch()
        q, k, v = (sp.alloc(DL, (seq, 64)) for _ in range(3))
        s, p, o = sp.alloc(F32, (seq, seq)), sp.alloc(DL, (seq, seq)), sp.alloc(DL, (seq, 64))
        mx, sm = sp.alloc(F32, (seq, 1)), sp.alloc(F32, (seq, 1))
        ins: list[Instruction] = [
            qkv.load(q.offset, 0, seq, c * 64, 64),
            qkv.load(k.offset, 0, seq, hidden + c * 64, 64),
            qkv.load(v.offset, 0, seq, 2 * hidden + c * 64, 64),
        ]
        for j in range(per_stick):
            col = j * head_dim
            qh, vh, oh = (view(t, (seq, head_dim), (64, 1), col) for t in (q, v, o))
            kt = view(k, (head_dim, seq), (1, 64), col)  # k^T through strides
            ins += [
                MatMul(s, qh, kt),
                ew("mul", s, s, 1.0 / math.sqrt(head_dim)),
                Reduce("max", mx, s, axis=1),
                ew("sub", s, s, rows_bcast(mx, seq)),
                ew("exp", s, s),
                Reduce("sum", sm, s, axis=1),
                ew("reciprocal", sm, sm),
                ew("mul", p, s, rows_bcast(sm, seq)),
                MatMul(oh, p, vh),
            ]
        ins.append(ctx.store(o.offset, 0, seq, c * 64, 64))
        cores[c] = ins
    prog = _program(f"attention_{heads}x{head_dim}_seq{seq}", [qkv, ctx], cores)

    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        return {"qkv": _randn(torch.Generator().manual_seed(seed), seq, 3 * hidden)}

    def reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        q, k, v = inp["qkv"].float().reshape(seq, 3, heads, head_dim).permute(1, 2, 0, 3)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), dim=-1)
        return {"ctx": (att @ v).permute(1, 0, 2).reshape(seq, hidden)}

    return Built(prog, make_inputs, reference)


def build_layernorm(rows: int = SEQ, cols: int = HIDDEN, num_cores: int = 32, eps: float = LN_EPS) -> Built:
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dimension, rows split over cores."""
    x, y = DeviceTensor("x", (rows, cols)), DeviceTensor("y", (rows, cols), access="out")
    gamma, beta = DeviceTensor("gamma", (cols,)), DeviceTensor("beta", (cols,))
    per = rows // num_cores
    cores = {}
    for c in range(num_cores):
        sp = Scratch()
        xs, gs, bs = sp.alloc(DL, (per, cols)), sp.alloc(DL, (1, cols)), sp.alloc(DL, (1, cols))
        d, sq, ys = sp.alloc(F32, (per, cols)), sp.alloc(F32, (per, cols)), sp.alloc(DL, (per, cols))
        mean, var = sp.alloc(F32, (per, 1)), sp.alloc(F32, (per, 1))
        cores[c] = [
            x.load(xs.offset, c * per, per, 0, cols),
            gamma.load(gs.offset, 0, 1, 0, cols),
            beta.load(bs.offset, 0, 1, 0, cols),
            # Two passes, as torch does: the mean, then the variance of the centred values.
            Reduce("sum", mean, xs, axis=1),
            ew("mul", mean, mean, 1.0 / cols),
            ew("sub", d, xs, rows_bcast(mean, cols)),
            ew("square", sq, d),
            Reduce("sum", var, sq, axis=1),
            ew("fma", var, var, 1.0 / cols, eps),
            ew("rsqrt", var, var),
            ew("mul", d, d, rows_bcast(var, cols)),
            ew("fma", ys, d, cols_bcast(gs, per), cols_bcast(bs, per)),
            y.store(ys.offset, c * per, per, 0, cols),
        ]
    prog = _program(f"layernorm_{rows}x{cols}", [x, gamma, beta, y], cores, eps=eps)

    def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {"x": _randn(g, rows, cols, scale=2.0), "gamma": (1 + _randn(g, cols, scale=0.1).float()).half(),
                "beta": _randn(g, cols, scale=0.1)}

    def reference(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"y": torch.nn.functional.layer_norm(inp["x"].float(), (cols,), inp["gamma"].float(),
                                                    inp["beta"].float(), eps)}

    return Built(prog, make_inputs, reference)


def build_minilm_layer() -> dict[str, Built]:
    """The seven programs of one MiniLM encoder layer at batch 1, seq 128, in execution order:
    qkv projection, attention, output projection (+ residual), layer norm, FFN up with GELU,
    FFN down (+ residual), layer norm. Each is checked alone against torch."""
    return {
        "qkv_proj": build_linear("minilm_qkv_proj", SEQ, HIDDEN, 3 * HIDDEN, (1, 18)),
        "attention": build_attention(),
        "out_proj": build_linear("minilm_out_proj", SEQ, HIDDEN, HIDDEN, (2, 6), residual=True),
        "ln1": build_layernorm(),
        "ffn_up": build_linear("minilm_ffn_up", SEQ, HIDDEN, FFN, (1, 24), activation="gelu"),
        "ffn_down": build_linear("minilm_ffn_down", SEQ, FFN, HIDDEN, (4, 6), residual=True),
        "ln2": build_layernorm(),
    }


ALL_BUILDERS: dict[str, Callable[[], Built]] = {
    "elementwise": build_elementwise,
    "row_reduce": build_row_reduce,
    "matmul_ksplit": build_matmul_ksplit,
    "all_to_all": build_all_to_all,
    "matmul_1024": build_matmul_1024,
    "softmax_scratchpad": build_softmax_scratchpad,
    "softmax_roundtrip": build_softmax_roundtrip,
    **{f"minilm_{k}": (lambda k=k: build_minilm_layer()[k]) for k in
       ("qkv_proj", "attention", "out_proj", "ln1", "ffn_up", "ffn_down", "ln2")},
}


# ---------------------------------------------------------------------------------------------
# python -m benchmarks.programs [name ...]: run each program, compare with torch, report host time
# ---------------------------------------------------------------------------------------------
def _main(argv: list[str] | None = None) -> int:
    import argparse

    from torch_spyre.card import Card, load_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"programs to run (default: all): {', '.join(ALL_BUILDERS)}")
    parser.add_argument("--print", action="store_true", help="print each program")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ALL_BUILDERS]
    if unknown:
        parser.error(f"unknown program(s) {', '.join(unknown)}; known: {', '.join(ALL_BUILDERS)}")
    card = Card(0, load_config())
    print(f"{'program':22s} {'cores':>5s} {'instrs':>6s} {'rel err':>8s} {'execute ms':>10s} {'round trip ms':>13s}")
    for name in args.names or list(ALL_BUILDERS):
        built = ALL_BUILDERS[name]()
        if args.print:
            print(built.program)
        inputs = built.make_inputs(0)
        run_on_card(card, built.program, inputs)  # warm up: scratchpads, lookup tables
        times: dict[str, float] = {}
        start = time.perf_counter()
        outputs, _ = run_on_card(card, built.program, inputs, times=times)
        elapsed = time.perf_counter() - start
        # Largest error relative to the largest reference value of that output.
        err = max(float((outputs[k] - v.float()).abs().max() / v.float().abs().max().clamp_min(1e-30))
                  for k, v in built.reference(inputs).items())
        n_instr = sum(len(v) for v in built.program.cores.values())
        print(f"{name:22s} {len(built.program.cores):5d} {n_instr:6d} {err:8.1e} {times['execute_s'] * 1e3:10.1f} "
              f"{elapsed * 1e3:13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

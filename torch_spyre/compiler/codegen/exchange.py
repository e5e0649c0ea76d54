"""On-chip relayout: a 2-D tensor's stick dim swapped while it passes through the cores' scratchpads,
its 64x64 (fp16; 32x32 fp32) stick blocks exchanged between cores over the ring.

Each core loads one contiguous range of the source's sticks (device order) and stores one contiguous
range of the destination's. A destination stick needs a lane from each of ``lanes`` source sticks (its
block), which other cores loaded: every core sends each peer the pieces of the blocks that peer stores
(an all-to-all over the data ring, nearest peers first, both directions), transposes the blocks it
receives on the vector unit and stores its range. Nothing goes through device memory in between, which
is what makes an *in-place* relayout possible without a scratch allocation and a copy back: every core
has loaded its range before any core stores (a barrier, since a core need not receive from all).

:func:`why_not` says why a relayout cannot be done this way (the caller falls back to the device-memory
path and records the reason); :func:`onchip_relayout_program` builds the program. The ring transfers are
timed by the card's timing model at the card's ring figures (``ring_bytes_per_cycle``, hop latency).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...card.config import CardConfig
from ...card.layout import StickLayout
from ...program import (STICK_BYTES, Addr, Barrier, DmaLoad, DmaPattern, DmaStore, Elementwise, Instruction,
                        Operand, Program, RingRecv, RingSend, Scalar, SpTensor)
from ..core_count import cores_for, dma_cycles
from ..decisions import BufferDecision, KernelDecisions
from ..placement import cores_near_memory

RING_TAG, BARRIER_TAG = 40, 41
# The vector unit copies these bit for bit (a DLFloat16 code or an fp32 word moves unchanged).
DTYPES = ("dlfloat16", "float32")


@dataclass(frozen=True)
class _Geometry:
    """Source sticks (g, u) at g * U + u hold elements (u, g * L + lane) of the (outer, stick) plane;
    destination sticks (h, v) at h * V + v hold (h * L + lane, v): U is the source's outer size (the
    destination's stick dim), V the source's stick dim size, L the lanes."""

    U: int
    V: int
    L: int
    itemsize: int

    @property
    def src_sticks(self) -> int:
        return -(-self.V // self.L) * self.U

    @property
    def dst_sticks(self) -> int:
        return -(-self.U // self.L) * self.V

    def blocks(self, e0: int, e1: int) -> list[tuple[int, int, int, int]]:
        """The blocks (h, g) destination sticks [e0, e1) fall in, in order, with the destination range
        [v0, v1) of each that is in [e0, e1)."""
        out = []
        for h in range(e0 // self.V, (e1 - 1) // self.V + 1):
            lo, hi = max(e0, h * self.V) - h * self.V, min(e1, (h + 1) * self.V) - h * self.V
            for g in range(lo // self.L, (hi - 1) // self.L + 1):
                out.append((h, g, max(lo, g * self.L), min(hi, (g + 1) * self.L)))
        return out

    def block_rows(self, h: int) -> int:
        """Source sticks in block row h (the last is short when U is not a multiple of L)."""
        return min(self.L, self.U - h * self.L)


def _bounds(n: int, parts: int) -> list[int]:
    return [p * n // parts for p in range(parts + 1)]


def _geometry(src: StickLayout) -> _Geometry:
    U, V = (src.host_shape[0], src.host_shape[1]) if src.stick_dim == 1 else (src.host_shape[1], src.host_shape[0])
    return _Geometry(U, V, src.lanes, src.itemsize)


def _sp_need(geo: _Geometry, cores: int) -> int:
    """Scratchpad bytes of the busiest core: its source range, the blocks it receives, its output range."""
    a, e = _bounds(geo.src_sticks, cores), _bounds(geo.dst_sticks, cores)
    need = 0
    for p in range(cores):
        blocks = len(geo.blocks(e[p], e[p + 1])) if e[p + 1] > e[p] else 0
        need = max(need, (a[p + 1] - a[p] + blocks * geo.L + e[p + 1] - e[p]) * STICK_BYTES)
    return need


def choose_cores(src: StickLayout, config: CardConfig) -> tuple[Any, int | None]:
    """(the core count's :class:`CoreCount` for the copy's DMA work, the fewest cores at or above it
    whose scratchpads hold the exchange; None when even all of the card's do not)."""
    geo = _geometry(src)
    count = cores_for(dma_cycles(config, 2 * src.nbytes), config, parts=min(geo.src_sticks, geo.dst_sticks))
    for n in range(count.cores, count.available + 1):
        if _sp_need(geo, n) <= config.scratchpad_plannable_bytes:
            return count, n
    return count, None


def why_not(src: StickLayout, dst: StickLayout, config: CardConfig) -> str | None:
    """None when :func:`onchip_relayout_program` can move ``src`` to ``dst``, else why not."""
    if tuple(src.host_shape) != tuple(dst.host_shape) or src.device_dtype != dst.device_dtype:
        return f"a relayout keeps the host shape and dtype: {src.describe()} -> {dst.describe()}"
    if len(src.host_shape) != 2 or {src.stick_dim, dst.stick_dim} != {0, 1}:
        return (f"the on-chip exchange swaps the stick dim of a 2-D tensor; this relayout is "
                f"{src.describe()} -> {dst.describe()}")
    if src.device_dtype not in DTYPES:
        return f"the on-chip exchange copies {' and '.join(DTYPES)} bit for bit, not {src.device_dtype}"
    if 0 in src.host_shape:
        return "an empty tensor has nothing to exchange"
    _, cores = choose_cores(src, config)
    if cores is None:
        geo = _geometry(src)
        return (f"the exchange needs {_sp_need(geo, config.num_cores)} bytes of scratchpad on the busiest of all "
                f"{config.num_cores} cores, {config.scratchpad_plannable_bytes} are plannable")
    return None


def _peers(me: int, cores: int) -> list[int]:
    """Every other core index, nearest on the ring first, alternating directions (both ring lanes busy)."""
    order: list[int] = []
    for d in range(1, cores // 2 + 1):
        for q in ((me + d) % cores, (me - d) % cores):
            if q != me and q not in order:
                order.append(q)
    return order


def _pieces(geo: _Geometry, a0: int, a1: int, e0: int, e1: int) -> list[tuple[int, int, int]]:
    """What a core loading source sticks [a0, a1) sends to the core storing destination sticks [e0, e1):
    (offset in the sender's load buffer, offset in the receiver's block buffer, sticks), merged where
    contiguous on both sides."""
    out: list[list[int]] = []
    for k, (h, g, _, _) in enumerate(geo.blocks(e0, e1)):
        s0 = g * geo.U + h * geo.L
        lo, hi = max(a0, s0), min(a1, s0 + geo.block_rows(h))
        if lo >= hi:
            continue
        src, dst = lo - a0, k * geo.L + lo - s0
        if out and out[-1][0] + out[-1][2] == src and out[-1][1] + out[-1][2] == dst:
            out[-1][2] += hi - lo
        else:
            out.append([src, dst, hi - lo])
    return [(s, d, n) for s, d, n in out]


def onchip_relayout_program(src: StickLayout, dst: StickLayout, config: CardConfig, in_place: bool = False,
                            name: str = "spyre_onchip_relayout") -> Program:
    """The program moving a tensor stored as ``src`` into layout ``dst`` through the scratchpads and the
    ring. Operands ``src`` and ``dst``, or one ``t`` (``in_place``: the allocation is rewritten in the new
    layout). Raises ValueError when :func:`why_not` names a reason."""
    reason = why_not(src, dst, config)
    if reason:
        raise ValueError(f"no on-chip relayout for {src.describe()} -> {dst.describe()}: {reason}")
    geo = _geometry(src)
    count, n = choose_cores(src, config)
    assert n is not None
    phys = cores_near_memory(n, config)
    a, e = _bounds(geo.src_sticks, n), _bounds(geo.dst_sticks, n)
    S = STICK_BYTES
    dt = src.device_dtype
    src_op, dst_op = ("t", "t") if in_place else ("src", "dst")
    program: dict[int, list[Instruction]] = {}
    ring_bytes = sends = 0
    peak = 0
    for p in range(n):
        load, blocks = 0, geo.blocks(e[p], e[p + 1]) if e[p + 1] > e[p] else []
        stage = (a[p + 1] - a[p]) * S
        out = stage + len(blocks) * geo.L * S
        peak = max(peak, out + (e[p + 1] - e[p]) * S)
        ins: list[Instruction] = []
        if a[p + 1] > a[p]:
            ins.append(DmaLoad(Addr(src_op, a[p] * S), load, DmaPattern.contiguous(a[p + 1] - a[p])))
        for q in _peers(p, n):  # the pieces of q's blocks this core loaded
            for s, d, k in _pieces(geo, a[p], a[p + 1], e[q], e[q + 1]):
                q_stage = (a[q + 1] - a[q]) * S
                ins.append(RingSend(phys[q], load + s * S, q_stage + d * S, k * S, tag=RING_TAG))
                ring_bytes, sends = ring_bytes + k * S, sends + 1
        for s, d, k in _pieces(geo, a[p], a[p + 1], e[p], e[p + 1]):  # its own: a copy in scratchpad
            ins.append(Elementwise("copy", SpTensor(stage + d * S, dt, (k * geo.L,)),
                                   (SpTensor(load + s * S, dt, (k * geo.L,)),)))
        for q in _peers(p, n):
            ins += [RingRecv(phys[q], tag=RING_TAG)] * len(_pieces(geo, a[q], a[q + 1], e[p], e[p + 1]))
        if in_place:  # every core has loaded its range before any core overwrites the allocation
            ins.append(Barrier(BARRIER_TAG))
        for k, (h, g, v0, v1) in enumerate(blocks):
            rows, first = geo.block_rows(h), (h * geo.V + v0 - e[p]) * S
            ins.append(Elementwise("copy", SpTensor(out + first, dt, (v1 - v0, rows), (geo.L, 1)),
                                   (SpTensor(stage + (k * geo.L * geo.L + v0 - g * geo.L) * geo.itemsize, dt,
                                             (v1 - v0, rows), (1, geo.L)),)))
            if rows < geo.L:  # the destination's padding lanes: zeros, so whole sticks are stored
                ins.append(Elementwise("copy", SpTensor(out + first + rows * geo.itemsize, dt,
                                                        (v1 - v0, geo.L - rows), (geo.L, 1)), (Scalar(0.0),)))
        if e[p + 1] > e[p]:
            ins.append(DmaStore(Addr(dst_op, e[p] * S), out, DmaPattern.contiguous(e[p + 1] - e[p])))
        program[phys[p]] = ins
    described = dict(device_dtype=dt, host_shape=tuple(src.host_shape))
    operands = ([Operand("t", max(src.nbytes, dst.nbytes), "inout", **described)] if in_place else
                [Operand("src", src.nbytes, "in", stick_dim=src.stick_dim, **described),
                 Operand("dst", dst.nbytes, "out", stick_dim=dst.stick_dim, **described)])
    prog = Program(name, operands, program)
    d = KernelDecisions(
        name, "relayout",
        buffers=[BufferDecision(src_op, "input", src.describe()),
                 BufferDecision(dst_op, "output", dst.describe(), relayout_from=src.describe())],
        work_division={"cores": n, "scheme": "on-chip exchange over the ring", "in_place": in_place},
        core_count={**count.to_dict(), "cores": n,
                    "why": count.why() + ("" if n == count.cores else f"; {n} so that the exchange fits the "
                                          "scratchpads")},
        scratchpad={"peak_bytes": peak, "capacity": config.scratchpad_plannable_bytes},
        fusion={"onchip_relayout": f"{ring_bytes} bytes in {sends} ring sends between scratchpads, no device-memory "
                                   "round trip"},
        notes=[f"stick dim {src.stick_dim} -> {dst.stick_dim} on chip: each core loads a contiguous range of source "
               "sticks, sends its peers the pieces of their blocks over the ring, transposes on the vector unit "
               "and stores a contiguous range" + (" (in place, after a barrier)" if in_place else "")])
    prog.metadata["decisions"] = d.to_dict()
    return prog


__all__ = ["DTYPES", "choose_cores", "onchip_relayout_program", "why_not"]

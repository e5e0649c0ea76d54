"""Emission of attention: one core's (item, K/V block) steps as a software pipeline (QK^T of the next
block issued before the softmax and PV of this one), the online softmax, and the output stores."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.attention.plan import Tiling, WorkItem, _kv_lane_deltas, _member_cols
from torch_spyre.compiler.codegen.attention.spec import (
    L_FLOOR,
    MAX_CLAMP,
    NEG_INF,
    AttentionSpec,
    _Dims,
    _exp_in_input_dtype,
)
from torch_spyre.compiler.codegen.attention.tiles import _ceil_to, _mask_sticks, _tile_sticks
from torch_spyre.compiler.codegen.emitter import Emitter, elementwise
from torch_spyre.compiler.codegen.sticks import check_owns_sticks, dma_tile
from torch_spyre.program import STICK_BYTES, Barrier, Instruction, MatMul, Reduce, SpTensor


def _bcast_rows(col: SpTensor, cols: int) -> SpTensor:
    """A [R, 1] column broadcast across ``cols`` columns."""
    return SpTensor(col.offset, col.dtype, (col.shape[0], cols), (col.strides[0], 0))


@dataclass
class _Step:
    """One K/V block of one item, with the views its two halves share."""

    item: WorkItem
    parity: int  # item parity: q, acc, l buffers
    slot: int  # output tile: alternating, or one per item when stores are deferred
    bp: int  # block parity: k, v, s, p, mask and the small per-block columns
    k0: int
    nk: int
    first: bool
    last: bool
    kt: list[SpTensor] = field(default_factory=list)  # per batch: K^T [D, nk]
    v: list[SpTensor] = field(default_factory=list)  # per batch: V [nk, Dv]
    mask: SpTensor | None = None


class _CoreEmitter(Emitter):
    """Emits one core's instructions. The core's (item, block) steps form one software pipeline: the
    QK^T of step n+1 (and its loads) is issued before the softmax and PV of step n, so the PE arrays
    work on the next block while the vector unit does this one's softmax."""

    def __init__(self, spec: AttentionSpec, dims: _Dims, t: Tiling, mask: TensorView | None, buf: dict[str, int]):
        super().__init__(buf)
        self.spec, self.dims, self.t, self.mask = spec, dims, t, mask
        self.pdt = dims.dtype  # the dtype P is rounded to for the PE arrays
        self.exp_in_p = _exp_in_input_dtype(spec, dims)
        self.stats = {"blocks": 0, "causal_bias_blocks": 0, "skipped_blocks": 0}
        self.prev_nm: SpTensor | None = None
        self.q: list[tuple[int, int]] = []  # the item's Q tile: (row width, element offset) per member
        self.deferred: list[Instruction] = []  # output stores held to the end (out_slots > 2)

    def run(self, core: int, items: list[WorkItem]) -> list[Instruction]:
        self.core = core
        self._prologue()
        steps: list[_Step] = []
        for n, it in enumerate(items):
            self.stats["skipped_blocks"] += it.skipped
            for j, (k0, nk) in enumerate(it.k_blocks):
                steps.append(_Step(it, n % 2, n % self.t.out_slots, len(steps) % 2, k0, nk, j == 0,
                                   j == len(it.k_blocks) - 1))
        if steps:
            self._scores(steps[0])
        for n, st in enumerate(steps):
            if n + 1 < len(steps):
                self._scores(steps[n + 1])
            self._softmax_pv(st)
            if st.last:
                self._finish(st)
        if self.deferred:
            # A fence (a barrier of this core alone): the held stores start once every load is done.
            self.ins.append(Barrier(tag=self.core, cores=(self.core,)))
        return self.ins + self.deferred

    # --- set-up ----------------------------------------------------------------------------------
    def _prologue(self) -> None:
        d, t = self.dims, self.t
        if self.spec.is_causal:
            z = t.block_q + t.block_k
            self.ins += [elementwise("copy", self.sp("causal", "float32", (z,)), 0.0),
                         elementwise("copy", self.sp("causal", "float32", (z,), elem_offset=z), NEG_INF)]
        cols, rows = (d.Dv * t.lane_heads, t.rows() // t.lane_heads) if t.pack_out else (d.Dv, t.rows())
        wo = _ceil_to(cols, self.spec.out.lanes)
        if wo > cols:  # output padding lanes are stored with the row: give them a value once
            for p in range(t.out_slots):
                self.ew("copy", self.sp(f"o{p}", d.dtype, (rows, wo - cols), (wo, 1), cols), 0.0)

    def _load(self, arg: TensorView, bufname: str, batches: tuple[int, ...], heads: tuple[int, ...], r0: int, n: int,
              ncols: int) -> tuple[int, int]:
        """Load rows [r0, r0+n) of (batch, head) pairs stacked in a tile; return (row width, lane offset)."""
        dev, lane0 = _tile_sticks(arg, batches, heads, r0, n, 0, ncols)
        self.ins += dma_tile(arg, dev, self.buf[bufname], store=False)
        return dev.shape[-1] * arg.lanes, lane0

    def _load_members(self, arg: TensorView, bufname: str, role: str, it: WorkItem, heads: tuple[int, ...], r0: int,
                      n: int, ncols: int, member_lanes: list[int]) -> list[tuple[int, int]]:
        """Load rows [r0, r0+n) of an item's heads; return each member's (row width, element offset of its
        first row). Members sharing sticks are one load (the first member's heads, ``ncols`` wide; member m
        at lane ``member_lanes[m]``); a role loaded apart is one load per member, one after the other."""
        if role not in it.apart:
            w, lane0 = self._load(arg, bufname, it.batches, heads[:len(heads) // it.members], r0, n, ncols)
            return [(w, lane0 + dl) for dl in member_lanes]
        parts, at = [], 0  # at: sticks loaded so far
        for h in heads:
            dev, lane0 = _tile_sticks(arg, it.batches, (h,), r0, n, 0, ncols)
            self.ins += dma_tile(arg, dev, self.buf[bufname] + at * STICK_BYTES, store=False)
            parts.append((dev.shape[-1] * arg.lanes, at * arg.lanes + lane0))
            at += dev.size
        return parts

    # --- stage 1: loads and S = Q K^T -----------------------------------------------------------
    def _scores(self, st: _Step) -> None:
        d, t, spec, it = self.dims, self.t, self.spec, st.item
        sub, P = it.sub_rows, it.members
        cols = _member_cols(spec, d, it)
        if st.first:
            self.q = self._load_members(spec.query, f"q{st.parity}", "query", it, it.heads, it.q0, it.nq, cols["q"],
                                        [m * d.D for m in range(P)])
        ks = self._load_members(spec.key, f"k{st.bp}", "key", it, it.kv_heads, st.k0, st.nk, cols["k"],
                                _kv_lane_deltas(spec.key, d, it, "key"))
        vs = self._load_members(spec.value, f"v{st.bp}", "value", it, it.kv_heads, st.k0, st.nk, cols["v"],
                                _kv_lane_deltas(spec.value, d, it, "value"))
        if self.mask is not None:
            st.mask = self._load_mask(st)
        # One QK^T per (batch, member): a member's Q, K and V are lane offsets into the shared sticks, or
        # rows of their own when loaded apart.
        for i in range(len(it.batches)):
            for m in range(P):
                (wq, oq), (wk, ok), (wv, ov) = self.q[m], ks[m], vs[m]
                kt = self.sp(f"k{st.bp}", d.dtype, (d.D, st.nk), (1, wk), ok + i * st.nk * wk)  # K^T by strides
                st.kt.append(kt)
                st.v.append(self.sp(f"v{st.bp}", d.dtype, (st.nk, d.Dv), (wv, 1), ov + i * st.nk * wv))
                qi = self.sp(f"q{st.parity}", d.dtype, (sub, d.D), (wq, 1), oq + i * sub * wq)
                si = self.sp(f"s{st.bp}", "float32", (sub, st.nk), (t.block_k, 1), (i * P + m) * sub * t.block_k)
                self.ins.append(MatMul(si, qi, kt))
        self.stats["blocks"] += 1

    def _load_mask(self, st: _Step) -> SpTensor:
        m, it = self.mask, st.item
        dev, lane0 = _mask_sticks(m, it, st.k0, st.nk)
        self.ins += dma_tile(m, dev, self.buf[f"mask{st.bp}"], store=False)
        mb, mh, mq, k = dev.shape
        w = k * m.lanes
        strides = (mh * mq * w if mb > 1 else 0, mq * w if mh > 1 else 0, w if mq > 1 else 0, 1)
        return self.sp(f"mask{st.bp}", m.dtype, (len(it.batches), len(it.heads), it.nq, st.nk), strides, lane0)

    # --- stage 2: online softmax and acc += P V -------------------------------------------------
    def _softmax_pv(self, st: _Step) -> None:
        d, t, it, bp, nk = self.dims, self.t, st.item, st.bp, st.nk
        M, nb, sub = it.rows, len(it.batches), it.sub_rows
        s2 = self.sp(f"s{bp}", "float32", (M, nk), (t.block_k, 1))
        s4 = self.sp(f"s{bp}", "float32", (nb, len(it.heads), it.nq, nk),
                     (len(it.heads) * it.nq * t.block_k, it.nq * t.block_k, t.block_k, 1))
        p2 = self.sp(f"p{bp}", self.pdt, (M, nk), (nk, 1))
        col = lambda name: self.sp(name, "float32", (M, 1))  # noqa: E731
        nm, alpha, mcur, lcur = col(f"nm{bp}"), col(f"alpha{bp}"), col(f"mcur{bp}"), col(f"lcur{bp}")
        l, acc = col(f"l{st.parity}"), self.sp(f"acc{st.parity}", "float32", (M, d.Dv))

        scaled, masked = self._bias(st, s4)
        # -m_cur: the block's row maxima in scaled units, negated; clamped so masked rows stay finite.
        self.ins.append(Reduce("max", mcur, s2, axis=1))
        self.ew("mul", mcur, mcur, -1.0 if scaled else -d.scale)
        if masked:
            self.ew("minimum", mcur, mcur, MAX_CLAMP)
        if st.first:
            nm = mcur
        else:
            self.ins += [elementwise("minimum", nm, self.prev_nm, mcur), elementwise("sub", alpha, nm, self.prev_nm),
                         elementwise("exp", alpha, alpha)]
        self.prev_nm = nm  # the running -max lives in this block's buffer set (mcur or nm)
        # P = exp(S * scale - m): one fma (or add) and the exp, rounded for the PE arrays.
        # With exp_precision "input", S*scale - m (<= 0) is rounded to P's dtype and the exp runs in place
        # on P: half the vector unit's bytes for the costliest op of the block. Not in masked blocks:
        # DLFloat16 has one code for NaN and Inf, so -inf would come back as NaN.
        x = p2 if self.exp_in_p and not masked else s2
        if scaled:
            self.ew("add", x, s2, _bcast_rows(nm, nk))
        else:
            self.ew("fma", x, s2, d.scale, _bcast_rows(nm, nk))
        self.ew("exp", p2, x)
        if st.first:
            self.ins.append(Reduce("sum", l, p2, axis=1))
        else:
            self.ins += [Reduce("sum", lcur, p2, axis=1), elementwise("fma", l, l, alpha, lcur),
                         elementwise("mul", acc, acc, _bcast_rows(alpha, d.Dv))]
        for i, v in enumerate(st.v):  # one PV per (batch, member) sub-tile, in S's row order
            pi = SpTensor(p2.offset + i * sub * nk * p2.itemsize, p2.dtype, (sub, nk), (nk, 1))
            ai = SpTensor(acc.offset + i * sub * d.Dv * 4, "float32", (sub, d.Dv))
            self.ins.append(MatMul(ai, pi, v, accumulate=not st.first))

    def _bias(self, st: _Step, s4: SpTensor) -> tuple[bool, bool]:
        """Apply the mask and the causal bias to S; return (S is now scaled, some entry may be -inf)."""
        d, spec, it = self.dims, self.spec, st.item
        scaled = masked = False
        if st.mask is not None:
            if self.mask.dtype == "bool":
                self.ew("where", s4, st.mask, s4, NEG_INF)
            else:
                self.ew("fma", s4, s4, d.scale, st.mask)
                scaled = True
            masked = True
        elif d.scale <= 0:  # the row max only commutes with a positive scale
            self.ew("mul", s4, s4, d.scale)
            scaled = True
        if spec.is_causal and st.k0 + st.nk - 1 > it.q0:  # the block crosses the diagonal
            self.ew("add", s4, s4, self._causal_view(st))
            self.stats["causal_bias_blocks"] += 1
            masked = True
        return scaled, masked

    def _causal_view(self, st: _Step) -> SpTensor:
        """Element (b, h, i, j) reads causal[c + j - i]: 0 where key k0+j <= query q0+i, else -inf."""
        it = st.item
        z = self.t.block_q + self.t.block_k
        c = z - 1 - (it.q0 - st.k0)
        return self.sp("causal", "float32", (len(it.batches), len(it.heads), it.nq, st.nk), (0, 0, -1, 1), c)

    # --- stage 3: out = acc / l -----------------------------------------------------------------
    def _finish(self, st: _Step) -> None:
        d, spec, it = self.dims, self.spec, st.item
        l = self.sp(f"l{st.parity}", "float32", (it.rows, 1))
        acc = self.sp(f"acc{st.parity}", "float32", (it.rows, d.Dv))
        if self.mask is not None:  # a row that saw no key has l = 0 (and acc = 0): out 0, not NaN
            self.ew("maximum", l, l, L_FLOOR)
        self.ew("reciprocal", l, l)
        if self.t.pack_out:
            self._store_packed(st, acc, l)
            return
        wo = _ceil_to(d.Dv, spec.out.lanes)
        self.ins.append(elementwise("mul", self.sp(f"o{st.slot}", d.dtype, (it.rows, d.Dv), (wo, 1)), acc,
                            _bcast_rows(l, d.Dv)))
        dev, lane0 = _tile_sticks(spec.out, it.batches, it.heads, it.q0, it.nq, 0, d.Dv)
        check_owns_sticks(spec.out, lane0, d.Dv, "sdpa out")
        self._store(dma_tile(spec.out, dev, self.buf[f"o{st.slot}"], store=True))

    def _store(self, stores: list[Instruction]) -> None:
        """Store now, or, with one output tile per item, at the end: the kernel then reads only, then
        writes only, and LPDDR5 pays no read/write turnaround while both would be in flight."""
        (self.deferred if self.t.out_slots > 2 else self.ins).extend(stores)

    def _store_packed(self, st: _Step, acc: SpTensor, l: SpTensor) -> None:
        """Lane heads whose outputs share sticks: each head's result goes to its lanes of one row of
        sticks, and the pack's rows are stored whole."""
        d, spec, it = self.dims, self.spec, st.item
        P, sub, cols = it.members, it.sub_rows, d.Dv * it.members
        wo = _ceil_to(cols, spec.out.lanes)
        for i in range(len(it.batches)):
            for m in range(P):
                r0 = (i * P + m) * sub
                o = self.sp(f"o{st.slot}", d.dtype, (sub, d.Dv), (wo, 1), i * sub * wo + m * d.Dv)
                a = SpTensor(acc.offset + r0 * d.Dv * 4, "float32", (sub, d.Dv))
                self.ew("mul", o, a, _bcast_rows(SpTensor(l.offset + r0 * 4, "float32", (sub, 1)), d.Dv))
        dev, lane0 = _tile_sticks(spec.out, it.batches, it.stacked, it.q0, it.nq, 0, cols)
        check_owns_sticks(spec.out, lane0, cols, "sdpa out")
        self._store(dma_tile(spec.out, dev, self.buf[f"o{st.slot}"], store=True))

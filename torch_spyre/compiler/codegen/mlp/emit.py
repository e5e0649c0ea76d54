"""Writing a fused MLP plan as per-core instruction streams (see ``plan.py`` for the shape of it).

Per row tile:

- **Phase 1**, per pass over ``nt`` of the core's intermediate sticks: for each x tile (``kt`` hidden
  sticks, all the tile's tokens) the up (and gate) weight tiles are loaded and multiplied into fp32
  accumulators; then bias, activation and gate product run on the vector unit and write h, rounded once
  to DLFloat16, into the resident h buffer, one stick after another (``[stick][row][64]``, so each stick
  is one contiguous block). The leftover pass computes the core's share of rows of its leftover stick.
  Every core loads the same x tiles in the same order, so ``share_a`` (``codegen/matmul/share.py``) loads
  each once and forwards it core to core.
- **Phase 2**, per output tile of ``n2`` hidden sticks: the core's rows of ``w_down`` (its sticks, and its
  leftover stick) are loaded and multiplied with its h sticks into an fp32 partial sum (a K-split over
  the cores). Partial sums flow over the ring toward the finisher (the core at the memory stop) from both
  sides, each core adding what it receives before passing it on; the finisher adds both, the down bias,
  rounds once and stores. Chain steps run one tile behind the matmuls, so the PE arrays run ahead.
  With a LayerNorm after the block (``norm_eps``), the finisher adds the residual too and keeps the
  fp32 sums of the row tile's whole rows; after the last output tile it normalizes them, rounds once
  and stores the rows.
  Receive slots are reused with credits (``Signal`` after the add, ``Wait`` before a send that reuses one).
"""

from __future__ import annotations

from ....card.config import CardConfig
from ....program import Elementwise, Instruction, MatMul, Reduce, RingRecv, RingSend, Scalar, Signal, SpTensor, Wait
from ..matmul.plan import _chunks_el, _round
from ..matmul.spec import DL, F32, UNIT
from .plan import MlpCore, MlpTiles, MlpWork, leftover_rows, passes, row_tiles
from .spec import _MlpProblem

RED_TAG = 5  # partial sums (share_a uses 2 and 16+)
RED_CREDIT = 6
RED_READY = 7  # a receiver's slots share bytes with its phase-1 buffers: free once its phase 1 is done


class MlpEmitter:
    """Instructions of one core."""

    def __init__(self, p: _MlpProblem, work: MlpWork, t: MlpTiles, c: MlpCore, offsets: dict[str, int],
                 cfg: CardConfig):
        self.p, self.work, self.t, self.c, self.off, self.cfg = p, work, t, c, offsets, cfg
        self.ins: list[Instruction] = []
        self.toggles: dict[str, int] = {}
        self.x_loads: list[int] = []  # where the x loads are (share_a forwards them)
        self.w_loads: list[int] = []  # where the leftover stick's weight loads are (shared within its group)
        self.rts = row_tiles(p, t.rows)
        self.n_tiles = [(a, n) for a, n in _chunks_el(p.H, t.n2 * UNIT)]
        self.tile_count = 0  # output tiles of the current row tile so far
        self.acc: dict[str, int] = {}  # the current pass's accumulators (up, gate)

    def buf(self, name: str) -> int:
        i = self.toggles.get(name, 0)
        self.toggles[name] = i ^ 1
        return self.off[f"{name}{i}"]

    def h_stick(self, local: int) -> int:
        return self.off["h"] + local * self.t.rows * UNIT * 2

    def valid(self, stick: int) -> int:
        return min(UNIT, self.p.I - stick * UNIT)

    def run(self) -> list[Instruction]:
        for rt in self.rts:
            self.phase1(rt)
            self.phase2(rt)
        return self.ins

    # --- phase 1 ---------------------------------------------------------------------------------
    def phase1(self, rt) -> None:
        b0, nb, m0, nm = rt
        R = nb * nm
        k_tiles = _chunks_el(self.p.H, self.t.kt * UNIT)
        for off, count in passes(self.work, self.t.nt):
            s0 = self.c.first + off
            self.sweep(rt, k_tiles, s0 * UNIT, min(self.p.I, (s0 + count) * UNIT) - s0 * UNIT, (0, R))
            self.h_epilogue(R, s0 * UNIT, min(self.p.I, (s0 + count) * UNIT) - s0 * UNIT, off)
        if self.work.leftovers:
            share = leftover_rows(self.c, R)
            stick = self.c.leftover[0] if share else None
            cols = self.valid(stick) if share else 0
            self.sweep(rt, k_tiles, (stick or 0) * UNIT, cols, share or (0, 0), leftover=True)
            if share and share[1]:
                self.h_epilogue(share[1], stick * UNIT, cols, self.work.base)

    def sweep(self, rt, k_tiles, col0: int, ncols: int, rows: tuple[int, int], leftover: bool = False) -> None:
        """One pass: every x tile (loaded, or received, whether or not this core multiplies it, so that
        every core's x loads agree) times the weight tiles of columns [col0, col0+ncols). The leftover
        stick's weight tiles are one stick wide and packed (one contiguous block each) in buffers of their
        own: its group's cores load the same tiles, so one loads each and forwards it (``build_fused_mlp``),
        and a forwarded tile never lands in a buffer the receiver still uses for something else."""
        p, t = self.p, self.t
        pitch = UNIT if leftover else t.nt * UNIT
        b0, nb, m0, nm = rt
        r0, rn = rows
        active = ncols > 0 and rn > 0
        mats = [("u", p.w_up)] + ([("g", p.w_gate)] if p.gated else [])
        if active:  # two accumulator sets: this pass's epilogue runs behind the next pass's matmuls
            self.acc = {m: self.buf(f"acc_{m}") if t.acc_double else self.off[f"acc_{m}"] for m, _ in mats}
        for kk, (k0, kn) in enumerate(k_tiles):
            w_offs = {}
            if active:
                for m, w in mats:
                    if leftover:
                        self.w_loads.append(len(self.ins))
                    w_offs[m] = self.load_weight(w, f"{'l' if leftover else 'w'}{m}", k0, kn, col0, ncols, pitch)
            x_off = self.buf("x")
            self.x_loads.append(len(self.ins))
            self.ins.append(p.x.dma((b0, m0, k0), (nb, nm, kn), x_off, row_bytes=t.kt * UNIT * 2))
            if not active:
                continue
            a = SpTensor(x_off + r0 * t.kt * UNIT * 2, DL, (rn, kn), (t.kt * UNIT, 1))
            for m, _ in mats:
                acc = SpTensor(self.acc[m], F32, (rn, ncols), (t.nt * UNIT, 1))
                b = SpTensor(w_offs[m], DL, (kn, ncols), (pitch, 1))
                self.ins.append(MatMul(acc, a, b, kk > 0))

    def load_weight(self, w, name: str, k0: int, kn: int, n0: int, nn: int, pitch: int, dst: int | None = None,
                    stage: int | None = None) -> int:
        """Weight rows [k0, k0+kn) x columns [n0, n0+nn) into a [K rows, N] tile of row ``pitch`` elements.
        A weight sticked on K (``nn.Linear``'s own layout) is loaded as it lies, [N rows, K sticks], and
        transposed by a vector-unit copy, as the matmul generator does."""
        dst = self.buf(name) if dst is None else dst
        if w.lane_dim == 2:
            self.ins.append(w.dma((0, k0, n0), (1, kn, nn), dst, row_bytes=pitch * 2))
            return dst
        stage = self.buf(f"{name}_t") if stage is None else stage
        kt = _round(kn, w.layout.lanes)
        self.ins.append(w.dma((0, k0, n0), (1, kn, nn), stage))
        self.ins.append(Elementwise("copy", SpTensor(dst, DL, (kn, nn), (pitch, 1)),
                                    (SpTensor(stage, DL, (kn, nn), (1, kt)),)))
        return dst

    def h_epilogue(self, rn: int, col0: int, ncols: int, local0: int) -> None:
        """Bias, activation and gate product on the fp32 accumulators; h written stick by stick (one
        rounding to DLFloat16). A leftover share's rows fill h's leftover block from its start."""
        p, t = self.p, self.t
        acc = {m: SpTensor(off, F32, (rn, ncols), (t.nt * UNIT, 1)) for m, off in self.acc.items()}
        for m, bias in (("u", p.b_up), ("g", p.b_gate)):
            if bias is None:
                continue
            dst = self.off[f"b{m}"]
            self.ins.append(bias.dma((0, 0, col0), (1, 1, ncols), dst))
            view = SpTensor(dst, bias.layout.device_dtype, (rn, ncols), (0, 1))
            self.ins.append(Elementwise("fma", acc[m], (acc[m], Scalar(1.0), view)))
        if p.gated:
            self.ins.append(Elementwise(p.spec.activation, acc["g"], (acc["g"],)))
        for j in range(-(-ncols // UNIT)):
            v = min(UNIT, ncols - j * UNIT)
            out = SpTensor(self.h_stick(local0 + j), DL, (rn, v), (UNIT, 1))
            col = lambda m: SpTensor(self.acc[m] + j * UNIT * 4, F32, (rn, v), (t.nt * UNIT, 1))  # noqa: E731
            if p.gated:
                self.ins.append(Elementwise("mul", out, (col("g"), col("u"))))
            else:
                self.ins.append(Elementwise(p.spec.activation, out, (col("u"),)))

    # --- phase 2 ---------------------------------------------------------------------------------
    def phase2(self, rt) -> None:
        b0, nb, m0, nm = rt
        R = nb * nm
        p, t, base = self.p, self.t, self.work.base
        share = leftover_rows(self.c, R) if self.work.leftovers else None
        self.tile_count = 0
        for up, _ in self.upstream():  # a Signal waits for this core's earlier work: phase 1 is done
            self.ins.append(Signal(up, tag=RED_READY))
        pending = None
        for n0, nn in self.n_tiles:
            wd = self.buf("wd")
            pitch = t.n2 * UNIT * 2
            first_row = self.c.first * UNIT
            own_rows = min(p.I, (self.c.first + base) * UNIT) - first_row
            stage = self.buf("wd_t") if p.w_down.lane_dim == 1 else None
            self.load_weight(p.w_down, "", first_row, own_rows, n0, nn, t.n2 * UNIT, wd, stage)
            if share and share[1]:
                stick = self.c.leftover[0]
                self.load_weight(p.w_down, "", stick * UNIT, self.valid(stick), n0, nn, t.n2 * UNIT,
                                 wd + base * UNIT * pitch, None if stage is None else stage + base * UNIT * pitch)
            acc_off = self.buf("acc2_")
            acc = SpTensor(acc_off, F32, (R, nn), (t.n2 * UNIT, 1))
            if nn < t.n2 * UNIT:  # columns past N: never computed, but sent and added
                pad = t.n2 * UNIT - nn
                self.ins.append(Elementwise("copy", SpTensor(acc_off + nn * 4, F32, (R, pad), (t.n2 * UNIT, 1)),
                                            (Scalar(0.0),)))
            for j in range(base):
                v = self.valid(self.c.first + j)
                self.ins.append(MatMul(acc, SpTensor(self.h_stick(j), DL, (R, v), (UNIT, 1)),
                                       SpTensor(wd + j * UNIT * pitch, DL, (v, nn), (t.n2 * UNIT, 1)), j > 0))
            if share and share[1]:
                r0, rn = share
                v = self.valid(self.c.leftover[0])
                self.ins.append(MatMul(SpTensor(acc_off + r0 * t.n2 * UNIT * 4, F32, (rn, nn), (t.n2 * UNIT, 1)),
                                       SpTensor(self.h_stick(base), DL, (rn, v), (UNIT, 1)),
                                       SpTensor(wd + base * UNIT * pitch, DL, (v, nn), (t.n2 * UNIT, 1)), True))
            if pending is not None:
                self.chain(*pending)
            pending = (acc_off, rt, n0, nn)
        if pending is not None:
            self.chain(*pending)

    def finish_norm(self, acc: SpTensor, rt, n0: int, nn: int) -> None:
        """The finisher with a LayerNorm: this output tile's fp32 sums (+ down bias + residual) go into the
        row tile's whole rows; after the last tile the rows are normalized over H (mean, then the variance
        of the centred values, as torch computes them), scaled, shifted, rounded once and stored."""
        p, t = self.p, self.t
        b0, nb, m0, nm = rt
        R, pitch, hp = nb * nm, t.n2 * UNIT, p.h_sticks * UNIT
        y = SpTensor(self.off["ln_rows"] + n0 * 4, F32, (R, nn), (hp, 1))
        if p.b_down is not None:
            self.ins.append(p.b_down.dma((0, 0, n0), (1, 1, nn), self.off["bd"]))
            bias = SpTensor(self.off["bd"], p.b_down.layout.device_dtype, (R, nn), (0, 1))
            self.ins.append(Elementwise("add", y, (acc, bias)))
        else:
            self.ins.append(Elementwise("copy", y, (acc,)))
        if p.residual is not None:
            r = p.residual
            self.ins.append(r.dma((b0, m0, n0), (nb, nm, nn), self.off["ln_res"], row_bytes=pitch * r.layout.itemsize))
            self.ins.append(Elementwise("add", y, (y, SpTensor(self.off["ln_res"], r.layout.device_dtype, (R, nn),
                                                               (pitch, 1)))))
        if n0 + nn < p.H:
            return
        h = p.H
        rows = SpTensor(self.off["ln_rows"], F32, (R, h), (hp, 1))
        sq = SpTensor(self.off["ln_sq"], F32, (R, h), (hp, 1))
        mean = SpTensor(self.off["ln_mean"], F32, (R, 1))
        rstd = SpTensor(self.off["ln_rstd"], F32, (R, 1))
        wide = lambda col: SpTensor(col.offset, F32, (R, h), (1, 0))  # noqa: E731 - a row's value on each column
        self.ins += [Reduce("sum", mean, rows, axis=1), Elementwise("mul", mean, (mean, Scalar(1.0 / h))),
                     Elementwise("sub", rows, (rows, wide(mean))), Elementwise("mul", sq, (rows, rows)),
                     Reduce("sum", rstd, sq, axis=1),
                     Elementwise("fma", rstd, (rstd, Scalar(1.0 / h), Scalar(float(p.spec.norm_eps)))),
                     Elementwise("rsqrt", rstd, (rstd,))]
        steps = [("mul", (rows, wide(rstd)))]
        for name, v, op in (("ln_w", p.norm_weight, "mul"), ("ln_b", p.norm_bias, "add")):
            if v is not None:
                self.ins.append(v.dma((0, 0, 0), (1, 1, h), self.off[name]))
                steps.append((op, (rows, SpTensor(self.off[name], v.layout.device_dtype, (R, h), (0, 1)))))
        dt, isz = p.out.layout.device_dtype, p.out.layout.itemsize
        out = SpTensor(self.off["ln_out"], dt, (R, h), (hp, 1))
        for i, (op, inputs) in enumerate(steps):  # the last step writes the output: the one rounding
            self.ins.append(Elementwise(op, out if i == len(steps) - 1 else rows, inputs))
        if hp != h:
            self.ins.append(Elementwise("copy", SpTensor(self.off["ln_out"] + h * isz, dt, (R, hp - h), (hp, 1)),
                                        (Scalar(0.0),)))
        self.ins.append(p.out.dma((b0, m0, 0), (nb, nm, h), self.off["ln_out"], store=True, row_bytes=hp * isz))

    def upstream(self) -> list[tuple[int, int]]:
        """(core, receive buffer) of the neighbours whose partial sums this core adds."""
        order, q, f = self.work.cores, self.c.pos, self.work.finisher
        ups = []
        if 0 < q <= f:
            ups.append((order[q - 1].core, 0))
        if f <= q < len(order) - 1:
            ups.append((order[q + 1].core, 1))
        return ups

    def chain(self, acc_off: int, rt, n0: int, nn: int) -> None:
        """This core's step of the partial-sum chains for one output tile."""
        b0, nb, m0, nm = rt
        R = nb * nm
        t, order, q, f = self.t, self.work.cores, self.c.pos, self.work.finisher
        count = R * t.n2 * UNIT
        nbytes = count * 4
        n = self.tile_count
        self.tile_count += 1
        slot = (n % t.slots) * t.rows * t.n2 * UNIT * 4
        flat = SpTensor(acc_off, F32, (count,))
        for up, d in self.upstream():
            self.ins.append(RingRecv(up, tag=RED_TAG))
            self.ins.append(Elementwise("add", flat, (flat, SpTensor(self.off[f"recv{d}"] + slot, F32, (count,)))))
            if n + t.slots < len(self.n_tiles):
                self.ins.append(Signal(up, tag=RED_CREDIT))
        if q == f:
            self.finish(acc_off, rt, n0, nn)
            return
        down, d = (order[q + 1].core, 0) if q < f else (order[q - 1].core, 1)
        if n == 0:
            self.ins.append(Wait(down, tag=RED_READY))
        if n >= t.slots:
            self.ins.append(Wait(down, tag=RED_CREDIT))
        self.ins.append(RingSend(down, acc_off, self.off[f"recv{d}"] + slot, nbytes, tag=RED_TAG))

    def finish(self, acc_off: int, rt, n0: int, nn: int) -> None:
        p, t = self.p, self.t
        b0, nb, m0, nm = rt
        R = nb * nm
        pitch = t.n2 * UNIT
        acc = SpTensor(acc_off, F32, (R, nn), (pitch, 1))
        if p.has_norm:
            self.finish_norm(acc, rt, n0, nn)
            return
        if p.out.layout.device_dtype == F32 and p.b_down is None:
            self.ins.append(p.out.dma((b0, m0, n0), (nb, nm, nn), acc_off, store=True, row_bytes=pitch * 4))
            return
        o = self.buf("o")
        isz = p.out.layout.itemsize
        out = SpTensor(o, p.out.layout.device_dtype, (R, nn), (pitch, 1))
        if p.b_down is not None:
            self.ins.append(p.b_down.dma((0, 0, n0), (1, 1, nn), self.off["bd"]))
            bias = SpTensor(self.off["bd"], p.b_down.layout.device_dtype, (R, nn), (0, 1))
            self.ins.append(Elementwise("fma", out, (acc, Scalar(1.0), bias)))
        else:
            self.ins.append(Elementwise("cast", out, (acc,)))
        nt = _round(nn, UNIT)
        if nt != nn:
            self.ins.append(Elementwise("copy", SpTensor(o + nn * isz, p.out.layout.device_dtype, (R, nt - nn),
                                                         (pitch, 1)), (Scalar(0.0),)))
        self.ins.append(p.out.dma((b0, m0, n0), (nb, nm, nn), o, store=True, row_bytes=pitch * isz))

"""Writing a matmul plan as per-core instruction streams.

Weight-stationary: for each N tile, for each K tile, one B tile stays while A tiles stream through it;
A stays resident in scratchpad when it fits. A, B (and transposition staging) buffers and the fp32
accumulators are double-buffered, so loads overlap PE work and one tile's epilogue overlaps the next
tile's matmuls. The epilogue (alpha, beta * bias, an activation, a residual) runs in fp32 and rounds
once to the output dtype. With a K-split, partial sums (fp32) flow down a chain of adjacent partners,
chunk by chunk, alternating direction so both ring directions work; the last partner of a chain adds
the epilogue and stores. Receive buffers are reused with credit tokens (signal/wait).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ....card.config import CardConfig
from ....program import (
    dram_spans,
    Elementwise,
    Instruction,
    MatMul,
    Reduce,
    Operand,
    Program,
    RingRecv,
    RingSend,
    Scalar,
    Signal,
    SpTensor,
    Wait,
)
from ... import scratchpad
from .plan import (
    Split,
    Tiles,
    _assign,
    _buffers,
    _chunks_el,
    _core_shape,
    _CoreWork,
    _epilogue_chunks,
    _round,
    _row_tiles,
)
from .share import forwarding, rows_sharing_a, share_a

# A leftover stick's partial sums (+ 1: their credit, + 2: A buffers free for the main row), and the
# leftover pieces' shared A tiles (K-split chain: 0 and 1, the main row's shared A: 2 and 16+).
LEFTOVER_TAG, X_TAG, X_CREDIT_TAG = 4, 8, 32
from .spec import DL, F32, UNIT, MatmulSpec, MatmulSpecError, _Bound, _check, _Problem


class _Emitter:
    """Instructions of one core."""

    def __init__(self, p: _Problem, s: Split, t: Tiles, w: _CoreWork, offsets: dict[str, int], cfg: CardConfig,
                 slots: "_Slots | None" = None, row_n_tiles: int = 0):
        self.p, self.s, self.t, self.w, self.off, self.cfg, self.slots = p, s, t, w, offsets, cfg, slots
        self.sh = _core_shape(p, s, t, w)
        self.row_n_tiles = row_n_tiles  # N tiles of the widest core (uneven N pieces: forward_only)
        self.ins: list[Instruction] = []
        self.toggles: dict[str, int] = {}
        self.a_loads: list[int] = []  # where the A loads are (share.py forwards them over the ring)
        self.x_loads: list[int] = []  # the leftover piece's own A loads, shared by the cores of its K piece
        # With both shared: the main row's forwarding neighbours (set by generate_plan), which must not
        # send main tiles into A buffers the leftover piece still uses.
        self.main_prev: int | None = None
        self.main_succs: list[int] = []

    def buf(self, name: str) -> int:
        """Cycle through name0, name1 (and name2 where there is one): double (triple) buffering."""
        if name + "0" not in self.off:
            return self.off[name]
        i = self.toggles.get(name, 0)
        self.toggles[name] = (i + 1) % (3 if f"{name}2" in self.off else 2)
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
            if self.w.extra is not None:  # first: its partial sums travel while the other tiles run
                pending = self.leftover(batch, rts, k_tiles, resident, pending)
                for succ in self.main_succs:  # the successor is done with its leftover A tiles
                    self.ins.append(Wait(succ, tag=LEFTOVER_TAG + 2))
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
            self.forward_only(rts, len(n_tiles) + (self.w.extra is not None), len(k_tiles), resident)
        if pending is not None:
            self.epilogue(*pending)
        return self.ins

    def leftover(self, batch: int | None, rts, k_tiles, resident: dict, pending):
        """The leftover stick's K piece (``Split.leftover_k``), before the core's other tiles: the A tiles of
        its K range only (streamed and shared: loaded once per K piece and forwarded among the cores with
        that piece, ``x_loads``; resident: every tile, which the other tiles reuse). Then the partial sum
        goes down the chain of the stick's cores: each adds the one it receives and sends the sum on; the
        last finishes the stick (its epilogue is returned as pending)."""
        n0, nn, k0, kn, i, chain = self.w.extra
        acc = self.buf("acc")
        self.zero_acc_pad(acc, rts, nn)
        started = False
        own = not self.t.a_resident
        if own:
            main_loads, self.a_loads = self.a_loads, self.x_loads
        for kk, (tk0, tkn) in enumerate(k_tiles):
            lo, hi = max(tk0, k0), min(tk0 + tkn, k0 + kn)
            mine = lo < hi
            if not mine and own:
                continue  # only the A tiles it multiplies
            b_off = self.load_b(batch, lo, hi - lo, n0, nn) if mine else 0
            for j, rt in enumerate(rts):
                a_off = self.load_a(rt, kk, tk0, tkn, j, resident)
                if mine:  # the piece's columns of the A tile: a strided view of its rows
                    self.matmul(acc, rt, a_off + (lo - tk0) * 2, b_off, hi - lo, nn, started)
            started = started or mine
        if own:
            self.a_loads = main_loads
        if self.main_prev is not None:  # its A buffers are free for the main row's tiles (after the above)
            self.ins.append(Signal(self.main_prev, tag=LEFTOVER_TAG + 2))
        if pending is not None:  # the previous tile's epilogue runs behind these matmuls
            self.epilogue(*pending)
        rows = sum(nb * nm for _, nb, _, nm, _ in rts)
        elems = rows * _round(nn, UNIT)
        # The partial sum lands in the other accumulator once the previous tile's epilogue is done with it
        # (every core of the chain has as many tiles, so the same one): the receiver says so with a credit.
        # With one accumulator, in a buffer of its own.
        spare = self.off["xrecv"] if "xrecv" in self.off else self.off["acc1" if acc == self.off["acc0"] else "acc0"]
        if i > 0:
            if "xrecv" not in self.off:
                self.ins.append(Signal(chain[i - 1], tag=LEFTOVER_TAG + 1))
            self.ins.append(RingRecv(chain[i - 1], tag=LEFTOVER_TAG))
            whole = SpTensor(acc, F32, (elems,))
            self.ins.append(Elementwise("add", whole, (whole, SpTensor(spare, F32, (elems,)))))
        if i < len(chain) - 1:
            if "xrecv" not in self.off:
                self.ins.append(Wait(chain[i + 1], tag=LEFTOVER_TAG + 1))
            self.ins.append(RingSend(chain[i + 1], acc, spare, elems * 4, tag=LEFTOVER_TAG))
            return None
        return (acc, rts, n0, nn)

    def forward_only(self, rts, n_tiles: int, k_tiles: int, resident: dict) -> None:
        """With A shared over the ring and uneven N pieces, a narrower core has fewer N tiles than the row's
        widest (200 sticks over 32 cores: tiles of 2 give 4 and 3): it still takes the A tiles of the
        passes it lacks, only to hand them on (share.py needs every core of a row to load the same tiles)."""
        if self.t.share != "a" or self.t.a_resident:
            return
        k0s = [(self.w.kcols[0] + a, n) for a, n in _chunks_el(self.w.kcols[1], self.sh.kt_el)]
        for _ in range(n_tiles, self.row_n_tiles):
            for kk, (k0, kn) in enumerate(k0s[:k_tiles]):
                for i, rt in enumerate(rts):
                    self.load_a(rt, kk, k0, kn, i, resident)

    # --- loads -----------------------------------------------------------------------------------
    def load_b(self, batch: int | None, k0: int, kn: int, n0: int, nn: int) -> int:
        p, dst = self.p, self.buf("b")
        bb = 0 if batch is None else batch
        nt = _round(nn, UNIT)
        if not p.b_transposed:  # [K rows, N sticks]: the PE arrays' order
            self.ins.append(p.b.dma((bb, k0, n0), (1, kn, nn), dst, row_bytes=nt * 2))
            return dst
        stage, kt = self.buf("b_t"), _round(kn, p.b.layout.lanes)
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
        self.a_loads.append(len(self.ins))
        if not p.a_transposed:
            self.ins.append(p.a.dma((b0, m0, k0), (nb, nm, kn), dst, row_bytes=kt * 2))  # [rows, K sticks]
            return dst
        stage, ms = self.buf("a_t"), _round(nm, p.a.layout.lanes)
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
        if p.has_norm:
            for op, inputs in steps:
                self.ins.append(Elementwise(op, acc, inputs))
            steps = self.norm_steps(acc, box, n0, nn)
        if not steps:
            steps.append(("cast", (acc,)))  # the one rounding to the output dtype
        for i, (op, inputs) in enumerate(steps):
            self.ins.append(Elementwise(op, out if i == len(steps) - 1 else acc, inputs))
        if nt != nn:
            pad = SpTensor(out_off + nn * p.out.layout.itemsize, p.out_dtype, (nb, nm, nt - nn), dense)
            self.ins.append(Elementwise("copy", pad, (Scalar(0.0),)))
        self.ins.append(p.out.dma((b0, m0, n0), (nb, nm, nn), out_off, store=True, row_bytes=nt * p.out.layout.itemsize))

    def norm_steps(self, acc: SpTensor, box: tuple[int, int, int, int], n0: int, nn: int) -> list[tuple]:
        """LayerNorm over the chunk's rows (whole rows: the plan gives a norm one N tile of all N) on the
        fp32 accumulator: mean and variance (of the centred values, as torch computes them) in fp32,
        ``acc = (acc - mean) * rsqrt(var + eps)`` in place; returns the steps left (weight, bias), the last
        of which writes the output (none: the caller casts)."""
        p = self.p
        _, nb, _, nm = box
        n = p.N
        stat = lambda name: SpTensor(self.off[name], F32, (nb, nm, 1), (nm, 1, 1))  # noqa: E731
        wide = lambda st: SpTensor(st.offset, F32, (nb, nm, nn), (nm, 1, 0))  # noqa: E731 - a row's value on each column
        mean, rstd = stat("ln_mean"), stat("ln_rstd")
        sq = SpTensor(self.off["ln_sq"], F32, acc.shape, acc.strides)
        self.ins.append(Reduce("sum", mean, acc, axis=2))
        self.ins.append(Elementwise("mul", mean, (mean, Scalar(1.0 / n))))
        self.ins.append(Elementwise("sub", acc, (acc, wide(mean))))
        self.ins.append(Elementwise("mul", sq, (acc, acc)))
        self.ins.append(Reduce("sum", rstd, sq, axis=2))
        self.ins.append(Elementwise("fma", rstd, (rstd, Scalar(1.0 / n), Scalar(float(p.spec.norm_eps)))))
        self.ins.append(Elementwise("rsqrt", rstd, (rstd,)))
        steps = [("mul", (acc, wide(rstd)))]
        if p.norm_weight is not None:
            steps.append(("mul", (acc, self.load_addend(p.norm_weight, "nw", box, n0, nn))))
        if p.norm_bias is not None:
            steps.append(("add", (acc, self.load_addend(p.norm_bias, "nb", box, n0, nn))))
        return steps

    def load_addend(self, x: _Bound, buf: str, box: tuple[int, int, int, int], n0: int, nn: int) -> SpTensor:
        """A bias or residual box, loaded once per distinct row (broadcast dims collapse), viewed at the
        chunk's shape through stride-0 dims; one sticked on M is read through a transposed view."""
        b0, nb, m0, nm = box
        nt = _round(nn, UNIT)
        dst = self.buf(buf)
        if x.lane_dim == 1:  # sticked on M: [batch, N rows, M sticks] from the stick holding row m0
            skip = m0 % x.layout.lanes
            self.ins.append(x.dma((b0, m0 - skip, n0), (nb, nm + skip, nn), dst))
            ms = _round(nm + skip, x.layout.lanes)
            strides = (nn * ms if x.strides[0] else 0, 1, ms)
            return SpTensor(dst + skip * x.layout.itemsize, x.layout.device_dtype, (nb, nm, nn), strides)
        self.ins.append(x.dma((b0, m0, n0), (nb, nm, nn), dst, row_bytes=nt * x.layout.itemsize))
        sb = nm * nt if x.strides[0] and x.strides[1] else nt
        strides = (sb if x.strides[0] else 0, nt if x.strides[1] else 0, 1)
        return SpTensor(dst, x.layout.device_dtype, (nb, nm, nn), strides)



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


def generate_plan(spec: MatmulSpec, split: Split, tiles: Tiles, config: CardConfig) -> Program:
    """The program for one plan (used for the chosen plan and, in tests and benchmarks, alternatives)."""
    p = _check(spec)
    work = _assign(p, split, config)
    if work is None:
        raise MatmulSpecError(f"{p.describe()}: split {split} leaves cores without work")
    if p.has_norm and (split.n > 1 or tiles.nt * UNIT < p.N):
        raise MatmulSpecError(f"{p.describe()} with a LayerNorm epilogue needs whole rows per core and tile: split "
                              f"{split} and N tiles of {tiles.nt} sticks do not give them")
    if split.k > 1 and tiles.network not in ("reduce", "data"):
        raise MatmulSpecError(f"a K-split sends partial sums over the 'reduce' or the 'data' ring, got {tiles.network!r}")
    sh = _core_shape(p, split, tiles, work[0])
    room = config.scratchpad_plannable_bytes
    sp_plan = scratchpad.plan(_buffers(p, split, tiles, sh, room), room)
    offsets = {b.name: b.offset for b in sp_plan.buffers}
    uses = _count_chain_uses(p, split, tiles, work, offsets, config) if split.k > 1 else {}
    slots = _Slots(offsets, uses, sh.recv_slots, sh.chunk_rows * sh.nt_el * 4, config.num_cores)
    cores, a_loads, x_loads = {}, {}, {}
    # Leftover pieces with A shared and streamed: the main row's hops, so that no core sends main tiles
    # into buffers its successor's leftover piece still reads (the successor signals when done).
    both = tiles.share == "a" and split.leftover_k > 1 and not tiles.a_resident
    prev, succs = {}, {}
    if both:
        for row in rows_sharing_a(work, config, at_memory=True):
            for u, v in forwarding(row)[1]:
                prev[v] = u
                succs.setdefault(u, []).append(v)
    for w in work:
        em = _Emitter(p, split, tiles, w, offsets, config, slots, sh.n_tiles)
        em.main_prev, em.main_succs = prev.get(w.core), succs.get(w.core, [])
        cores[w.core], a_loads[w.core] = em.run(), em.a_loads
        x_loads[w.core] = [cores[w.core][i] for i in em.x_loads]
    meta = {"kind": spec.kind, "split": str(split), "tiles": str(tiles)}
    if tiles.share == "a":
        if split.k > 1:
            raise MatmulSpecError("sharing A over the ring needs a split without a K-split")
        cores, notes = share_a(cores, a_loads, work, config, at_memory=True)
        if both:  # the leftover pieces' A tiles: shared by the cores with the same K piece
            at = {c: [i for i, x in enumerate(ins) if any(x is y for y in x_loads[c])] for c, ins in cores.items()}
            pieces = [replace(w, kcols=w.extra[2:4]) for w in work]
            cores, more = share_a(cores, at, pieces, config, tag=X_TAG, credit_tag=X_CREDIT_TAG, at_memory=True)
            notes += more
        if notes:
            meta["share_notes"] = notes
    _check_spans(p, cores, config)
    return Program(spec.name, _operands(spec), cores, meta)


def _operands(spec: MatmulSpec) -> list[Operand]:
    out = []
    seen = set()
    for view, access in ((spec.a, "in"), (spec.b, "in"), (spec.bias, "in"), (spec.residual, "in"),
                         (spec.norm_weight, "in"), (spec.norm_bias, "in"), (spec.out, "out")):
        if view is None or view.name in seen:
            continue
        seen.add(view.name)
        out.append(view.operand(access))
    return out


def _check_spans(p: _Problem, cores: dict[int, list[Instruction]], cfg: CardConfig) -> None:
    for core, ins in cores.items():
        total = sum(hi - lo for lo, hi in dram_spans(ins).values())
        if total > cfg.core_address_span_bytes:
            raise MatmulSpecError(f"{p.describe()}: core {core} would address {total} bytes of device memory, more "
                                  f"than config.core_address_span_bytes = {cfg.core_address_span_bytes}")



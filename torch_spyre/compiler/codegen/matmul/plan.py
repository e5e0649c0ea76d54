"""A matmul plan: the work division over cores (:class:`Split`) and each core's tiles (:class:`Tiles`).

What a plan means, independent of what it costs: which box of (batch, M rows, N sticks, K) each core
gets (:func:`_assign`; K-split partners on adjacent ring stops, from :func:`~torch_spyre.compiler.
placement.partner_groups`), every split worth considering (:func:`_splits`), the sizes one core works
with (:class:`_Shape`), its A tiles and epilogue chunks, and the scratchpad buffers it needs
(:func:`_buffers`, :func:`_fits`). The cost model (``cost.py``) prices a plan, the search (``search.py``)
picks one, the emitter (``emit.py``) writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....card.config import CardConfig
from ....card.costs import ceil_div
from ... import optimizations
from ...placement import partner_groups
from ...scratchpad import SpBuffer
from .spec import UNIT, _Problem


# =============================================================================================
# Work division and tiles
# =============================================================================================
@dataclass(frozen=True)
class Split:
    """Cores along batch, M (rows), N (sticks) and K (partners summing partial results)."""

    batch: int
    m: int
    n: int
    k: int
    # N sticks that do not divide equally over the ``n`` cores: 1 gives the larger pieces to the first
    # cores (``_n_chunks``); g > 1 gives every core q sticks and splits each of the r leftover sticks by K
    # over g = n / r cores, whose partial sums meet on the last of them (``_leftover``).
    leftover_k: int = 1

    @property
    def cores(self) -> int:
        return self.batch * self.m * self.n * self.k

    def __str__(self) -> str:
        extra = f" (leftover sticks split by K over {self.leftover_k} cores)" if self.leftover_k > 1 else ""
        return f"b{self.batch} m{self.m} n{self.n} k{self.k}{extra}"


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
    # "a": each A tile is loaded once per row of the split and forwarded over the ring to the row's other
    # cores (share.py); "": every core loads its own.
    share: str = ""

    def __str__(self) -> str:
        res = ", A resident" if self.a_resident else ""
        rows = f"{self.bt}x{self.mt}" if self.bt > 1 else f"{self.mt}"
        net = f", sums over the {self.network} ring" if self.network else ""
        acc = "" if self.acc_double else ", one accumulator"
        share = ", A shared over the ring" if self.share == "a" else ""
        return f"M {rows} rows, N {self.nt} sticks, K {self.kt} sticks{res}{net}{acc}{share}"


def _chunks(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """[start, size) of ``parts`` nearly equal pieces in multiples of ``align`` (the last may be short)."""
    return _chunks_el(total, _round(ceil_div(total, parts), align)) if total > 0 else []


def _chunks_el(total: int, step: int) -> list[tuple[int, int]]:
    """[start, size) of pieces of ``step`` elements (the last may be short)."""
    return [(s, min(step, total - s)) for s in range(0, total, step)]


@dataclass(frozen=True)
class _CoreWork:
    core: int
    batches: tuple[int, int]  # [start, count)
    rows: tuple[int, int]  # M
    ncols: tuple[int, int]  # N elements
    kcols: tuple[int, int]  # K elements
    partner: int  # index among K-split partners
    group: tuple[int, ...]  # the partners' cores, in ring order
    # With ``Split.leftover_k`` > 1: one more N tile, (N start, N elements, K start, K elements, index among
    # the cores sharing that stick, those cores in chain order); its partial sum goes down the chain.
    extra: tuple[int, int, int, int, int, tuple[int, ...]] | None = None


def _row_align(p: _Problem) -> int:
    return p.a.layout.lanes if p.a_transposed else 1


def _assign(p: _Problem, s: Split, cfg: CardConfig) -> list[_CoreWork] | None:
    """Core -> its box; None if a split leaves a core without work. K-split partners sit on adjacent
    ring stops, in partner order; the groups alternate between the two sides of the memory stop
    (:func:`~torch_spyre.compiler.placement.partner_groups`)."""
    bs = _chunks(p.batch, s.batch)
    ms = _chunks(p.M, s.m, _row_align(p))
    if s.leftover_k > 1:
        return _assign_leftover(p, s, cfg, bs, ms)
    ns = [(a * UNIT, min(n * UNIT, p.N - a * UNIT)) for a, n in _n_chunks(p.n_units, s.n)]
    ks = [(a * UNIT, min(n * UNIT, p.K - a * UNIT)) for a, n in _chunks(p.k_units, s.k)]
    if (len(bs), len(ms), len(ns), len(ks)) != (s.batch, s.m, s.n, s.k):
        return None
    groups = iter(partner_groups(s.cores // s.k, s.k, cfg))
    work = []
    for b in bs:
        for m in ms:
            for n in ns:
                group = next(groups)
                work += [_CoreWork(group[q], b, m, n, k, q, group) for q, k in enumerate(ks)]
    return work



def leftover_ways(p: _Problem, s: Split) -> int:
    """Cores per leftover stick when every core takes q = N sticks // n and the r leftover sticks are
    split by K (g = n / r cores each, so every core gets one piece); 0 when that does not apply: N divides
    equally, r does not divide n, K has fewer sticks than g, a K-split, batches (one pass over B only), the
    ``matmul_leftover_split`` optimization switched off."""
    q, r = divmod(p.n_units, s.n)
    if not optimizations.enabled("matmul_leftover_split") or r == 0 or q == 0 or s.n % r or s.k > 1 or p.batch > 1 or p.has_norm:
        return 0
    g = s.n // r
    return g if 2 <= g <= p.k_units else 0


def _assign_leftover(p: _Problem, s: Split, cfg: CardConfig, bs, ms) -> list[_CoreWork] | None:
    """``_assign`` with ``s.leftover_k`` > 1: core i of each row takes sticks [q*i, q*(i+1)) over all of K,
    plus K piece i // r of leftover stick q*n + i % r (cores in the ring order of ``partner_groups``). The
    cores with the same K piece are then neighbours (they share its A tiles over the ring, ``emit``); a
    stick's g cores, r stops apart, pass its partial sum down the chain in K piece order."""
    g = leftover_ways(p, s)
    if g != s.leftover_k or len(bs) != s.batch or len(ms) != s.m:
        return None
    q = p.n_units // s.n
    kp = [(a * UNIT, min(n * UNIT, p.K - a * UNIT)) for a, n in _chunks(p.k_units, g)]
    if len(kp) != g:
        return None
    groups = iter(partner_groups(s.cores, 1, cfg))
    work = []
    for b in bs:
        for m in ms:
            cores = [next(groups)[0] for _ in range(s.n)]
            for i, core in enumerate(cores):
                r = s.n // g
                stick = q * s.n + i % r
                chain = tuple(cores[i % r::r])
                extra = (stick * UNIT, min(UNIT, p.N - stick * UNIT), *kp[i // r], i // r, chain)
                work.append(_CoreWork(core, b, m, (i * q * UNIT, q * UNIT), (0, p.K), 0, (core,), extra))
    return work


UNEVEN_N_MAX = 1.25  # uneven N pieces: the largest at most this many times the average


def _n_chunks(units: int, parts: int) -> list[tuple[int, int]]:
    """N sticks over ``parts`` cores: equal pieces (the last may be short) when that gives every core
    work; otherwise, when the largest piece stays within ``UNEVEN_N_MAX`` of the average, pieces of q+1
    and q sticks, the larger first (200 sticks over 32 cores: 8 x 7 and 24 x 6, where pieces of 7 would
    leave 3 cores idle and 25 cores of 8 leave 7). The first core keeps the largest box (the cost model
    prices the busiest core from it)."""
    even = _chunks(units, parts)
    if len(even) == parts or parts > units:
        return even
    q, r = divmod(units, parts)
    if (q + 1) * parts > UNEVEN_N_MAX * units:
        return even
    out, start = [], 0
    for i in range(parts):
        size = q + (i < r)
        out.append((start, size))
        start += size
    return out


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
            for pn in ([1] if p.has_norm else _factors(p.n_units, n // pb // pm)):  # a norm: whole rows
                for pk in _factors(p.k_units, n // pb // pm // pn):
                    s = Split(pb, pm, pn, pk)
                    if _assign(p, s, cfg) is not None:
                        out.append(s)
                    g = leftover_ways(p, s)
                    if g and _assign(p, (x := Split(pb, pm, pn, pk, g)), cfg) is not None:
                        out.append(x)  # the leftover sticks split by K instead of uneven pieces: equal work
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
    n_tiles = -(-w.ncols[1] // (t.nt * UNIT)) + (w.extra is not None)  # the leftover piece: one more tile
    return _Shape(groups, group_rows, t.kt * UNIT, t.nt * UNIT, tile_rows, chunk_rows,
                  n_tiles, -(-w.kcols[1] // (t.kt * UNIT)), row_tiles, slots)


def _chunk_rows(t: Tiles, s: Split) -> int:
    """Rows per epilogue chunk: with a K-split, smaller chunks pipeline the partial-sum chain."""
    if s.k == 1:
        return t.mt
    return max(64, -(-t.mt // (2 * s.k)))


def _buffers(p: _Problem, s: Split, t: Tiles, sh: _Shape, room: int | None = None) -> list[SpBuffer]:
    """Every scratchpad buffer one core needs. All live for the whole kernel (the loops reuse them).
    With ``room`` (the plannable bytes) and A shared over the ring, a third A buffer where it fits (see
    :func:`_a_buffers`); without, the buffers every plan needs (what :func:`_fits` checks)."""
    rows, kt, nt = sh.tile_rows, sh.kt_el, sh.nt_el
    bufs = []
    if t.a_resident:
        bufs.append(SpBuffer("a", sh.row_tiles * sh.k_tiles * rows * kt * 2))
    else:
        bufs += [SpBuffer(f"a{i}", rows * kt * 2) for i in range(2)]
    if p.a_transposed:
        bufs += [SpBuffer(f"a_t{i}", t.bt * kt * _round(t.mt, p.a.layout.lanes) * 2) for i in range(2)]
    bufs += [SpBuffer(f"b{i}", kt * nt * 2) for i in range(2)]
    if p.b_transposed:
        bufs += [SpBuffer(f"b_t{i}", nt * kt * 2) for i in range(2)]
    n_acc = 2 if t.acc_double and sh.n_tiles * sh.groups > 1 else 1
    bufs += [SpBuffer(f"acc{i}", sh.row_tiles * rows * nt * 4) for i in range(n_acc)]
    chunk = sh.chunk_rows if s.k > 1 else rows
    if p.needs_epilogue:
        bufs += [SpBuffer(f"o{i}", chunk * nt * p.out.layout.itemsize) for i in range(2)]
    if p.bias is not None:
        bufs += [SpBuffer(f"bias{i}", _addend_bytes(p.bias, chunk, nt, t)) for i in range(2)]
        if p.spec.beta != 1.0:
            bufs.append(SpBuffer("bias_scaled", chunk * nt * 4))
    if p.residual is not None:
        bufs += [SpBuffer(f"res{i}", _addend_bytes(p.residual, chunk, nt, t)) for i in range(2)]
    if p.has_norm:  # the norm's weight and bias rows, an fp32 scratch chunk, and per-row statistics
        for name, x in (("nw", p.norm_weight), ("nb", p.norm_bias)):
            if x is not None:
                bufs += [SpBuffer(f"{name}{i}", _addend_bytes(x, chunk, nt, t)) for i in range(2)]
        bufs += [SpBuffer("ln_sq", chunk * nt * 4), SpBuffer("ln_mean", chunk * 4), SpBuffer("ln_rstd", chunk * 4)]
    if s.k > 1:  # receive slots from the upstream neighbour of each direction
        bufs += [SpBuffer(f"recv{d}", sh.recv_slots * chunk * nt * 4) for d in range(2)]
    if s.leftover_k > 1 and n_acc == 1:  # the upstream partial sum of the leftover stick (else: the other acc)
        bufs.append(SpBuffer("xrecv", sh.group_rows * UNIT * 4))
    if room is not None and _a_buffers(t) == 3:
        third = SpBuffer("a2", rows * kt * 2)
        if sum(b.aligned_bytes for b in bufs) + third.aligned_bytes <= room:
            bufs.append(third)
    return bufs


def _a_buffers(t: Tiles) -> int:
    """A buffers wanted: three when A is shared over the ring and streamed. The row's loading core
    then starts each A load two tiles ahead of its use instead of one: every core's stores and B loads
    share the DRAM with it at an N tile's end (512x4096x12800: one 128 KiB A load took 44 us there, the
    whole row waiting for it)."""
    return 3 if t.share == "a" and not t.a_resident else 2


def _addend_bytes(x, chunk: int, nt: int, t: Tiles) -> int:
    """A bias or residual chunk in scratchpad: [rows, N] as the output; sticked on M, [N, M sticks] per
    batch, from the stick holding the chunk's first row (up to a stick more per batch)."""
    if x.lane_dim == 2:
        return chunk * nt * x.layout.itemsize
    return nt * (chunk + min(chunk, t.bt) * 2 * x.layout.lanes) * x.layout.itemsize


def _round(x: int, m: int) -> int:
    return ceil_div(x, m) * m


def _fits(p: _Problem, s: Split, t: Tiles, sh: _Shape, cfg: CardConfig) -> bool:
    need = sum(b.aligned_bytes for b in _buffers(p, s, t, sh))
    return need <= cfg.scratchpad_plannable_bytes



# =============================================================================================
# A tiles and epilogue chunks of one core
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



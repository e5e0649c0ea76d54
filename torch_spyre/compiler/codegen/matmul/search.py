"""Choosing a matmul plan: every split that gives each core work, the best tiles for each (the cheapest
estimate among the tiles that fit the scratchpad), ranked by the cost model.

Also the alternatives the decisions record compares against: :func:`naive_split` (output rows only)
and :func:`plan_for_split` (the best tiles for a split chosen by hand).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ....card.config import CardConfig
from .cost import Estimate, _split_traffic, estimate
from .plan import Split, Tiles, _assign, _core_shape, _CoreWork, _divisors, _fits, _round, _row_align, _Shape, _splits
from .spec import UNIT, MatmulSpec, MatmulSpecError, _check, _Problem


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



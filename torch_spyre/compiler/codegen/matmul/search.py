"""Choosing a matmul plan: every split that gives each core work, the best tiles for each (the cheapest
estimate among the tiles that fit the scratchpad), ranked by the cost model.

Also the alternatives the decisions record compares against: :func:`naive_split` (output rows only)
and :func:`plan_for_split` (the best tiles for a split chosen by hand).
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass, replace
from typing import Iterable

from ....card.config import CardConfig
from ....util.bounded_cache import BoundedCache
from ... import optimizations
from .cost import Estimate, _split_traffic, _SplitTraffic, core_shape, estimate, lower_bound
from .plan import Split, Tiles, _assign, _CoreWork, _divisors, _fits, _round, _row_align, _Shape, _splits
from .spec import UNIT, MatmulSpec, MatmulSpecError, _check, _Problem


def _tile_options(total: int, limit: int = 12) -> list[int]:
    """Tile sizes worth trying for ``total`` units: equal pieces (largest first)."""
    out = sorted({-(-total // d) for d in range(1, total + 1)}, reverse=True)
    return out[:limit]


def _candidate_tiles(p: _Problem, s: Split, cfg: CardConfig, sharing: bool = True,
                     limit: int = 6) -> Iterable[Tiles]:
    """Tiles to try for split ``s``, largest first; ``limit``: how many N and K tile sizes."""
    work = _assign(p, s, cfg)
    w = work[0]
    nb, nm = w.batches[1], w.rows[1]
    ku, nu = -(-w.kcols[1] // UNIT), -(-w.ncols[1] // UNIT)
    align = _row_align(p)
    mts = sorted({_round(-(-nm // d), align) for d in (1, 2, 3, 4, 6, 8, 12, 16)} | {min(nm, 64)}, reverse=True)
    bts = _tile_options(nb, 4) if p.b_shared else [1]
    networks = ("reduce", "data") if s.k > 1 else ("",)
    # A shared over the ring along each row of the split (share.py): only without a K-split, with whole
    # K tiles (each tile one contiguous range to forward) and A not transposed in scratchpad.
    can_share = sharing and s.k == 1 and s.n > 1 and not p.a_transposed
    kts = _tile_options(ku, limit)
    if can_share:  # sharing needs K tiles dividing K: the largest such tiles below the equal pieces above
        # K tiles of 2 sticks only with 64 rows or more per core: they let 2-stick N tiles and 342-row
        # tiles fit (4096^3 2,271.2 -> 2,209.1 us, 512x4096x12800 1,073.3 -> 1,018.5 us); a decode GEMV
        # (1 row) given them streams twice the instructions for nothing (221.3 -> 221.7 us, under 95 %).
        least = 2 if nb * nm >= 64 else 4
        divs = [d for d in sorted(_divisors(ku), reverse=True) if d < kts[-1] and d >= least]
        # ... and the smallest (a long K's equal pieces stop at 19 sticks, its 3 largest divisors below at 8:
        # 1024x14336x4096 with 171-row tiles of 16 sticks 1,994.8 us, with 342-row tiles of 2 1,849.4 us)
        kts += divs[:3] + [d for d in divs[3:] if d <= 2 * least]
    elif p.has_norm:  # whole rows of N per B tile: a wide N (4096) fits only with K tiles of few sticks
        kts += [d for d in (4, 2, 1) if d < kts[-1]]
    for nt in ([nu] if p.has_norm else _tile_options(nu, limit)):  # a norm needs whole rows in one tile
        for kt in kts:
            for mt in mts:
                for bt in bts:
                    if bt > 1 and mt < nm:
                        continue  # several batches per tile only with every row of each
                    for res in (True, False):
                        if res and -(-nu // nt) == 1 and -(-ku // kt) == 1:
                            continue  # nothing to reuse
                        shares = ("", "a") if can_share and ku % kt == 0 else ("",)
                        for net in networks:
                            for share in shares:
                                yield Tiles(bt, mt, nt, kt, res, net, share=share)
                                if -(-nu // nt) > 1:
                                    yield Tiles(bt, mt, nt, kt, res, net, acc_double=False, share=share)


_TIE = 1.01  # estimates within 1 % of a split's best tie; the fewest instructions wins


@dataclass
class Plan:
    """A work division, its tiles and the cost model's estimate."""

    split: Split
    tiles: Tiles
    est: Estimate


def sharing_enabled() -> bool:
    """Whether A may be shared over the ring here and now (the ``ring_sharing`` optimization)."""
    return optimizations.enabled("ring_sharing")


def _best_tiles(p: _Problem, s: Split, cfg: CardConfig, traffic: _SplitTraffic | None = None,
                sharing: bool | None = None) -> Plan | None:
    """The cheapest tiles for split ``s`` that fit the scratchpad (with ``sharing``, A forwarded over the
    ring is among the candidates; None: unless ``ring_sharing`` is switched off). Estimates within 1 % of
    the best count as a tie, settled by the fewest instructions (a smaller program, faster to prepare and
    simulate)."""
    sharing = sharing_enabled() if sharing is None else sharing
    traffic = traffic or _split_traffic(p, s, cfg)
    scored, best = [], float("inf")
    for t in _candidate_tiles(p, s, cfg, sharing):
        if _exceeds(lower_bound(p, s, cfg, traffic, t), _TIE * best):
            continue  # cannot come within the tie margin of a plan already scored (nor of the best)
        sh = core_shape(p, s, t, traffic)
        if not t.acc_double and _fits_once(p, s, replace(t, acc_double=True), sh, cfg, traffic):
            continue  # one accumulator only pays when two do not fit
        if _fits_once(p, s, t, sh, cfg, traffic):
            scored.append((estimate(p, s, t, cfg, traffic), _instructions(sh), t))
            best = min(best, scored[-1][0].total_s)
    if not scored:
        return None
    e, _, t = min((c for c in scored if c[0].total_s <= _TIE * best), key=lambda c: (c[1], c[0].total_s))
    return Plan(s, t, e)


def _fits_once(p: _Problem, s: Split, t: Tiles, sh: _Shape, cfg: CardConfig, tr: _SplitTraffic) -> bool:
    """``_fits`` (the buffers do not depend on the K-split network), once per split and tiles."""
    key = ("fits", t.bt, t.mt, t.nt, t.kt, t.a_resident, t.acc_double)
    fits = tr.memo.get(key)
    if fits is None:
        fits = tr.memo[key] = _fits(p, s, t, sh, cfg)
    return fits


def _instructions(sh: _Shape) -> int:
    """Matmul and load instructions of the busiest core (the bulk of its program)."""
    return sh.groups * sh.n_tiles * sh.k_tiles * (2 * sh.row_tiles + 1)


def _span_ok(p: _Problem, s: Split, cfg: CardConfig) -> bool:
    return max(_core_span(p, w) for w in _assign(p, s, cfg)) <= cfg.core_address_span_bytes


def _core_span(p: _Problem, w: _CoreWork) -> int:
    """Device bytes one core addresses (the sum over operands of max - min), as validate counts it."""
    (b0, nb), (m0, nm), (n0, nn), (k0, nk) = w.batches, w.rows, w.ncols, w.kcols
    boxes = [(p.a, (b0, m0, k0), (nb, nm, nk)), (p.b, (b0, k0, n0), (nb, nk, nn))]
    boxes += [(x, (b0, m0, n0), (nb, nm, nn)) for x in (p.out, p.bias, p.residual, p.norm_weight, p.norm_bias)
              if x is not None]
    if w.extra is not None:  # the leftover piece: its B slice and (on any core of the chain) its output
        xn0, xnn, xk0, xkn = w.extra[:4]
        boxes.append((p.b, (b0, xk0, xn0), (nb, xkn, xnn)))
        boxes += [(x, (b0, m0, xn0), (nb, nm, xnn)) for x in (p.out, p.bias, p.residual) if x is not None]
    hull: dict[int, tuple[int, int]] = {}  # per operand: the lowest and highest byte addressed
    for bound, lo, n in boxes:
        start, end = bound.span(lo, n)
        old = hull.get(id(bound), (start, end))
        hull[id(bound)] = (min(old[0], start), max(old[1], end))
    return sum(end - start for start, end in hull.values())


def rank_plans(spec: MatmulSpec, config: CardConfig, top: int | None = None, keep: int | None = None,
               max_cores: int | None = None) -> list[Plan]:
    """Every feasible split with its best tiles, cheapest estimate first.

    With ``max_cores``: only splits over at most that many cores (``core_count``'s minimum work per
    core), unless none of them has a plan (then every split, as without it).

    With ``keep`` = n: the n cheapest plans and the cheapest without a K-split, exactly as in the full
    ranking (same plans, same order), followed by whichever other splits had to be scored to prove it.
    Splits are scored in the order of their :func:`~.cost.lower_bound`; a split whose bound exceeds the
    n-th cheapest estimate found so far (and, without a K-split, the cheapest such plan) cannot enter
    those places and is skipped. A new sequence length needs a new search, so this is what it costs."""
    p = _check(spec)
    feasible, over_span = [], 0
    for i, s in enumerate(_splits(p, config)):
        if _span_ok(p, s, config):
            feasible.append((i, s))
        else:
            over_span += 1
    allowed = [(i, s) for i, s in feasible if max_cores is None or s.cores <= max_cores]
    scored = _scored_splits(p, allowed, config, keep)
    if not scored and len(allowed) < len(feasible):
        scored = _scored_splits(p, feasible, config, keep)
    choices = [c for _, _, c in sorted(scored, key=lambda x: (x[0], x[1]))]
    if not choices:
        if over_span:
            raise MatmulSpecError(
                f"{p.describe()}: every work division leaves some core addressing more than "
                f"config.core_address_span_bytes = {config.core_address_span_bytes} bytes of device memory "
                f"(a: {p.a.layout.nbytes} B, b: {p.b.layout.nbytes} B, out: {p.out.layout.nbytes} B); "
                "split the matmul into several kernels")
        raise MatmulSpecError(f"{p.describe()}: no tiling fits {config.scratchpad_plannable_bytes} plannable "
                              "scratchpad bytes per core")
    return choices[:top] if top else choices


# Ranked plans by what the ranking depends on (see :func:`plan_key`): the layers of a model repeat their
# matmuls, and so does every call of an eager op; a bounded LRU.
PLAN_CACHE_SIZE = 1024
_PLANS: BoundedCache[tuple, list[Plan]] = BoundedCache(PLAN_CACHE_SIZE)
_PLANS_LOCK = threading.Lock()  # for the counters
plan_cache_stats = {"hits": 0, "misses": 0}


def plan_key(spec: MatmulSpec, config: CardConfig, keep: int | None, max_cores: int | None = None) -> tuple:
    """Everything :func:`rank_plans` reads: the operands' shapes, strides, storage offsets and layouts (not
    their names), alpha, beta, the kind, the epilogue, the card's configuration, ``keep``, ``max_cores`` and
    whether ring sharing and the leftover split are switched on."""
    def anon(view, role: str):
        return None if view is None else replace(view, name=role)

    return (anon(spec.a, "a"), anon(spec.b, "b"), anon(spec.out, "out"), anon(spec.bias, "bias"),
            anon(spec.residual, "residual"), spec.alpha, spec.beta, spec.kind, spec.activation, config, keep, max_cores,
            sharing_enabled(), optimizations.enabled("matmul_leftover_split"), spec.norm_eps,
            anon(spec.norm_weight, "norm_weight"), anon(spec.norm_bias, "norm_bias"))


def cached_rank_plans(spec: MatmulSpec, config: CardConfig, keep: int | None = None,
                      max_cores: int | None = None) -> list[Plan]:
    """:func:`rank_plans` once per :func:`plan_key` (a copy of the list; the plans themselves are shared and
    never modified)."""
    key = plan_key(spec, config, keep, max_cores)
    ranked = _PLANS.get(key)
    if ranked is not None:
        with _PLANS_LOCK:
            plan_cache_stats["hits"] += 1
        return list(ranked)
    ranked = rank_plans(spec, config, keep=keep, max_cores=max_cores)
    with _PLANS_LOCK:
        plan_cache_stats["misses"] += 1
    _PLANS.put(key, ranked)
    return list(ranked)


def _scored_splits(p: _Problem, feasible: list[tuple[int, Split]], cfg: CardConfig,
                   keep: int | None) -> list[tuple[float, int, Plan]]:
    """(estimate, position among the splits, plan) of the splits ``rank_plans`` must score."""
    if keep is None:
        return [(c.est.total_s, i, c) for i, s in feasible if (c := _best_tiles(p, s, cfg)) is not None]
    bounded = []
    for i, s in feasible:
        tr = _split_traffic(p, s, cfg)
        bounded.append((lower_bound(p, s, cfg, tr), i, s, tr))
    bounded.sort(key=lambda x: (x[0], x[1]))
    out: list[tuple[float, int, Plan]] = []
    cheapest: list[float] = []  # the ``keep`` cheapest estimates so far, negated (a max-heap)
    best_no_ksplit = float("inf")
    for bound, i, s, tr in bounded:
        kth = -cheapest[0] if len(cheapest) >= keep else float("inf")
        if _exceeds(bound, kth) and (s.k > 1 or _exceeds(bound, best_no_ksplit)):
            continue
        c = _best_tiles(p, s, cfg, tr)
        if c is None:
            continue
        total = c.est.total_s
        out.append((total, i, c))
        heapq.heappush(cheapest, -total)
        if len(cheapest) > keep:
            heapq.heappop(cheapest)
        if s.k == 1:
            best_no_ksplit = min(best_no_ksplit, total)
    return out


def _exceeds(bound: float, estimate_s: float) -> bool:
    """``bound`` is above ``estimate_s`` by more than rounding (the bound is a sum in the estimate's order)."""
    return bound > estimate_s * (1 + 1e-9)



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


def first_fit(spec: MatmulSpec, config: CardConfig) -> Plan:
    """The plan with the ``matmul_tiling`` optimization switched off: the naive split (output rows only) and
    the first tiles of the candidate order (largest first) that fit the scratchpad, without searching."""
    p = _check(spec)
    s = naive_split(spec, config)
    traffic = _split_traffic(p, s, config)
    # Every N and K tile size (the search's short list may have none that fits a core's whole rows).
    for t in _candidate_tiles(p, s, config, sharing=False, limit=1 << 30):
        if _fits_once(p, s, t, core_shape(p, s, t, traffic), config, traffic):
            return Plan(s, t, estimate(p, s, t, config, traffic))
    raise MatmulSpecError(f"{p.describe()}: no tiling fits {config.scratchpad_plannable_bytes} plannable "
                          f"scratchpad bytes per core on the naive split {s} (matmul_tiling is switched off; "
                          "switch it on to search the other splits)")


def plan_for_split(spec: MatmulSpec, split: Split, config: CardConfig) -> Plan:
    """The best tiles for a given split (for comparing alternatives)."""
    p = _check(spec)
    if _assign(p, split, config) is None:
        raise MatmulSpecError(f"{p.describe()}: split {split} leaves cores without work")
    c = _best_tiles(p, split, config)
    if c is None:
        raise MatmulSpecError(f"no tiles fit the scratchpad for split {split}")
    return c



"""The analytic cost model of a matmul plan: seconds for (split, tiles) without writing the program.

Busy time combines compute (PE arrays, vector unit of the busiest core) and data movement (its DMA
channels, the shared DRAM with read/write turnaround, the busiest ring link: DRAM traffic rides the ring
to the memory stop, K-split partial sums the reduction or the data ring), plus fixed cost, pipeline
fill, drain and the DMA latency double buffering cannot hide. The PE, vector and ring formulas are the
card's own (``card/costs.py``), so the estimate cannot drift from the timing model that judges it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ....card import costs
from ....card.config import CardConfig
from ....program import TRANSCENDENTAL_OPS
from .plan import Split, Tiles, _assign, _chunks_el, _core_shape, _CoreWork, _round, _Shape
from .share import forwarding, rows_sharing_a
from .spec import UNIT, _Problem

OVERLAP_LOSS = 0.25  # share of the shorter of compute and data movement that double buffering leaves exposed


@dataclass
class Estimate:
    total_s: float
    parts: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"total_us": round(self.total_s * 1e6, 2), **{k: round(v * 1e6, 2) for k, v in self.parts.items()}}


def _counted(sizes: list[int]) -> list[tuple[int, int]]:
    """Distinct sizes with how often they occur (tiles are all full but the last)."""
    out: dict[int, int] = {}
    for x in sizes:
        out[x] = out.get(x, 0) + 1
    return list(out.items())


def _pieces(total: int, step: int) -> list[int]:
    return [n for _, n in _chunks_el(total, step)]


@dataclass
class _SplitTraffic:
    """The DRAM and ring traffic of a split that does not depend on the tiles: per core, bytes of A (to be
    multiplied by how often A is reloaded), other reads and writes; per ring link, the same summed over
    the cores whose DRAM traffic crosses it, and how many K-split neighbour pairs it joins."""

    work: list[_CoreWork]
    a: list[int]
    other_reads: list[int]
    writes: list[int]
    link_a: dict[tuple, int]
    link_other: dict[tuple, int]
    chain_pairs: dict[tuple, int]
    # The search scores hundreds of tiles per split: the parts of a plan that depend on only some of the
    # tile fields (the core's shape, PE time, memory time, whether the buffers fit) are computed once each.
    memo: dict[tuple, Any] = field(default_factory=dict)


def _split_traffic(p: _Problem, s: Split, cfg: CardConfig) -> _SplitTraffic:
    work = _assign(p, s, cfg)
    assert work is not None
    a, other, writes = [], [], []
    for w in work:
        ab, ob, wb = _core_dram_bytes(p, s, w)
        a.append(ab), other.append(ob), writes.append(wb)
    n, mem = cfg.num_cores, cfg.memory_ring_stop
    link_a: dict[tuple, int] = {}
    link_other: dict[tuple, int] = {}
    pairs: dict[tuple, int] = {}
    for i, w in enumerate(work):
        for l in costs.ring_path(mem, w.core, n):
            link_a[l] = link_a.get(l, 0) + a[i]
            link_other[l] = link_other.get(l, 0) + other[i]
        for l in costs.ring_path(w.core, mem, n):
            link_other[l] = link_other.get(l, 0) + writes[i]
        if w.partner < s.k - 1:
            nxt = w.group[w.partner + 1]
            for l in costs.ring_path(w.core, nxt, n) + costs.ring_path(nxt, w.core, n):
                pairs[l] = pairs.get(l, 0) + 1
        if w.extra is not None and w.extra[4] < len(w.extra[5]) - 1:  # a leftover stick's partial sum, once
            for l in costs.ring_path(w.core, w.extra[5][w.extra[4] + 1], n):
                link_other[l] = link_other.get(l, 0) + _leftover_partial_bytes(p, w)
    return _SplitTraffic(work, a, other, writes, link_a, link_other, pairs)


def estimate(p: _Problem, s: Split, t: Tiles, cfg: CardConfig, traffic: _SplitTraffic | None = None) -> Estimate:
    """Seconds for plan (s, t): fixed cost + pipeline fill + busy time + drain + exposed latency. Busy
    time combines compute (PE arrays, vector unit of the busiest core) and data movement (its DMA
    channels, the shared DRAM, the busiest ring link)."""
    tr = traffic or _split_traffic(p, s, cfg)
    sh = core_shape(p, s, t, tr)  # the first core has the largest box
    memo, geometry, w = tr.memo, (t.bt, t.mt, t.nt, t.kt), tr.work[0]
    pe = memo.get(("pe", geometry))
    if pe is None:
        pe = memo[("pe", geometry)] = _pe_seconds(p, t, sh, w, cfg)
    vector = memo.get(("vector", t.a_resident, sh.n_tiles))
    if vector is None:
        vector = memo[("vector", t.a_resident, sh.n_tiles)] = _vector_seconds(p, s, t, sh, w, cfg)
    memory = memo.get(("memory", t.a_resident, t.network, sh.n_tiles, t.share))
    if memory is None:
        memory = memo[("memory", t.a_resident, t.network, sh.n_tiles, t.share)] = _memory_seconds(p, s, t, sh, tr, cfg)
    steady = {"pe": pe, "vector": vector, **memory}
    fill, drain = _fill_seconds(sh, len(tr.work), cfg), _drain_seconds(p, s, t, sh, len(tr.work), cfg)
    if t.share == "a":
        fill += _chain_lag(sh, tr, cfg)
    exposed = _exposed_latency(p, t, sh, cfg, steady["pe"]) + _boundary_stall(p, t, sh, len(tr.work), cfg, steady["pe"])
    tiles = sh.n_tiles * (1 if p.b_shared else sh.groups)
    if not t.acc_double and tiles > 1:
        exposed += (tiles - 1) * drain  # each tile's epilogue now runs alone, like the last one's
    compute = max(steady["pe"], steady["vector"])
    memory = max(steady["dma_core"], steady["dram"], steady["ring"])
    # Two double-buffered sides never overlap perfectly: a share of the shorter one shows.
    busy = max(compute, memory) + OVERLAP_LOSS * min(compute, memory)
    total = cfg.kernel_fixed_cost_s + fill + busy + drain + exposed
    return Estimate(total, {**steady, "fill": fill, "drain": drain, "exposed_latency": exposed})


def core_shape(p: _Problem, s: Split, t: Tiles, tr: _SplitTraffic) -> _Shape:
    """``_core_shape`` of the split's first core (the largest box), once per tile geometry."""
    key = ("shape", t.bt, t.mt, t.nt, t.kt)
    sh = tr.memo.get(key)
    if sh is None:
        sh = tr.memo[key] = _core_shape(p, s, t, tr.work[0])
    return sh


def lower_bound(p: _Problem, s: Split, cfg: CardConfig, tr: _SplitTraffic, t: Tiles | None = None) -> float:
    """Seconds no tiling of split ``s`` can beat (with ``t``: no tiles with ``t``'s A residency, K-split
    network and N tile count): :func:`estimate` with fill and drain at their DRAM latency, no exposed
    latency, the PE arrays on every weight tile with no fill, and (without ``t``) A read once, no
    turnaround and no K-split traffic. Each term is the estimate's own with a quantity replaced by a
    smaller one, added in the same order, so the floating-point sums keep the order too. The search skips
    what such a bound proves cannot be chosen."""
    floor = tr.memo.get(("floor",))
    if floor is None:
        floor = tr.memo[("floor",)] = _floors(p, s, cfg, tr)
    compute, memory = floor
    if t is not None:
        n_tiles = -(-tr.work[0].ncols[1] // (t.nt * UNIT)) + (tr.work[0].extra is not None)
        key = ("memory", t.a_resident, t.network, n_tiles, t.share)
        parts = tr.memo.get(key)
        if parts is None:
            parts = tr.memo[key] = _memory_seconds(p, s, t, core_shape(p, s, t, tr), tr, cfg)
        memory = max(parts["dma_core"], parts["dram"], parts["ring"])
    busy = max(compute, memory) + OVERLAP_LOSS * min(compute, memory)
    return cfg.kernel_fixed_cost_s + cfg.dram_latency_s + busy + cfg.dram_latency_s


def _floors(p: _Problem, s: Split, cfg: CardConfig, tr: _SplitTraffic) -> tuple[float, float]:
    """The split's compute and memory seconds at their floor, for :func:`lower_bound`."""
    w = tr.work[0]
    schemes = [(tr.a, tr.link_a, {})] + ([_shared_a(tr, cfg)] if s.k == 1 and s.n > 1 else [])
    dma_core = dram = ring = float("inf")  # the least of each over the schemes a plan may use
    for a_bytes, link_a, chain in schemes:
        reads = [a + o for a, o in zip(a_bytes, tr.other_reads)]
        dma_core = min(dma_core, max(max(reads), max(tr.writes)) / (cfg.dma_bytes_per_cycle * cfg.clock_hz))
        dram = min(dram, sum(reads) / cfg.dram_read_bandwidth + sum(tr.writes) / cfg.dram_write_bandwidth)
        links = set(link_a) | set(tr.link_other) | set(chain)
        load = {l: link_a.get(l, 0) + chain.get(l, 0) + tr.link_other.get(l, 0) for l in links}
        ring = min(ring, max(load.values(), default=0) / cfg.ring_link_bandwidth)
    # PE: the sum over tiles of ceil(weight tiles / corelets) * (rows + fill) is at least every row through
    # every weight tile of the core's K x N, shared by the corelets.
    rows = w.rows[1] * (w.batches[1] if p.b_shared else 1)
    weight_tiles = costs.ceil_div(w.kcols[1], cfg.pe_rows) * costs.ceil_div(
        w.ncols[1], cfg.pe_cols * costs.pe_simd(cfg, "dlfloat16"))
    if w.extra is not None:
        weight_tiles += costs.ceil_div(w.extra[3], cfg.pe_rows) * costs.ceil_div(
            w.extra[1], cfg.pe_cols * costs.pe_simd(cfg, "dlfloat16"))
    groups = 1 if p.b_shared else w.batches[1]
    pe = costs.ceil_div(rows * weight_tiles, cfg.corelets_in_use) * groups / cfg.clock_hz
    one_pass = Tiles(1, max(1, w.rows[1]), 1, 1, True)  # A resident: read once (the vector part needs only that)
    vector = _vector_seconds(p, s, one_pass, _core_shape(p, replace(s, k=1), one_pass, w), w, cfg)
    return max(pe, vector), max(dma_core, dram, ring)


def _pe_seconds(p: _Problem, t: Tiles, sh: _Shape, w: _CoreWork, cfg: CardConfig) -> float:
    """The core's matmuls at the PE arrays' rate (summed over the distinct tile sizes)."""
    rows = _counted(_row_pieces(p, t, w))
    kp, np_ = _counted(_pieces(w.kcols[1], sh.kt_el)), _counted(_pieces(w.ncols[1], sh.nt_el))
    per_pass = sum(costs.pe_matmul_cycles(cfg, r, k, n) * cr * ck * cn for r, cr in rows for k, ck in kp for n, cn in np_)
    if w.extra is not None:  # the leftover piece: its K range in the pieces the K tiles cut it into
        n0, nn, k0, kn = w.extra[:4]
        xk = _counted([min(k0 + kn, a + sh.kt_el) - max(k0, a) for a in range(0, w.kcols[1], sh.kt_el)
                       if a < k0 + kn and k0 < a + sh.kt_el])
        per_pass += sum(costs.pe_matmul_cycles(cfg, r, k, nn) * cr * ck for r, cr in rows for k, ck in xk)
    return per_pass * (1 if p.b_shared else sh.groups) / cfg.clock_hz


def _vector_seconds(p: _Problem, s: Split, t: Tiles, sh: _Shape, w: _CoreWork, cfg: CardConfig) -> float:
    """Epilogue ops (fp32), K-split adds and in-scratchpad transposes of the core."""
    elems_out = sh.group_rows * w.ncols[1] * (1 if p.b_shared else sh.groups)
    vec = 0
    if w.extra is not None:  # the leftover stick: its last core's epilogue; the others' partial-sum adds
        last = w.extra[4] == len(w.extra[5]) - 1
        elems_out += sh.group_rows * w.extra[1] if last else 0
        if w.extra[4] > 0:
            vec += costs.vector_cycles(cfg, sh.group_rows * w.extra[1], 4)
    for op in p.epilogue_steps or (["cast"] if p.needs_epilogue else []):
        vec += costs.vector_cycles(cfg, elems_out, 4, transcendental=op in TRANSCENDENTAL_OPS)
    if s.k > 1:
        vec += costs.vector_cycles(cfg, elems_out, 4)  # one add of a partner's partial per element
    if p.b_transposed:
        vec += costs.vector_cycles(cfg, sh.groups * w.kcols[1] * w.ncols[1], 2)
    if p.a_transposed:
        a_reload = 1 if t.a_resident else sh.n_tiles
        vec += costs.vector_cycles(cfg, w.batches[1] * w.rows[1] * w.kcols[1] * a_reload, 2)
    return vec / cfg.clock_hz


def _shared_a(tr: _SplitTraffic, cfg: CardConfig) -> tuple[list[int], dict[tuple, int], dict[tuple, int]]:
    """With A shared over the ring (share.py): the A bytes each core loads from DRAM (the row's first core
    all of them, the others none), the DRAM-to-core links those loads cross, and the ring links the
    forwarding chains cross (each hop carries the row's A once)."""
    found = tr.memo.get(("shared_a",))
    if found is None:
        index = {w.core: i for i, w in enumerate(tr.work)}
        a = [0] * len(tr.work)
        link_a: dict[tuple, int] = {}
        chain: dict[tuple, int] = {}
        n, mem = cfg.num_cores, cfg.memory_ring_stop
        for row in rows_sharing_a(tr.work, cfg, at_memory=True):
            loader, hops = forwarding(row)
            head = index[loader]
            a[head] = tr.a[head]
            for l in costs.ring_path(mem, loader, n):
                link_a[l] = link_a.get(l, 0) + a[head]
            for u, v in hops:
                for l in costs.ring_path(u, v, n):
                    chain[l] = chain.get(l, 0) + a[head]
        found = tr.memo[("shared_a",)] = (a, link_a, chain)
    return found


def _memory_seconds(p: _Problem, s: Split, t: Tiles, sh: _Shape, tr: _SplitTraffic, cfg: CardConfig) -> dict[str, float]:
    """The busiest core's DMA channel, the shared LPDDR5 (with read/write turnaround), and the busiest
    ring link (DRAM traffic to and from the memory stop, A forwarded along the rows when shared, plus
    K-split partial sums)."""
    a_reload = 1 if t.a_resident else sh.n_tiles
    a_bytes, link_a, chain = (tr.a, tr.link_a, {}) if t.share != "a" else _shared_a(tr, cfg)
    reads = [a * a_reload + o for a, o in zip(a_bytes, tr.other_reads)]
    dma_core = max(max(reads), max(tr.writes)) / (cfg.dma_bytes_per_cycle * cfg.clock_hz)
    dram = sum(reads) / cfg.dram_read_bandwidth + sum(tr.writes) / cfg.dram_write_bandwidth
    dram += _turnaround(p, t, sh, tr, reads, cfg)
    link_bw = _chain_link_bandwidth(t, cfg)
    half = sh.group_rows * _round(tr.work[0].ncols[1], UNIT) * 4 * (1 if p.b_shared else sh.groups) / 2
    links = set(link_a) | set(tr.link_other) | set(chain)
    load = {l: (link_a.get(l, 0) + chain.get(l, 0)) * a_reload + tr.link_other.get(l, 0) for l in links}
    ring = max(load.values(), default=0) / cfg.ring_link_bandwidth
    if s.k > 1:  # chunks alternate direction: half the partial sums cross each link each way
        if t.network == "data":
            ring = max([ring] + [(load.get(l, 0) + c * half) / link_bw for l, c in tr.chain_pairs.items()])
        else:
            ring = max(ring, max(c * half for c in tr.chain_pairs.values()) / link_bw)
    return {"dma_core": dma_core, "dram": dram, "ring": ring}


def _chain_link_bandwidth(t: Tiles, cfg: CardConfig) -> float:
    if t.network == "reduce":
        return cfg.reduction_ring_bytes_per_cycle * cfg.clock_hz * cfg.ring_efficiency
    return cfg.ring_link_bandwidth


def _chain_lag(sh: _Shape, tr: _SplitTraffic, cfg: CardConfig) -> float:
    """With A forwarded along the rows: the last core of the longest chain gets its first tile that many
    hops after the loading core (each hop moves the whole tile at one link's bandwidth)."""
    hops = tr.memo.get(("longest_chain",))
    if hops is None:
        longest = 0
        for row in rows_sharing_a(tr.work, cfg, at_memory=True):
            mid = len(row) // 2
            longest = max(longest, mid, len(row) - 1 - mid)
        hops = tr.memo[("longest_chain",)] = longest
    return hops * sh.tile_rows * sh.kt_el * 2 / cfg.ring_link_bandwidth


def _fill_seconds(sh: _Shape, cores: int, cfg: CardConfig) -> float:
    """The first A and B tiles load before any PE work, every core at once over the shared DRAM."""
    first = (sh.tile_rows * sh.kt_el + sh.kt_el * sh.nt_el) * 2
    return cfg.dram_latency_s + max(first / (cfg.dma_bytes_per_cycle * cfg.clock_hz), first * cores / cfg.dram_read_bandwidth)


def _drain_seconds(p: _Problem, s: Split, t: Tiles, sh: _Shape, cores: int, cfg: CardConfig) -> float:
    """The last N tile's epilogue cannot hide behind matmuls: its vector work, stores and K-split chain."""
    clock, link_bw = cfg.clock_hz, _chain_link_bandwidth(t, cfg)
    tail = sh.group_rows * sh.nt_el
    storing = cores if s.k == 1 else 2 * cores // s.k
    out_bytes = tail * p.out.layout.itemsize / (1 if s.k == 1 else 2)
    drain = cfg.dram_latency_s + max(out_bytes / (cfg.dma_bytes_per_cycle * clock), out_bytes * storing / cfg.dram_write_bandwidth)
    drain += costs.vector_cycles(cfg, tail, 4) * (2 if s.k > 1 else 1) / clock
    if s.k > 1:
        chunk = min(sh.chunk_rows, sh.group_rows) * sh.nt_el
        drain += (s.k - 1) * (chunk * 4 / link_bw + costs.vector_cycles(cfg, chunk, 4) / clock)
        drain += max(0, tail - chunk) * 4 / link_bw / 2
    return drain


def _turnaround(p: _Problem, t: Tiles, sh: _Shape, tr: _SplitTraffic, reads: list[int], cfg: CardConfig) -> float:
    """LPDDR5 read/write turnaround: the stores of every N tile but the last run while later tiles load
    (all but the first tile's loads); interleaved, each of those bytes loses the mixed-traffic efficiency."""
    tiles = sh.n_tiles * (1 if p.b_shared else sh.groups)
    if tiles < 2:
        return 0.0
    a_bytes = tr.a if t.share != "a" else _shared_a(tr, cfg)[0]
    first = sum(a_bytes) if t.a_resident else 0  # a resident A is loaded with the first tile
    r = (sum(reads) - first) * (tiles - 1) / tiles
    w = sum(tr.writes) * (tiles - 1) / tiles
    t_r, t_w = 1 / cfg.dram_read_bandwidth, 1 / cfg.dram_write_bandwidth
    t_turn = max(0.0, 2 / (cfg.dram_peak_bandwidth * cfg.dram_mixed_efficiency) - t_r - t_w)
    # Only part of that traffic is in flight at the same moment (loads run ahead of the stores).
    return t_turn * r * w / (r + w) if r + w else 0.0


def _exposed_latency(p: _Problem, t: Tiles, sh: _Shape, cfg: CardConfig, pe_s: float) -> float:
    """DMA latency the double buffering cannot hide: a load issued behind a matmul shorter than the
    DRAM latency leaves the PE arrays waiting for the difference. (The throughput terms above do not
    see latency; this is what stops the model from preferring tiny tiles whenever PE is not the bound.)"""
    passes = sh.groups if not p.b_shared else 1
    matmuls = sh.row_tiles * sh.k_tiles * sh.n_tiles * passes
    loads = matmuls // sh.n_tiles * (1 if t.a_resident else sh.n_tiles) + sh.k_tiles * sh.n_tiles * passes
    per_matmul = pe_s / max(1, matmuls)
    return loads * max(0.0, cfg.dram_latency_s - per_matmul)


def _boundary_stall(p: _Problem, t: Tiles, sh: _Shape, cores: int, cfg: CardConfig, pe_s: float) -> float:
    """With A shared and streamed: from the second N tile boundary on, every core stores the tile before
    and loads its next B tiles at the boundary, and the row's one A load gets a 1/cores share of the DRAM
    (max-min fair); the whole row waits for it, less what the third A buffer's two-tile head start hides.
    (At the first boundary no stores are in flight yet: the first tile's epilogue runs behind the second
    tile's matmuls. The card's timing: 1024x4096x14336 lost about 50 us at each of its 5 later boundaries.)"""
    if t.share != "a" or t.a_resident or sh.n_tiles < 3:
        return 0.0
    a_tile = sh.tile_rows * sh.kt_el * 2
    matmuls = sh.row_tiles * sh.k_tiles * sh.n_tiles
    ahead = 2 * pe_s / max(1, matmuls)
    per = max(0.0, a_tile * (cores - 1) / cfg.dram_read_bandwidth - ahead)
    return per * (sh.n_tiles - 2)


def _row_pieces(p: _Problem, t: Tiles, w: _CoreWork) -> list[int]:
    """Rows of each A tile one core streams per (K tile, N tile) pass."""
    ms = _pieces(w.rows[1], t.mt)
    if p.b_shared:
        bs = _pieces(w.batches[1], t.bt)
        return [b * m for b in bs for m in ms]
    return ms


def _core_dram_bytes(p: _Problem, s: Split, w: _CoreWork) -> tuple[int, int, int]:
    """Bytes one core moves (whole sticks): A read once, B and bias reads, output writes."""
    nb, nm = w.batches[1], w.rows[1]
    k_el, n_el = w.kcols[1], w.ncols[1]
    groups = 1 if p.b_shared else nb
    if p.a_transposed:
        a = nb * k_el * _round(nm, p.a.layout.lanes) * 2
    else:
        a = nb * nm * _round(k_el, UNIT) * 2
    if p.b_transposed:
        b = groups * n_el * _round(k_el, UNIT) * 2
    else:
        b = groups * k_el * _round(n_el, p.b.layout.lanes) * 2
    stores = w.partner in (0, s.k - 1)
    share = 1.0 if s.k == 1 else 0.5  # the two ends of a chain each finish half the chunks
    out, addends = _out_bytes(p, nb, nm, n_el, share) if stores else (0.0, 0.0)
    if w.extra is not None:  # the leftover piece: its B slice; the stick's output on the chain's last core
        _, xn, _, xk, i, chain = w.extra
        b += xk * _round(xn, p.b.layout.lanes) * 2
        if i == len(chain) - 1:
            xo, xa = _out_bytes(p, nb, nm, xn, 1.0)
            out, addends = out + xo, addends + xa
    return a, b + int(addends), int(out)


def _out_bytes(p: _Problem, nb: int, nm: int, n_el: int, share: float) -> tuple[float, float]:
    """Bytes of output stored and of bias/residual/norm rows read for a box of nb x nm rows, n_el columns."""
    out = nb * nm * _round(n_el, p.out.layout.lanes) * p.out.layout.itemsize * share
    addends = 0.0
    for x in (p.bias, p.residual, p.norm_weight, p.norm_bias):
        if x is not None:
            if x.lane_dim == 1:  # sticked on M: N rows of M sticks per batch
                addends += (nb if x.strides[0] else 1) * n_el * _round(nm, x.layout.lanes) * x.layout.itemsize * share
                continue
            rows = (nb if x.strides[0] else 1) * (nm if x.strides[1] else 1)
            addends += rows * _round(n_el, x.layout.lanes) * x.layout.itemsize * share
    return out, addends


def _leftover_partial_bytes(p: _Problem, w: _CoreWork) -> int:
    """The fp32 partial sum of a leftover stick one core passes on: its rows x one stick."""
    return w.batches[1] * w.rows[1] * UNIT * 4



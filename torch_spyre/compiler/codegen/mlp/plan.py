"""A fused MLP plan: which intermediate columns each core owns, the passes over them, the tiles, and
the scratchpad buffers, chosen so that every core does the same work.

The intermediate dimension I (in sticks of 64) is split over the cores: each owns ``base`` whole sticks
for every token. The ``S mod P`` sticks left over are split by tokens instead: each goes to a group of
``P // L`` cores, each computing it for its share of a row tile's rows (its weight tiles are loaded
once per group and forwarded over the ring), so no core owns a whole stick more than another
(Granite's 200 sticks over 32 cores: 6 each and a quarter of one, instead of 7 on eight cores and 6 on
the rest).

Order (``emit.py``): per row tile, phase 1 runs the core's sticks in passes of ``nt`` sticks, each a sweep
over H in x tiles of ``kt`` sticks (x is loaded once per pass and forwarded core to core over the ring,
``codegen/matmul/share.py``); the pass's epilogue (bias, activation, gate product) writes the
intermediate h into a resident scratchpad buffer. Phase 2 sweeps the output's H in tiles of ``n2``
sticks: each core multiplies its h columns by its rows of ``w_down`` (a K-split over the cores), and the
partial sums flow over the ring toward the core at the memory stop, which adds the down bias, rounds
once and stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....card.config import CardConfig
from ...scratchpad import ScratchpadOverflowError, SpBuffer, plan as plan_scratchpad
from ..matmul.plan import _chunks
from ..matmul.spec import UNIT
from .spec import MlpSpecError, _MlpProblem


class MlpFitError(MlpSpecError):
    """No tiling of the fused MLP fits the scratchpad: the caller runs the unfused kernels."""


@dataclass(frozen=True)
class MlpTiles:
    rows: int  # tokens per row tile
    nt: int  # intermediate sticks per phase-1 pass
    kt: int  # hidden sticks per x tile
    n2: int  # output (hidden) sticks per phase-2 tile
    slots: int  # partial-sum receive slots per chain direction
    acc_double: bool = False  # two sets of phase-1 accumulators: a pass's epilogue overlaps the next pass

    def __str__(self) -> str:
        return (f"{self.rows} rows per tile, {self.nt} I sticks per pass, x tiles of {self.kt} H sticks, "
                f"down tiles of {self.n2} H sticks, {self.slots} receive slot(s) per direction"
                + (", two accumulator sets" if self.acc_double else ""))


@dataclass(frozen=True)
class MlpCore:
    core: int
    pos: int  # position along the reduction chains (ring order)
    first: int  # first owned intermediate stick
    leftover: tuple[int, int, int] | None  # (stick, index in its group, group size): a share of its rows


@dataclass(frozen=True)
class MlpWork:
    cores: list[MlpCore]  # in chain order
    base: int  # whole sticks per core
    finisher: int  # chain position of the core that adds, rounds and stores (the memory stop's)

    @property
    def count(self) -> int:
        return len(self.cores)

    @property
    def leftovers(self) -> int:
        return len({c.leftover[0] for c in self.cores if c.leftover})


def assign(p: _MlpProblem, cfg: CardConfig) -> MlpWork:
    """Cores in ring order around the memory stop (the nearest ``P``), their sticks and leftovers."""
    from ...placement import cores_near_memory

    P = min(cfg.num_cores, p.i_sticks)
    n, mem = cfg.num_cores, cfg.memory_ring_stop
    signed = lambda c: (c - mem) % n if (c - mem) % n <= n // 2 else (c - mem) % n - n  # noqa: E731
    order = sorted(cores_near_memory(P, cfg), key=signed)
    base, left = divmod(p.i_sticks, P)
    group = P // left if left else 0
    # A group's own sticks and its leftover stick are adjacent columns: each core's weight reads stay
    # within a small span of device memory (config.core_address_span_bytes).
    cores, span = [], group * base + 1
    for q, core in enumerate(order):
        j, i = divmod(q, group) if left else (0, q)
        if left and j < left:
            cores.append(MlpCore(core, q, j * span + i * base, (j * span + group * base, i, group)))
        else:
            cores.append(MlpCore(core, q, left * span + (q - left * group) * base, None))
    finisher = next(q for q, c in enumerate(order) if c == mem) if mem in order else P // 2
    return MlpWork(cores, base, finisher)


def row_tiles(p: _MlpProblem, rows: int) -> list[tuple[int, int, int, int]]:
    """(batch0, nb, m0, nm) tiles of at most ``rows`` tokens: whole batches when a batch fits, else
    chunks of one batch."""
    if p.S <= rows:
        per = rows // p.S
        return [(b0, nb, 0, p.S) for b0, nb in _chunks(p.batch, -(-p.batch // per))]
    return [(b, 1, m0, nm) for b in range(p.batch) for m0, nm in _chunks(p.S, -(-p.S // rows))]


def passes(work: MlpWork, nt: int) -> list[tuple[int, int]]:
    """(offset among the core's own sticks, count) of each phase-1 pass (the same for every core)."""
    return [(o, min(nt, work.base - o)) for o in range(0, work.base, nt)]


def leftover_rows(c: MlpCore, rows: int) -> tuple[int, int] | None:
    """(first row, count) of this core's share of a row tile's rows for its leftover stick."""
    if c.leftover is None:
        return None
    _, q, g = c.leftover
    chunks = _chunks(rows, g)
    return chunks[q] if q < len(chunks) else None


def buffers(p: _MlpProblem, work: MlpWork, t: MlpTiles) -> list[SpBuffer]:
    """One core's scratchpad: h for the whole kernel; phase 1's and phase 2's buffers share bytes."""
    R = t.rows
    # A tile forwarded over the ring (x; the leftover stick's weight tiles) arrives when its sender is
    # ready, not when this core is: with several row tiles the sender may already be in the next row
    # tile's phase 1 while this core is in phase 2, so those buffers must not share bytes with phase 2's
    # (the ring receive slots among them).
    fwd_end = 3 if len(row_tiles(p, R)) > 1 else 1
    left_rows = -(-R // work.cores[0].leftover[2]) if work.leftovers else 0
    bufs = [SpBuffer("h", (work.base * R + left_rows) * UNIT * 2, 0, 3)]
    mats = ["u", "g"] if p.gated else ["u"]
    for m in mats:
        names = [f"acc_{m}0", f"acc_{m}1"] if t.acc_double else [f"acc_{m}"]
        bufs += [SpBuffer(n, R * t.nt * UNIT * 4, 0, 1) for n in names]
        bufs += [SpBuffer(f"w{m}{i}", t.kt * UNIT * t.nt * UNIT * 2, 0, 1) for i in range(2)]
        staged = (p.w_up if m == "u" else p.w_gate).lane_dim == 1  # sticked on H: transposed in scratchpad
        if staged:
            bufs += [SpBuffer(f"w{m}_t{i}", t.kt * UNIT * t.nt * UNIT * 2, 0, 1) for i in range(2)]
        if work.leftovers:  # the leftover stick's tiles (forwarded within its group): buffers of their own
            # The forwarded bytes are the load's: the staging buffer when the tile is transposed in scratchpad.
            bufs += [SpBuffer(f"l{m}{i}", t.kt * UNIT * UNIT * 2, 0, 1 if staged else fwd_end) for i in range(2)]
            if staged:
                bufs += [SpBuffer(f"l{m}_t{i}", t.kt * UNIT * UNIT * 2, 0, fwd_end) for i in range(2)]
    bufs += [SpBuffer(f"x{i}", R * t.kt * UNIT * 2, 0, fwd_end) for i in range(2)]
    for m, b in (("u", p.b_up), ("g", p.b_gate)):
        if b is not None:
            bufs.append(SpBuffer(f"b{m}", t.nt * UNIT * b.layout.itemsize, 0, 1))
    k_rows = (work.base + (1 if work.leftovers else 0)) * UNIT
    bufs += [SpBuffer(f"wd{i}", k_rows * t.n2 * UNIT * 2, 2, 3) for i in range(2)]
    if p.w_down.lane_dim == 1:
        bufs += [SpBuffer(f"wd_t{i}", k_rows * t.n2 * UNIT * 2, 2, 3) for i in range(2)]
    bufs += [SpBuffer(f"acc2_{i}", R * t.n2 * UNIT * 4, 2, 3) for i in range(2)]
    bufs += [SpBuffer(f"recv{d}", t.slots * R * t.n2 * UNIT * 4, 2, 3) for d in range(2)]
    bufs += [SpBuffer(f"o{i}", R * t.n2 * UNIT * p.out.layout.itemsize, 2, 3) for i in range(2)]
    if p.b_down is not None:
        bufs.append(SpBuffer("bd", t.n2 * UNIT * p.b_down.layout.itemsize, 2, 3))
    if p.has_norm:  # the finisher keeps the row tile's whole rows (fp32 sums) until its last output tile
        hp = p.h_sticks * UNIT
        # With several row tiles the finisher still normalizes one while the ring brings the next one's
        # x and weight tiles: its buffers must not share bytes with phase 1's.
        s0 = 0 if fwd_end == 3 else 2
        bufs += [SpBuffer("ln_rows", R * hp * 4, s0, 3), SpBuffer("ln_sq", R * hp * 4, s0, 3),
                 SpBuffer("ln_out", R * hp * p.out.layout.itemsize, s0, 3),
                 SpBuffer("ln_mean", R * 4, s0, 3), SpBuffer("ln_rstd", R * 4, s0, 3)]
        if p.residual is not None:
            bufs.append(SpBuffer("ln_res", R * t.n2 * UNIT * p.residual.layout.itemsize, s0, 3))
        for name, v in (("ln_w", p.norm_weight), ("ln_b", p.norm_bias)):
            if v is not None:
                bufs.append(SpBuffer(name, hp * v.layout.itemsize, s0, 3))
    return bufs


def candidates(p: _MlpProblem, work: MlpWork) -> list[MlpTiles]:
    """Tilings in order of preference: the most tokens per row tile (each row tile reads the weights
    once), then the widest passes (each pass reads x once), x tiles and receive slots."""
    out, row_options, rows = [], [], p.rows
    while True:  # halving down to 64 tokens (or fewer when there are fewer)
        row_options.append(rows)
        if rows <= 64:
            break
        rows = max(64, -(-rows // 2))
    for r in row_options:
        for nt, double in ((2, True), (1, True), (2, False), (1, False)):
            for kt in (2, 1):
                for slots in (2, 1):
                    nt_ = min(nt, max(work.base, 1))
                    out.append(MlpTiles(r, nt_, min(kt, p.h_sticks), 1, slots, double and -(-work.base // nt_) > 1))
    return list(dict.fromkeys(out))


def choose(p: _MlpProblem, work: MlpWork, cfg: CardConfig) -> tuple[MlpTiles, object, list[str]]:
    """The first tiling that fits the scratchpad, its scratchpad plan, and what was tried; raises
    :class:`MlpFitError` (with the smallest need) when none does."""
    tried = []
    smallest = None
    for t in candidates(p, work):
        try:
            return t, plan_scratchpad(buffers(p, work, t), cfg.scratchpad_plannable_bytes), tried
        except ScratchpadOverflowError as e:
            tried.append(f"{t}: needs {e.needed} B")
            smallest = e.needed if smallest is None else min(smallest, e.needed)
    raise MlpFitError(f"{p.describe()}: no tiling fits the scratchpad (the smallest needs {smallest} B of "
                      f"{cfg.scratchpad_plannable_bytes} B plannable per core: the intermediate of "
                      f"{work.base} stick(s) per core stays resident); run as separate kernels")

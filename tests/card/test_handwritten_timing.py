"""The four hand-written programs of benchmarks/programs.py (issue 3, section 7) against times derived by
hand from the configuration.

Every expected time here is arithmetic on :class:`CardConfig` fields and on the program's shapes, written
out term by term: the kernel's fixed cost, then one term per phase (the cores of these programs run in
lock-step, so a phase is the same instruction on every core). Within a phase the time is whichever bound
applies, and the comment says which one and why the others do not:

- DMA: ``dram_latency_s`` once, then the phase's bytes at the binding one of
  * the shared LPDDR5 at ``peak x read efficiency`` (or write efficiency), each DMA pattern paying
    ``dram_run_overhead_bytes`` per contiguous DRAM run (the loop order a pattern is written in decides
    its runs: the programs' ``[rows, sticks]`` blocks step 64 KiB between sticks, one run per stick),
  * the ring links out of (into) the memory interface's stop: DRAM traffic of core c rides the ring,
  * one core's DMA engine, ``dma_bytes_per_cycle x clock``;
- PE: ``weight tiles x (M rows + fill/drain) + pe_rows`` cycles for the first weight load;
- vector: sticks of the widest non-broadcast operand x (1 + transcendental cycles);
- ring: ``hops x ring_hop_latency_cycles`` then bytes at the link bandwidth (data or reduction ring).

TOLERANCE is 5 %: the model is an event simulation and the hand model a sum of phases, so they may differ
by what a phase sum cannot see (the DMA of one core finishing a little before another's, rounding of
cycles), but no more. Where a hand bound and the simulation differ by more for a reason that is the
program's and not the model's (the all-to-all's send order), the test says so and checks that reason.
"""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.programs import build_all_to_all, build_elementwise, build_matmul_ksplit, build_row_reduce
from torch_spyre.card.config import CardConfig
from torch_spyre.card.timing import _ring_path, time_program
from torch_spyre.program import Program, RingRecv, RingSend

CFG = CardConfig()
TOLERANCE = 0.05
RESULTS: dict[str, float] = {}  # what -> model / hand - 1, for reporting
STICK = 128

# --- the rates every derivation uses, straight from the configuration -------------------------------
CLOCK = CFG.clock_hz
DRAM_READ = CFG.dram_peak_bandwidth * CFG.dram_read_efficiency  # 176.1 GB/s: every core reading
DRAM_WRITE = CFG.dram_peak_bandwidth * CFG.dram_write_efficiency  # 146.0 GB/s: every core writing
LINK = CFG.ring_bytes_per_cycle * CLOCK * CFG.ring_efficiency  # 88 GB/s per data-ring link and direction
REDUCE_LINK = CFG.reduction_ring_bytes_per_cycle * CLOCK * CFG.ring_efficiency  # 22 GB/s reduction ring
DMA_ENGINE = CFG.dma_bytes_per_cycle * CLOCK  # 140.8 GB/s, one core's DMA engine
HOP = CFG.ring_hop_latency_cycles / CLOCK  # seconds per ring hop
VECTOR_BYTES_PER_CYCLE = 2 * CFG.vector_fp16_per_cycle * CFG.corelets_in_use  # one 128-byte stick per cycle
FILL_DRAIN = CFG.pe_rows + CFG.pe_cols + CFG.mac_latency_cycles  # systolic fill + drain per weight tile


def run_factor(bytes_per_run: int) -> float:
    """DRAM byte-equivalents per byte for a pattern whose contiguous runs are ``bytes_per_run`` long."""
    return 1 + CFG.dram_run_overhead_bytes / bytes_per_run


def dma_phase(total_bytes: int, dram_bw: float, factor: float, busiest_link_bytes: int, busiest_core_bytes: int) -> float:
    """All cores' DMAs of one phase start together: the latency, then the slowest of the shared DRAM (with
    the strided-run penalty), the busiest ring link at the memory interface's stop, one core's DMA engine."""
    return CFG.dram_latency_s + max(total_bytes * factor / dram_bw, busiest_link_bytes / LINK,
                                    busiest_core_bytes / DMA_ENGINE)


def vector_s(elements: int, widest_itemsize: int, transcendental: bool = False) -> float:
    cycles = elements * widest_itemsize / VECTOR_BYTES_PER_CYCLE
    return cycles * ((1 + CFG.vector_transcendental_cycles) if transcendental else 1) / CLOCK


def memory_stop_links(cores: list[int], bytes_per_core: int) -> int:
    """Bytes on the busiest link next to the memory interface's stop (``memory_ring_stop`` = 0): cores 1..16
    are reached clockwise (16 is a tie, taken clockwise), 17..31 counter-clockwise, core 0 uses no link."""
    assert CFG.memory_ring_stop == 0 and CFG.num_cores == 32
    cw = sum(1 for c in cores if 1 <= c <= 16)
    ccw = sum(1 for c in cores if c >= 17)
    return max(cw, ccw) * bytes_per_core


def assert_close(model: float, hand: float, what: str) -> None:
    RESULTS[what] = model / hand - 1
    assert model == pytest.approx(hand, rel=TOLERANCE), (
        f"{what}: model {model * 1e6:.3f} us vs hand {hand * 1e6:.3f} us ({100 * (model / hand - 1):+.1f} %)")


def phase_end(t, op: str, which: int = 0) -> float:
    """When the last core finished its ``which``-th instruction of kind ``op`` (seconds after the fixed cost)."""
    ends = Counter()
    last: dict[int, float] = {}
    for iv in t.intervals:
        if iv.op == op:
            if ends[iv.core] == which:
                last[iv.core] = iv.end
            ends[iv.core] += 1
    return max(last.values()) - t.fixed_cost_s


# ---------------------------------------------------------------------------------------------
# elementwise: y = exp(x) * 2 + 1, 512 x 1024 fp16 over 32 cores
# ---------------------------------------------------------------------------------------------
def test_elementwise_against_the_hand_model():
    rows, cols, cores = 512, 1024, 32
    t = time_program(build_elementwise(rows, cols, cores).program, CFG)
    per_core = rows // cores * cols * 2  # 16 rows x 1024 fp16 = 32 KiB per core
    total = per_core * cores  # 1 MiB in, 1 MiB out
    # The block is loaded as a [16 rows, 16 sticks] pattern with the sticks innermost: consecutive sticks of
    # a row are 512 rows x 128 B = 64 KiB apart in the sticked layout, so every stick is its own DRAM run.
    factor = run_factor(STICK)  # = 2: an isolated stick gets half a burst's efficiency
    link = memory_stop_links(list(range(cores)), per_core)  # 16 x 32 KiB through link 0 -> 1
    load = dma_phase(total, DRAM_READ, factor, link, per_core)  # DRAM-bound: 11.9 us vs 6.0 on the link
    # exp into an fp32 temporary: the fp32 output sets the width (4 B), plus the transcendental cycles.
    exp = vector_s(rows // cores * cols, 4, transcendental=True)
    fma = vector_s(rows // cores * cols, 4)  # reads the fp32 temporary
    store = dma_phase(total, DRAM_WRITE, factor, link, per_core)  # DRAM-bound at the write efficiency
    hand = CFG.kernel_fixed_cost_s + load + exp + fma + store
    assert_close(phase_end(t, "dma_load"), load, "elementwise load")
    assert_close(t.total_s, hand, "elementwise")
    assert t.bottleneck == "dram-bound"


# ---------------------------------------------------------------------------------------------
# reduction: row sums and row maxima of 512 x 1024 fp16, 64 rows per core (8 cores)
# ---------------------------------------------------------------------------------------------
def test_row_reduce_against_the_hand_model():
    rows, cols, per = 512, 1024, 64
    t = time_program(build_row_reduce(rows, cols).program, CFG)
    cores = rows // per  # 8
    per_core = per * cols * 2  # 128 KiB
    # [64 rows, 16 sticks], sticks innermost (64 KiB apart): one run per stick, factor 2. Cores 1..7 share
    # link 0 -> 1 (7 x 128 KiB = 10.4 us at 88 GB/s) but the DRAM, 2 MiB equivalent, needs 11.9 us.
    load = dma_phase(per_core * cores, DRAM_READ, run_factor(STICK),
                     memory_stop_links(list(range(cores)), per_core), per_core)
    red_sum = vector_s(per * cols, 2)  # fp16 input: one stick per cycle
    cast = vector_s(per, 4)  # [64, 1] fp32 -> fp16: 2 cycles
    red_max = vector_s(per * cols, 2)  # the vector unit is in order: after the sum and the cast
    # Last phase: each core stores its one-stick row maxima (one run: factor 2) after the max; the row-sum
    # store overlaps the max. 8 sticks in all: the latency dominates.
    store = CFG.dram_latency_s + cores * STICK * run_factor(STICK) / DRAM_WRITE
    hand = CFG.kernel_fixed_cost_s + load + red_sum + cast + red_max + store
    assert_close(t.total_s, hand, "row reduce")
    assert_close(t.execution_s, hand - CFG.kernel_fixed_cost_s, "row reduce (execution)")


# ---------------------------------------------------------------------------------------------
# matmul 256 x 1024 x 256 on 32 cores: 16 output tiles x 2 halves of K, partial sums over the reduce ring
# ---------------------------------------------------------------------------------------------
def test_matmul_ksplit_against_the_hand_model():
    M, K, N, tile = 256, 1024, 256, 64
    t = time_program(build_matmul_ksplit(M, K, N, tile).program, CFG)
    cores, kh = 32, K // 2
    a_bytes = tile * kh * 2  # 64 rows x 512 of a: 64 KiB per core
    b_bytes = kh * tile * 2  # 512 rows x 64 of b (one stick column): 64 KiB per core
    everyone = list(range(cores))
    # Load a: [64 rows, 8 sticks], sticks innermost 256 rows x 128 B = 32 KiB apart: a run per stick.
    load_a = dma_phase(a_bytes * cores, DRAM_READ, run_factor(STICK), memory_stop_links(everyone, a_bytes), a_bytes)
    # Load b: 512 consecutive rows of one stick column, one 64 KiB run: DRAM (11.93 us) and the link out
    # of the memory stop (16 x 64 KiB at 88 GB/s = 11.92 us) tie; the same read channel, so after a.
    load_b = dma_phase(b_bytes * cores, DRAM_READ, run_factor(b_bytes), memory_stop_links(everyone, b_bytes), b_bytes)
    # PE: weight-stationary tiles of 8 (K) x 64 (N): 64 x 1 tiles, each streaming M = 64 rows + fill/drain.
    tiles = (kh // CFG.pe_rows) * (tile // (CFG.pe_cols * CFG.pe_simd_fp16))
    matmul = (-(-tiles // CFG.corelets_in_use) * (tile + FILL_DRAIN) + CFG.pe_rows) / CLOCK  # corelets share tiles
    # The odd core sends its fp32 partial (16 KiB) one hop to its even partner over the reduction ring;
    # every pair uses its own link.
    partial = tile * tile * 4
    ring = 1 * HOP + partial / REDUCE_LINK
    add = vector_s(tile * tile, 4)  # fp32 + fp32 -> fp16
    # 16 even cores store a 64 x 64 fp16 tile (one 8 KiB run). Writes go to the memory stop: cores 2..14
    # counter-clockwise (7 x 8 KiB on link 1 -> 0), 16..30 clockwise (8 x 8 KiB on link 31 -> 0, 0.74 us);
    # the DRAM needs 0.91 us.
    c_bytes = tile * tile * 2
    store = dma_phase(c_bytes * cores // 2, DRAM_WRITE, run_factor(c_bytes), 8 * c_bytes, c_bytes)
    hand = CFG.kernel_fixed_cost_s + load_a + load_b + matmul + ring + add + store
    assert_close(phase_end(t, "matmul"), load_a + load_b + matmul, "ksplit loads + matmul")
    assert_close(t.total_s, hand, "matmul k-split")
    assert t.bytes["reduce_ring"] == cores // 2 * partial


# ---------------------------------------------------------------------------------------------
# ring exchange: all-to-all of 32 cores x 32 pieces of 16 rows x 64 fp16 (2 KiB)
# ---------------------------------------------------------------------------------------------
def _exchange_hand(piece: int, cores: int = 32) -> tuple[float, float]:
    """(busiest link, one lane's hop latencies) for an all-to-all over the shortest paths. Each source sends
    to destinations 1..16 hops clockwise (16 is a tie) and 1..15 counter-clockwise; by symmetry every
    clockwise link carries sum(1..16) = 136 pieces. A core's ring port has one lane per direction and runs
    its sends in order, each paying hops x hop latency before its bytes flow, so one lane pays 136 hops."""
    cw_pieces = sum(range(1, cores // 2 + 1))
    return cw_pieces * piece / LINK, cw_pieces * HOP


def _ring_only(program: Program, order: str) -> Program:
    """The program's ring instructions alone; ``order='distance'`` reissues each core's sends nearest
    destination first, alternating directions (benchmarks/calibration.py's order)."""
    cores = {}
    for c, ins in program.cores.items():
        sends = [i for i in ins if isinstance(i, RingSend)]
        if order == "distance":
            sends.sort(key=lambda s: (len(_ring_path(c, s.dst_core, 32, "data")), (s.dst_core - c) % 32))
        cores[c] = sends + [i for i in ins if isinstance(i, RingRecv)]
    return Program(program.name + "_ring_" + order, [], cores)


def test_all_to_all_against_the_hand_model():
    n, P = 32, 16
    built = build_all_to_all(n, P).program
    t = time_program(built, CFG)
    piece = P * STICK  # 2 KiB
    per_core = n * piece  # 64 KiB in and out per core
    # Load: [32 sticks, 16 rows] with rows innermost: 32 runs of 2 KiB per core. DRAM 12.65 us, link 0 -> 1
    # 16 x 64 KiB = 11.9 us.
    load = dma_phase(per_core * n, DRAM_READ, run_factor(piece), memory_stop_links(list(range(n)), per_core), per_core)
    link_s, lane_latency = _exchange_hand(piece)
    exchange = link_s + lane_latency  # 3.17 + 0.49 us
    store = dma_phase(per_core * n, DRAM_WRITE, run_factor(piece), memory_stop_links(list(range(n)), per_core), per_core)
    assert_close(phase_end(t, "dma_load"), load, "all-to-all load")

    # The exchange alone, with the sends reordered nearest-first: the hand model holds.
    distance = time_program(_ring_only(built, "distance"), CFG)
    assert_close(distance.execution_s, exchange, "all-to-all exchange, nearest-first order")
    assert distance.ring_link_busiest_s == pytest.approx(link_s, rel=1e-6)

    # The program's own order is worse than the hand model, and the hand model says why: every core issues
    # its sends by ascending destination, so at first all 31 cores send to core 0 (15 flows on link 1 -> 0,
    # 16 on 31 -> 0) while most links idle, then to core 1, and so on. The busiest link still carries the
    # same 136 pieces (fully used for link_s), but it idles while the lanes wait on the hot destination.
    ascending = time_program(_ring_only(built, "as_written"), CFG)
    assert ascending.ring_link_busiest_s == pytest.approx(link_s, rel=1e-6)
    assert ascending.execution_s > 1.2 * exchange
    first = [next(i for i in ins if isinstance(i, RingSend)).dst_core for ins in built.cores.values()]
    assert first.count(0) == n - 1  # every core but core 0 starts by sending to core 0

    # Whole program: every store waits for its core's last receive, which waits for every core's load, so
    # the DRAM does the load phase and then the stores' writes (``store``) one after the other: that sum is
    # a lower bound, the exchange hidden entirely. With no overlap at all, load + the exchange as written
    # (timed alone above) + store is the upper one. The model lands between: the cores that have received
    # everything store while the others still exchange, and those stores share the links next to the memory
    # stop with the exchange.
    lower = CFG.kernel_fixed_cost_s + load + store
    upper = CFG.kernel_fixed_cost_s + load + ascending.execution_s + store
    assert lower <= t.total_s <= upper
    assert t.bytes["ring"] == n * (n - 1) * piece

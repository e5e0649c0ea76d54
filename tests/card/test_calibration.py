"""The timing model against the published Spyre figures (see docs/calibration.md)."""

from __future__ import annotations


import pytest

from benchmarks import calibration as cal
from torch_spyre.card.config import CardConfig

CFG = CardConfig()
TOLERANCE = 0.2


@pytest.fixture(scope="module")
def points() -> dict[str, cal.Point]:
    return {p.key: p for p in cal.calibrate(CFG)}


@pytest.mark.parametrize("key", ["stream_read", "tiny_kernel", "matmul_peak", "pointwise", "ring_alone"])
def test_point_within_tolerance(points, key):
    p = points[key]
    assert abs(p.error) <= TOLERANCE, f"{p.what}: model {p.model:.4g} vs published {p.published:.4g} ({100 * p.error:+.1f} %)"


@pytest.mark.xfail(strict=True, reason="the published softmax times need one core to move 712 GB/s, 3.5x the LPDDR5 "
                   "peak, and a vector unit ~23x the assumed one; see docs/calibration.md")
@pytest.mark.parametrize("key", ["softmax_roundtrip", "softmax_scratchpad"])
def test_softmax_absolute_times(points, key):
    assert abs(points[key].error) <= TOLERANCE


@pytest.mark.parametrize("key", ["softmax_ratio", "softmax_ratio_own"])
def test_scratchpad_planning_gain_matches_the_published_ratio(points, key):
    """The absolute softmax times cannot be met (below), but what planning in scratchpad buys can:
    IBM measured 32.51 us -> 23.67 us (1.37x); both pairs of programs must show that within 20 %."""
    p = points[key]
    assert abs(p.error) <= TOLERANCE, f"{p.what}: model {p.model:.3f}x vs published {p.published:.3f}x"


def test_softmax_pair_is_inconsistent_with_lpddr5():
    """IBM's own account of the softmax pair (fixed cost + bytes / bandwidth) against the memory figures."""
    implied = cal.softmax_implied(CFG)
    assert implied.fixed_cost_s == pytest.approx(CFG.kernel_fixed_cost_s, rel=TOLERANCE)  # the fixed cost agrees
    assert implied.single_core_bandwidth > 3 * CFG.dram_peak_bandwidth  # the bandwidth cannot
    assert implied.min_bandwidth_zero_fixed > CFG.dram_peak_bandwidth  # even with no fixed cost at all


def test_softmax_round_trip_costs_more_and_the_vector_unit_is_one_limit(points):
    assert points["softmax_roundtrip"].model > points["softmax_scratchpad"].model
    assert points["softmax_scratchpad_fast_vector"].model < points["softmax_scratchpad"].model


def test_exchange_ratio_follows_from_the_derived_physics(points):
    """The published 80 us -> 1.1 us (72.7x) against the model, three ways (docs/calibration.md, section 3).

    By hand, for the 1 MiB all-to-all (32 KiB per core, 1 KiB pieces, sent nearest first):
    - ring: every clockwise link carries sum(1..16) = 136 pieces at the link bandwidth, and each core's
      clockwise lane runs its 16 sends in order, paying 136 hops x hop latency;
    - store-with-relayout kernel: the fixed cost, 1 MiB written with every stick its own DRAM run (the
      relayout), and the 31 stores of each core in order, each paying the DMA latency;
    - load kernel: the fixed cost, the latency, then 1 MiB read in one run per core (or the 16 x 32 KiB on
      the link out of the memory stop, whichever is slower).
    The model must agree within 5 %; the physics then puts the ratio well below the published one."""
    n, bpc = 32, 32 * 1024
    piece, total = bpc // n, bpc * n
    hop = CFG.ring_hop_latency_cycles / CFG.clock_hz
    cw = sum(range(1, n // 2 + 1))
    ring = cw * piece / CFG.ring_link_bandwidth + cw * hop
    store = (CFG.kernel_fixed_cost_s + total * (1 + CFG.dram_run_overhead_bytes / 128) / CFG.dram_write_bandwidth
             + (n - 1) * CFG.dram_latency_s)
    load = CFG.kernel_fixed_cost_s + CFG.dram_latency_s + max(
        total * (1 + CFG.dram_run_overhead_bytes / bpc) / CFG.dram_read_bandwidth, n // 2 * bpc / CFG.ring_link_bandwidth)
    kernels = points["exchange_ratio_kernels"]
    assert kernels.model == pytest.approx((store + load) / ring, rel=0.05)
    # Two fixed costs make the kernel-boundary round trip ~3x the bandwidth-only one, still far from 72.7x.
    assert 2 * points["exchange_ratio"].model < kernels.model < (1 - TOLERANCE) * kernels.published

    # At the size the ring moves in the published 1.1 us, the round trip has 2 x 20 us of fixed cost and
    # its DMA. The published 80 us leaves 40 us for that DMA: the model's is less than half of it, so the
    # published pair holds more than two kernels' fixed costs or much more data (docs/calibration.md).
    sized = cal.exchange_sized_to_published(CFG)
    assert sized.ring_s == pytest.approx(cal.PUBLISHED["exchange_ring"].value, rel=0.1)
    fixed2 = 2 * CFG.kernel_fixed_cost_s
    assert sized.kernels_s - fixed2 < 0.5 * (cal.PUBLISHED["exchange_roundtrip"].value - fixed2)
    assert points["exchange_roundtrip_sized"].model == sized.kernels_s


def test_ring_under_dram_streaming_gets_less_than_alone(points):
    assert points["ring_under_dram"].model < points["ring_alone"].model


def test_matmul_is_compute_bound_and_streaming_is_bandwidth_bound():
    from torch_spyre.card.timing import time_program

    assert time_program(cal.matmul_program(), CFG).bottleneck == "compute-bound"
    assert time_program(cal.stream_read_program(), CFG).bottleneck in ("dram-bound", "ring-bound")


def test_own_softmax_programs_are_well_formed():
    from torch_spyre.card.timing import time_program

    rt, sp = cal.softmax_roundtrip_program(), cal.softmax_scratchpad_program()
    t_rt, t_sp = time_program(rt, CFG), time_program(sp, CFG)
    assert t_sp.bytes["dram_read"] == t_sp.bytes["dram_write"] == 512 * 1024 * 2
    assert t_rt.bytes["dram_read"] + t_rt.bytes["dram_write"] >= 8 * 512 * 1024 * 2  # 8MN elements
    assert t_rt.total_s > t_sp.total_s


# --- the document matches the code ------------------------------------------------------------
def _doc() -> str:
    return cal.DOC_PATH.read_text()


def test_doc_lists_every_config_field_with_its_provenance():
    doc = _doc()
    for row in CardConfig.provenance():
        assert f"| `{row['name']}` |" in doc, f"docs/calibration.md is missing config field {row['name']}"
    assert cal.config_markdown() in doc, "config table out of date: run python -m benchmarks.calibration --write-doc"


def test_doc_calibration_table_matches_the_model(points):
    """Every row, numbers included (rows timing benchmarks/programs.py's softmax too: when those programs
    change, the doc must be regenerated)."""
    doc = _doc()
    stale = "calibration table out of date: run python -m benchmarks.calibration --write-doc"
    for p in points.values():
        row = cal.calibration_markdown([p]).splitlines()[-1]
        assert row in doc, f"{stale}\n  expected row: {row}"
    assert cal.calibration_markdown(list(points.values())) in doc, stale
    assert cal.implied_markdown(cal.softmax_implied(CFG), CFG) in doc

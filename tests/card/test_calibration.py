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


def test_exchange_over_the_ring_beats_device_memory(points):
    p = points["exchange_ratio"]
    assert p.model > 5  # far faster on chip, though not by the published 73x (docs/calibration.md)


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
    """Rows of this file's programs must match exactly; rows timing another file's programs (which change
    with that file) must at least be there."""
    doc = _doc()
    stale = "calibration table out of date: run python -m benchmarks.calibration --write-doc"
    for p in points.values():
        row = cal.calibration_markdown([p]).splitlines()[-1]
        if p.origin == "benchmarks/calibration.py":
            assert row in doc, stale
        else:
            assert f"| {p.what} |" in doc, stale
    assert cal.implied_markdown(cal.softmax_implied(CFG), CFG) in doc

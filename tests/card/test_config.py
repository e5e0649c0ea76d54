"""The card configuration: defaults with provenance, overrides, and clear errors for bad values."""

import json

import pytest

from torch_spyre.card.config import CardConfig, ConfigError, load_config


def test_defaults_follow_the_published_figures():
    c = load_config(environ={})
    assert c.num_cores == 32
    assert c.scratchpad_bytes == 2 * 1024 * 1024
    assert c.stick_bytes == 128
    assert c.dram_peak_bandwidth == pytest.approx(204.8e9)
    assert c.kernel_fixed_cost_s == pytest.approx(20e-6)
    # 32 cores x 2 corelets x 512 MAC x 2 flop x 1.1 GHz = 72.1 TFLOPS for the whole chip.
    assert c.chip_peak_fp16_flops == pytest.approx(72.1e12, rel=1e-3)
    # Both corelets are driven by default: the peak in use is the chip's.
    assert c.corelets_in_use == 2 and c.peak_fp16_flops == pytest.approx(c.chip_peak_fp16_flops)
    one = load_config(environ={"TORCH_SPYRE_CORELETS_IN_USE": "1"})  # one corelet stays selectable: half of it
    assert one.peak_fp16_flops == pytest.approx(c.chip_peak_fp16_flops / 2)
    assert c.dram_read_bandwidth == pytest.approx(0.86 * 204.8e9)


def test_every_figure_has_provenance():
    rows = CardConfig.provenance()
    assert {r["name"] for r in rows} == set(CardConfig.model_fields)
    for r in rows:
        assert r["source"], f"{r['name']} has no source"
        assert r["confidence"] in {"official", "paper", "community", "derived", "assumed"}, r


def test_environment_overrides():
    c = load_config(environ={"TORCH_SPYRE_CLOCK_HZ": "1.0e9", "TORCH_SPYRE_NUM_CARDS": "2"})
    assert c.clock_hz == 1.0e9 and c.num_cards == 2
    assert c.peak_fp16_flops == pytest.approx(32 * 2 * 512 * 2 * 1.0e9)


def test_config_file_overrides_and_env_wins(tmp_path):
    f = tmp_path / "card.yaml"
    f.write_text("clock_hz: 1.0e9\ncorelets_in_use: 1\n")
    c = load_config(environ={"TORCH_SPYRE_CONFIG": str(f), "TORCH_SPYRE_CLOCK_HZ": "9e8"})
    assert c.corelets_in_use == 1
    assert c.clock_hz == 9e8
    j = tmp_path / "card.json"
    j.write_text(json.dumps({"num_cores": 16}))
    assert load_config(environ={"TORCH_SPYRE_CONFIG": str(j)}).num_cores == 16


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"TORCH_SPYRE_CLOCK_HZ": "fast"}, "clock_hz"),
        ({"TORCH_SPYRE_CLOCK_HZ": "-1"}, "greater than 0"),
        ({"TORCH_SPYRE_NUM_CARDS": "9"}, "num_cards"),
        ({"TORCH_SPYRE_CORELETS_IN_USE": "3"}, "corelets_in_use"),
        ({"TORCH_SPYRE_SCRATCHPAD_PLANNABLE_BYTES": str(4 * 1024 * 1024)}, "cannot exceed"),
        ({"TORCH_SPYRE_DRAM_CAPACITY_BYTES": str(2**30 + 1)}, "whole number"),
        ({"TORCH_SPYRE_DRAM_READ_EFFICIENCY": "1.5"}, "dram_read_efficiency"),
    ],
)
def test_invalid_values_are_rejected_with_the_field_named(env, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(environ=env)


def test_error_names_where_the_value_came_from():
    with pytest.raises(ConfigError, match=r"\$TORCH_SPYRE_CLOCK_HZ"):
        load_config(environ={"TORCH_SPYRE_CLOCK_HZ": "abc"})


def test_bad_config_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(environ={"TORCH_SPYRE_CONFIG": str(tmp_path / "missing.yaml")})
    bad = tmp_path / "bad.yaml"
    bad.write_text("clock_hz: [1, 2\n")
    with pytest.raises(ConfigError, match="could not be parsed"):
        load_config(environ={"TORCH_SPYRE_CONFIG": str(bad)})
    notmap = tmp_path / "list.yaml"
    notmap.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(environ={"TORCH_SPYRE_CONFIG": str(notmap)})
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("warp_drive: 1\n")
    with pytest.raises(ConfigError, match="unknown .*warp_drive"):
        load_config(environ={"TORCH_SPYRE_CONFIG": str(unknown)})


def test_config_is_immutable():
    c = load_config(environ={})
    with pytest.raises(Exception):
        c.clock_hz = 2e9


def test_a_misspelt_variable_is_reported_not_silently_ignored():
    with pytest.warns(UserWarning, match=r"TORCH_SPYRE_CLOK_HZ is not a torch_spyre setting.*TORCH_SPYRE_CLOCK_HZ"):
        c = load_config(environ={"TORCH_SPYRE_CLOK_HZ": "1e9"})
    assert c.clock_hz == 1.1e9


def test_settings_read_elsewhere_are_not_reported(recwarn):
    load_config(environ={"TORCH_SPYRE_DEBUG": "1", "TORCH_SPYRE_DLFLOAT16": "0"})
    assert not [w for w in recwarn if "not a torch_spyre setting" in str(w.message)]


def test_every_variable_the_sources_read_is_known(recwarn):
    """Each ``"TORCH_SPYRE_..."`` name in torch_spyre's sources is a card figure or in OTHER_ENV_VARS, so setting
    it is not reported as ignored (TORCH_SPYRE_DISABLE and TORCH_SPYRE_TIMING_ONLY were)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2] / "torch_spyre"
    names = {m for p in root.rglob("*.py") for m in re.findall(r'"(TORCH_SPYRE_[A-Z0-9_]+)"', p.read_text())}
    assert {"TORCH_SPYRE_DISABLE", "TORCH_SPYRE_TIMING_ONLY"} <= names
    load_config(environ={n: "1" for n in names if n != "TORCH_SPYRE_CONFIG"})
    assert not [str(w.message) for w in recwarn if "not a torch_spyre setting" in str(w.message)]


def test_a_copy_with_other_corelets_recomputes_its_peaks():
    c = load_config(environ={})
    assert c.peak_fp16_flops == pytest.approx(c.chip_peak_fp16_flops)  # computed, hence cached
    one = c.model_copy(update={"corelets_in_use": 1})
    assert one.peak_fp16_flops == pytest.approx(c.chip_peak_fp16_flops / 2)
    assert one.fp16_macs_per_cycle_per_core == c.fp16_macs_per_cycle_per_core // 2

"""spyre-tests: the suite schema, planning, the runner over an upstream-style file, the shipped tiers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from torch_spyre.testing import suite as suite_mod
from torch_spyre.testing.plan import Collected, StaleEntryWarning, plan_source, warn_stale
from torch_spyre.testing.runner import shipped_configs
from torch_spyre.testing.suite import SuiteError, load_suite

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]

GOOD = """\
version: 1
name: t
labels: [smoke]
supported_dtypes:
  float32: {atol: 1.0e-3, rtol: 1.0e-3}
sources:
  - source: builtin:opinfo
    unlisted_test_mode: mandatory_success
    tests:
      - name: test_a_.*
        mode: xfail
        reason: known
"""


def _write(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_shipped_schema_is_generated_from_the_model():
    shipped = json.loads(suite_mod.SCHEMA_PATH.read_text())
    assert shipped == json.loads(json.dumps(suite_mod.json_schema()))


def test_the_schema_validates_the_shipped_configs():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    for path in shipped_configs() + [DATA / "suite.yaml"]:
        jsonschema.validate(yaml.safe_load(path.read_text()), suite_mod.json_schema())
        load_suite(path)


def test_every_xfail_and_skip_of_the_shipped_configs_has_a_reason():
    for path in shipped_configs():
        s = load_suite(path)
        for source in s.sources:
            assert source.unlisted_test_mode == "mandatory_success" or source.unlisted_reason.strip()
            for e in source.tests:
                assert e.mode == "mandatory_success" or len(e.reason.strip()) > 10, (path, e.name)


@pytest.mark.parametrize("bad, line, field, what", [
    ("        mode: xfail\n", 11, "sources.0.tests.0.mode", "Input should be"),
    ("        reason: known\n", 10, "sources.0.tests.0", "needs a reason"),
    ("    unlisted_test_mode: mandatory_success\n", 8, "sources.0.unlisted_test_mode", "Input should be"),
    ("  - source: builtin:opinfo\n", 7, "sources.0.source", "String should match pattern"),
    ("  float32: {atol: 1.0e-3, rtol: 1.0e-3}\n", 5, "supported_dtypes.float32.atol", "greater than or equal"),
    ("      - name: test_a_.*\n", 10, "sources.0.tests.0.name", "not a valid regex"),
])
def test_a_file_that_does_not_match_names_file_line_and_field(tmp_path, bad, line, field, what):
    replacement = {
        "        mode: xfail\n": "        mode: expected_fail\n",
        "        reason: known\n": "        reason: ' '\n",
        "    unlisted_test_mode: mandatory_success\n": "    unlisted_test_mode: maybe\n",
        "  - source: builtin:opinfo\n": "  - source: opinfo\n",
        "  float32: {atol: 1.0e-3, rtol: 1.0e-3}\n": "  float32: {atol: -1, rtol: 1.0e-3}\n",
        "      - name: test_a_.*\n": "      - name: test_a_(\n",
    }[bad]
    path = _write(tmp_path, GOOD.replace(bad, replacement))
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    assert f"{path}:{line}: {field}: " in str(e.value) and what in str(e.value), str(e.value)


def test_unknown_keys_missing_fields_and_bad_yaml_are_named(tmp_path):
    path = _write(tmp_path, GOOD.replace("        reason: known\n", "        reason: known\n        tag: [x]\n"))
    with pytest.raises(SuiteError, match=rf"{path}:13: sources.0.tests.0.tag: Extra inputs are not permitted"):
        load_suite(path)
    path = _write(tmp_path, GOOD.replace("labels: [smoke]\n", ""))
    with pytest.raises(SuiteError, match=rf"{path}:1: labels: Field required"):
        load_suite(path)
    path = _write(tmp_path, GOOD + "  - [unclosed\n")
    with pytest.raises(SuiteError, match=rf"{path}:\d+: not valid YAML"):
        load_suite(path)
    with pytest.raises(SuiteError, match="cannot read the suite file"):
        load_suite(tmp_path / "missing.yaml")


def _t(method, op=None, dtype=None, cls="TestXPRIVATEUSE1"):
    return Collected(f"builtin:opinfo::{cls}.{method}", "builtin:opinfo", cls, method, method, op, dtype)


def test_plan_first_match_edits_dtypes_tolerances_and_stale_entries(tmp_path):
    text = GOOD.replace("""      - name: test_a_.*
        mode: xfail
        reason: known
""", """      - name: test_a_add_spyre_float32
        mode: xfail
        reason: known
      - name: test_a_.*
        mode: mandatory_success
        edits:
          ops: {exclude: [mul]}
          dtypes: {include: [float32, float64]}
          tolerances: {float64: {atol: 0.5, rtol: 0.25}}
      - name: TestXPRIVATEUSE1.test_b
        mode: skip
        reason: not on this device
      - name: test_gone_.*
        mode: xfail
        reason: renamed upstream
""").replace("unlisted_test_mode: mandatory_success", "unlisted_test_mode: xfail\n    unlisted_reason: not triaged")
    s = load_suite(_write(tmp_path, text))
    tests = [_t("test_a_add_spyre_float32", "add", "float32"), _t("test_a_mul_spyre_float32", "mul", "float32"),
             _t("test_a_add_spyre_float16", "add", "float16"), _t("test_a_add_spyre_float64", "add", "float64"),
             _t("test_b"), _t("test_c_spyre_bfloat16", dtype="bfloat16"), _t("test_d")]
    plan, stale = plan_source(s, s.sources[0], tests, "s.yaml")
    got = {p.test.method: (p.mode, p.reason, p.atol, p.rtol) for p in plan}
    assert got["test_a_add_spyre_float32"] == ("xfail", "known", 1e-3, 1e-3)  # the first match wins
    assert got["test_a_mul_spyre_float32"][:2] == ("skip", "op mul left out by the edits of s.yaml entry 2 (test_a_.*)")
    assert got["test_a_add_spyre_float16"][0] == "skip" and "dtype float16 left out" in got["test_a_add_spyre_float16"][1]
    # float64 is not a supported dtype, but the entry includes it explicitly, with its own tolerance
    assert got["test_a_add_spyre_float64"] == ("mandatory_success", "", 0.5, 0.25)
    assert got["test_b"][:2] == ("skip", "not on this device")
    assert got["test_c_spyre_bfloat16"][0] == "skip" and "not among the suite's supported_dtypes" in got["test_c_spyre_bfloat16"][1]
    assert got["test_d"] == ("xfail", "not triaged", None, None)
    assert stale == [3]
    with pytest.warns(StaleEntryWarning, match=r"entry 4 \('test_gone_\.\*'\) .* matches no test"):
        warn_stale(s.sources[0], stale, "s.yaml")


def _run_cli(args, cwd, timeout=1200):
    return subprocess.run([sys.executable, "-m", "torch_spyre.testing.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_run_an_upstream_style_file_with_a_crash_xfails_tolerances_and_junit(tmp_path):
    """The file source and the --pytorch-src source over the same upstream-style file: a crash loses one test,
    the rest of its chunk runs, the tolerance edit applies, JUnit records every outcome, exit 0."""
    checkout = tmp_path / "pytorch"
    (checkout / "test").mkdir(parents=True)
    shutil.copy(DATA / "upstream_style.py", checkout / "test" / "test_upstream_style.py")
    text = (DATA / "suite.yaml").read_text()
    both = text + text.split("sources:\n", 1)[1].replace("file:upstream_style.py", "pytorch:test/test_upstream_style.py")
    shutil.copy(DATA / "upstream_style.py", tmp_path / "upstream_style.py")
    (tmp_path / "suite.yaml").write_text(both)
    junit = tmp_path / "out.xml"
    # no retries: each test's tolerance must hold inside its chunk (PyTorch keeps it in one thread-local)
    r = _run_cli(["run", "suite.yaml", "--junit", str(junit), "--pytorch-src", str(checkout), "--jobs", "1",
                  "--max-retries", "0"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    cases = {(c.get("classname").split("::")[0], c.get("name")): c for s in ET.parse(junit).getroot() for c in s}
    for source in ("file:upstream_style.py", "pytorch:test/test_upstream_style.py"):
        def outcome(name):
            c = cases[(source, name)]
            return next((x.tag + ":" + (x.get("type") or "") for x in c), "passed")
        assert outcome("test_crash_spyre") == "skipped:xfail"
        assert "died" in cases[(source, "test_crash_spyre")].find("skipped").text
        assert outcome("test_after_crash_spyre") == "passed"  # after the crash, in the same chunk
        assert outcome("test_needs_tolerance_spyre") == "passed"  # only with the entry's atol 0.1
        assert outcome("test_known_failure_spyre") == "skipped:xfail"
        assert outcome("test_add_spyre_float32") == "passed"
        assert outcome("test_add_spyre_float16") == "skipped:"  # not a supported dtype of this suite
        assert outcome("test_unary_abs_spyre_float32") == "passed"
        assert "op exp left out" in cases[(source, "test_unary_exp_spyre_float32")].find("skipped").get("message")


@pytest.mark.slow
def test_a_sampled_run_prunes_stale_records_of_its_suite_from_the_results_file(tmp_path):
    """--only runs one test; the results file loses the record of a test the source no longer has and keeps
    the in-scope tests the sample did not run."""
    shutil.copy(DATA / "upstream_style.py", tmp_path / "upstream_style.py")
    shutil.copy(DATA / "suite.yaml", tmp_path / "suite.yaml")
    cls = "file:upstream_style.py::TestUpstreamStylePRIVATEUSE1"
    record = {"source": "file:upstream_style.py", "suite": "upstream-style", "template": "add", "op": None,
              "dtype": "float32", "mode": "mandatory_success", "outcome": "passed", "why": ""}
    old = {f"{cls}.test_renamed_spyre": record, f"{cls}.test_after_crash_spyre": record,
           f"{cls}.test_other_suite_spyre": {**record, "suite": "another"}}
    results_file = tmp_path / "r.json"
    import torch

    results_file.write_text(json.dumps({"format_version": 1, "runs": [], "torch_version": torch.__version__,
                                        "records": old}))
    (tmp_path / "only.txt").write_text(f"{cls}.test_add_spyre_float32\n")
    r = _run_cli(["run", "suite.yaml", "--only", "only.txt", "--results", str(results_file), "--jobs", "1"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(results_file.read_text())
    assert set(data["records"]) == {f"{cls}.test_add_spyre_float32", f"{cls}.test_after_crash_spyre",
                                    f"{cls}.test_other_suite_spyre"}
    assert data["runs"][-1]["pruned"] == 1


@pytest.mark.slow
def test_an_unexpected_failure_and_an_unexpected_pass_exit_1(tmp_path):
    shutil.copy(DATA / "upstream_style.py", tmp_path / "upstream_style.py")
    text = (DATA / "suite.yaml").read_text()
    text = text.replace("      - name: test_known_failure_spyre\n        mode: xfail\n        reason: compares ones with zeros on purpose\n", "")
    text = text.replace("mode: mandatory_success\n    tests:", "mode: skip\n    unlisted_reason: only two tests\n    tests:")
    text = text.replace("      - name: test_crash_spyre", "      - name: test_known_failure_spyre\n        mode: mandatory_success\n"
                        "      - name: test_add_spyre_float32\n        mode: xfail\n        reason: wrongly expected to fail\n"
                        "      - name: test_crash_spyre")
    text = text.replace("reason: kills its process (checks that a crash loses one test, not the run)",
                        "reason: kills its process\n      - name: test_(unary|needs).*\n        mode: skip\n        reason: not here")
    (tmp_path / "suite.yaml").write_text(text)
    r = _run_cli(["run", "suite.yaml"], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 unexpected failure" in r.stdout and "test_known_failure_spyre (also alone)" in r.stdout
    assert "1 unexpected pass" in r.stdout and "test_add_spyre_float32: passes; remove its xfail" in r.stdout


def test_a_pytorch_source_without_a_checkout_is_a_clear_error(tmp_path, capsys):
    from torch_spyre.testing.cli import main

    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("builtin:opinfo", "pytorch:test/test_ops.py"))
    assert main(["run", str(path)]) == 2
    assert "needs a PyTorch checkout: pass --pytorch-src DIR" in capsys.readouterr().err
    assert main(["run", str(path), "--pytorch-src", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no file" in err and "test_ops.py" in err
    path.write_text(GOOD.replace("version: 1", "version: 2"))
    assert main(["run", str(path)]) == 2
    assert f"{path}:1: version: Input should be 1" in capsys.readouterr().err


@pytest.mark.slow
def test_the_smoke_tier_passes():
    """The CI smoke tier (docs/test-suites.md gives its measured time)."""
    r = _run_cli(["run", "--tier", "smoke"], REPO)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "builtin:opinfo" in r.stdout and "xfailed" in r.stdout  # the summary table


def test_the_reported_reason_is_the_error_not_torchs_repro_boilerplate():
    from torch_spyre.testing.plan import Planned
    from torch_spyre.testing.runner import Outcome

    message = ("AssertionError: Tensor-likes are not close!\n\nTo execute this test, run the following from the base "
               "repo dir:\n    PYTORCH_OPINFO_SAMPLE_INPUT_INDEX=2 python x.py\n\nThis message can be suppressed by "
               "setting PYTORCH_PRINT_REPRO_ON_FAILURE=0")
    o = Outcome(Planned(_t("test_x"), "mandatory_success", ""), "failed", message)
    assert o.category == "unexpected failure" and o.why == "AssertionError: Tensor-likes are not close!"
    assert Outcome(Planned(_t("test_x"), "xfail", "known"), "failed", message).category == "xfailed"
    assert Outcome(Planned(_t("test_x"), "xfail", "known"), "passed").category == "unexpected pass"
    assert Outcome(Planned(_t("test_x"), "mandatory_success", ""), "skipped", "no sample").category == "skipped"


def test_the_reason_of_a_template_failure_is_its_error_and_largest_difference_not_the_sample():
    from torch_spyre.testing.plan import Planned
    from torch_spyre.testing.runner import Outcome

    message = ('  File "x.py", line 3, in test_wrapper\n    raise e_tracked from e\nException: Tensor-likes are not '
               'close!\n\nMismatched elements: 1 / 20 (5.0%)\nGreatest absolute difference: nan at index (13,) (up '
               'to 0.05 allowed)\nGreatest relative difference: nan at index (13,) (up to 0.05 allowed)\nsample 0: '
               'SampleInput(input=Tensor[size=(20,)])\n\nCaused by sample input at index 2: SampleInput(input=...)\n\n'
               'To execute this test, run the following from the base repo dir:\n    python x.py')
    o = Outcome(Planned(_t("test_x"), "mandatory_success", ""), "failed", message)
    assert o.why == ("Exception: Tensor-likes are not close! Greatest absolute difference: nan at index (13,) "
                     "(up to 0.05 allowed)")
    plain = Outcome(Planned(_t("test_x"), "mandatory_success", ""), "lost", "the worker died\nits last output: boom")
    assert plain.why == "its last output: boom"

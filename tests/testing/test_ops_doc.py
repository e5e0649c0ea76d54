"""docs/supported-ops.md is rendered from the suites' result records (testing/results.py)."""

from __future__ import annotations

import json
import pathlib

import pytest

from torch_spyre.testing import results
from torch_spyre.testing.plan import Collected, Planned
from torch_spyre.testing.runner import Outcome

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "supported-ops.md"


def test_the_doc_is_rendered_from_the_shipped_records():
    """CI's check, without running the full tier: the committed document is what the committed records give
    (regenerate: the command in the document's first lines)."""
    assert DOC.read_text() == results.render(results.load(results.SHIPPED_RESULTS))


def _outcome(op, dtype, mode, raw, template="compare_cpu", entry="full.yaml entry 1", reason="", message="",
             suite="opinfo-full", source="builtin:opinfo"):
    method = f"test_{template}_{op}_spyre_{dtype}"
    test = Collected(f"{source}::TestSpyreOpsPRIVATEUSE1.{method}", source, "TestSpyreOpsPRIVATEUSE1",
                     method, f"test_{template}", op, dtype)
    return Outcome(Planned(test, mode, reason, entry=entry, suite=suite), raw, message)


def test_a_run_prunes_records_its_suite_and_source_no_longer_hold(tmp_path):
    """A renamed or removed test (or one that left the suite's tier) loses its record when a run of the same
    suite and source writes the file, also when --only did not run it; other suites' and sources' records stay."""
    path = tmp_path / "r.json"
    old = [_outcome("add", "float32", "mandatory_success", "passed"),
           _outcome("renamed_op", "float32", "mandatory_success", "failed", message="AssertionError: stale"),
           _outcome("mul", "float32", "mandatory_success", "passed"),  # still in scope, not run below
           _outcome("smoke_only", "float32", "mandatory_success", "passed", suite="opinfo-smoke"),
           _outcome("renamed_op", "float32", "mandatory_success", "passed", source="builtin:module_info")]
    results.write(path, old, ["spyre-tests", "run", "a"], "2.13.0")
    assert len(results.load(path)["records"]) == 5
    ids = [o.planned.test.id for o in old]
    scope = {("opinfo-full", "builtin:opinfo"): {ids[0], ids[2]}}  # what the run collected, before --only
    results.write(path, [_outcome("add", "float32", "mandatory_success", "failed", message="AssertionError: x")],
                  ["spyre-tests", "run", "b"], "2.13.0", scope)
    data = results.load(path)
    assert set(data["records"]) == {ids[0], ids[2], ids[3], ids[4]}
    assert data["records"][ids[0]]["outcome"] == "unexpected failure" and data["records"][ids[0]]["suite"] == "opinfo-full"
    assert data["runs"][-1] == {"command": "spyre-tests run b", "records": 1, "pruned": 1}
    assert "(1 records; 1 stale records pruned)" in results.render(data)
    # a record that names no suite (written before records named theirs) is never pruned
    data["records"][ids[2]].pop("suite")
    assert ids[2] in results.prune(data["records"], {("opinfo-full", "builtin:opinfo"): set()})


def test_records_merge_by_test_and_render_rates_cells_and_reasons(tmp_path):
    path = tmp_path / "r.json"
    first = [_outcome("add", "float32", "mandatory_success", "passed"),
             _outcome("erf", "float16", "xfail", "failed", reason="known NaN"),
             _outcome("sub", "float32", "mandatory_success", "failed", message="AssertionError: boom"),
             _outcome("mul", "float32", "skip", "not run", entry="unlisted", reason="another tier")]
    results.write(path, first, ["spyre-tests", "run", "a"], "2.13.0")
    data = results.load(path)
    assert set(data["records"]) == {o.planned.test.id for o in first[:3]}  # the unlisted skip is not a result
    # a second run replaces the records of the tests it ran and keeps the rest
    results.write(path, [_outcome("sub", "float32", "mandatory_success", "passed")], ["spyre-tests", "run", "b"],
                  "2.13.0")
    data = results.load(path)
    assert [r["outcome"] for r in data["records"].values()] == ["passed", "xfailed", "passed"]
    assert [r["command"] for r in data["runs"]] == ["spyre-tests run a", "spyre-tests run b"]
    text = results.render(data)
    assert "| builtin:opinfo | compare_cpu | float16 | 0 | 1 | 0 | 0 | 0 | 0.0% |" in text
    assert "| builtin:opinfo | compare_cpu | float32 | 2 | 0 | 0 | 0 | 0 | 100.0% |" in text
    assert "| `erf` |  | xfail [1] |" in text and "1. known NaN" in text
    assert "| `add` | pass |  |" in text


def test_a_results_file_of_another_format_or_torch_is_refused_clearly(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format_version": 99, "records": {}}))
    with pytest.raises(results.ResultsError, match=r"r\.json: results format version 99.*reads version 1.*--results"):
        results.load(path)
    results.write(tmp_path / "ok.json", [], ["spyre-tests"], "2.13.0")
    with pytest.raises(results.ResultsError, match=r"torch 2\.13\.0, this is torch 2\.14\.1; write to a new file"):
        results.write(tmp_path / "ok.json", [], ["spyre-tests"], "2.14.1")


def test_ops_doc_and_run_refuse_a_bad_results_file_before_running(tmp_path, capsys):
    from torch_spyre.testing.cli import main

    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"format_version": 0}))
    assert main(["ops-doc", str(bad)]) == 2
    assert "results format version 0" in capsys.readouterr().err
    assert main(["run", "--tier", "smoke", "--results", str(bad)]) == 2  # refused before collecting anything
    assert "results format version 0" in capsys.readouterr().err
    out = tmp_path / "doc.md"
    assert main(["ops-doc", "-o", str(out)]) == 0
    assert out.read_text() == DOC.read_text()

"""Result records of ``spyre-tests run --results FILE``, and docs/supported-ops.md rendered from them.

A results file is JSON: its format version, the torch version, the runs that wrote it (their command and
test count) and one record per test that ran or that an entry skipped (template, op, dtype, mode, outcome
under the suite's modes, and why, for anything but a pass). Tests outside the run (another tier's, or an
unlisted ``skip``) get no record. Writing into an existing file replaces the records of the tests this run
ran and keeps the others, so sampled runs add up; the full tier rewrites every record it runs. A record of
a suite and source the run collected whose test is no longer in that suite's scope (renamed or removed
upstream, or now outside the suite's tier) is pruned, whether or not ``--only`` ran it: records name their
suite, so a smoke run never prunes the full tier's records.

``spyre-tests ops-doc FILE`` renders the records as docs/supported-ops.md: pass rates per source, template
and dtype, then a row per OpInfo op and per ModuleInfo module with each template and dtype's outcome, and
the reasons of every expected failure, skip and failure. The shipped records
(:data:`SHIPPED_RESULTS`) are what the committed document is generated from, so CI checks the document
against them without running the full tier.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .plan import in_scope

FORMAT_VERSION = 1
SHIPPED_RESULTS = Path(__file__).with_name("results") / "full-tier.json"
DOC_COMMAND = "spyre-tests ops-doc torch_spyre/testing/results/full-tier.json -o docs/supported-ops.md"
DTYPES = ("float32", "float16", "bfloat16")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
CELL = {"passed": "pass", "xfailed": "xfail", "skipped": "skip", "unexpected failure": "FAIL",
        "unexpected pass": "XPASS"}


class ResultsError(ValueError):
    """A results file this version cannot read."""


def records(outcomes: list[Any]) -> dict[str, dict]:
    """Records of a run's outcomes (``runner.Outcome``): id -> record. Unlisted skips are left out."""
    out = {}
    for o in outcomes:
        p = o.planned
        if not in_scope(p):
            continue  # outside this suite's scope (another tier): nothing was learned about it
        category = o.category
        out[p.test.id] = {
            "source": p.test.source, "suite": p.suite, "template": p.test.base.removeprefix("test_"),
            "op": p.test.op, "dtype": p.test.dtype, "mode": p.mode, "outcome": category,
            "why": "" if category == "passed" else " ".join(o.why.split())[:300],
        }
    return out


def load(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("format_version") != FORMAT_VERSION:
        raise ResultsError(f"{path}: results format version {data.get('format_version')!r}, this torch-spyre reads "
                           f"version {FORMAT_VERSION}; run the suites again with --results to write it anew")
    return data


def check_writable(path: Path, torch_version: str) -> dict:
    """What ``path`` holds (empty records when it does not exist); ResultsError when a run cannot add to it."""
    path = Path(path)
    data = load(path) if path.exists() else {"format_version": FORMAT_VERSION, "runs": [], "records": {}}
    if data.get("torch_version") not in (None, torch_version):
        raise ResultsError(f"{path}: holds results of torch {data['torch_version']}, this is torch {torch_version}; "
                           "write to a new file (or delete this one) so the records describe one torch")
    return data


def prune(recs: dict[str, dict], scope: dict[tuple[str, str], set[str]]) -> dict[str, dict]:
    """``recs`` without the stale ones: a record whose (suite, source) ``scope`` covers but whose test it does
    not hold. Records of other suites or sources, and records that name no suite, are kept."""
    return {k: r for k, r in recs.items()
            if (r.get("suite"), r["source"]) not in scope or k in scope[(r.get("suite"), r["source"])]}


def write(path: Path, outcomes: list[Any], command: list[str], torch_version: str,
          scope: dict[tuple[str, str], set[str]] | None = None) -> dict:
    """Merge a run's records into ``path`` (created if missing), pruning the records ``scope`` (the run's
    ``RunResult.scope``) says are stale; returns what was written."""
    path = Path(path)
    data = check_writable(path, torch_version)
    new = records(outcomes)
    kept = prune(data["records"], scope or {})
    data["torch_version"] = torch_version
    run = {"command": " ".join(command), "records": len(new)}
    if len(kept) < len(data["records"]):
        run["pruned"] = len(data["records"]) - len(kept)
    data["runs"].append(run)
    data["records"] = dict(sorted({**kept, **new}.items()))
    dump(path, data)
    return data


def dump(path: Path, data: dict) -> None:
    """Write a results file, one record a line: diffs of the committed file show which tests changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in data["records"].items()]
    head = {k: v for k, v in data.items() if k != "records"}
    text = json.dumps(head, indent=1, sort_keys=True)[:-2] + ',\n "records": {\n' + ",\n".join(lines) + "\n }\n}\n"
    path.write_text(text)


# --- the document -------------------------------------------------------------------------------------------
HEADER = f"""# Supported ops: PyTorch's own tests on spyre

Generated from the result records of the upstream test suites (docs/test-suites.md) by
`{DOC_COMMAND}` (do not edit by hand; `tests/testing/test_ops_doc.py` checks this file against the
records). The records are written by `spyre-tests run ... --results torch_spyre/testing/results/full-tier.json`:
the full tier writes every test, a sampled run (`--only IDS`) adds its tests to the file. **Only the tests
listed below ran**: an op, template or dtype without an entry has no result yet. Which ATen ops run as
programs on the card and which on the host: [eager-ops.md](eager-ops.md).

Outcomes, under the suite's modes: `pass`; `xfail`, an expected failure (its reason below); `FAIL`, an
unexpected failure; `XPASS`, an unexpected pass; `skip`, skipped by an entry or by the test itself (a sample
the card refuses because it cannot hold its dtype, no sample the CPU accepts). Pass rate: passed / (passed +
xfailed + unexpected failures); skips do not count.
"""


def _rate(c: Counter) -> str:
    ran = c["passed"] + c["xfailed"] + c["unexpected failure"]
    return f"{100 * c['passed'] / ran:.1f}%" if ran else "-"


def render(data: dict) -> str:
    recs = data["records"]
    lines = [HEADER, f"torch {data['torch_version']}; {len(recs)} records, from these runs (oldest first):", ""]
    lines += [f"- `{r['command']}` ({r['records']} records"
              + (f"; {r['pruned']} stale records pruned" if r.get("pruned") else "") + ")" for r in data["runs"]]
    lines += ["", "## Pass rates", "", "| source | template | dtype | passed | xfailed | unexpected failure | "
              "unexpected pass | skipped | pass rate |", "|---|---|---|---|---|---|---|---|---|"]
    counts: dict[tuple, Counter] = {}
    for r in recs.values():
        counts.setdefault((r["source"], r["template"], r["dtype"] or "-"), Counter())[r["outcome"]] += 1
    for (source, template, dtype), c in sorted(counts.items()):
        lines.append(f"| {source} | {template} | {dtype} | {c['passed']} | {c['xfailed']} | "
                     f"{c['unexpected failure']} | {c['unexpected pass']} | {c['skipped']} | {_rate(c)} |")
    reasons: dict[str, int] = {}
    for source, title in (("builtin:opinfo", "OpInfo ops"), ("builtin:module_info", "ModuleInfo modules")):
        lines += _table(recs, source, title, reasons)
    other = sorted({r["source"] for r in recs.values()} - {"builtin:opinfo", "builtin:module_info"})
    for source in other:
        lines += _table(recs, source, f"Tests of `{source}`", reasons)
    lines += ["", "## Reasons", ""]
    lines += [f"{n}. {why}" for why, n in reasons.items()]
    return "\n".join(lines) + "\n"


def _table(recs: dict, source: str, title: str, reasons: dict[str, int]) -> list[str]:
    rows: dict[str, dict[tuple, dict]] = {}
    for test_id, r in recs.items():
        if r["source"] == source:
            rows.setdefault(r["op"] or test_id.rsplit(".", 1)[-1], {})[(r["template"], r["dtype"])] = r
    if not rows:
        return []
    columns = sorted({k for row in rows.values() for k in row},
                     key=lambda k: (k[0], DTYPES.index(k[1]) if k[1] in DTYPES else len(DTYPES), k[1] or ""))
    head = [f"{t} {SHORT.get(d, d or '')}".strip() for t, d in columns]
    out = ["", f"## {title}", "", "| " + " | ".join(["name", *head]) + " |", "|" + "---|" * (len(head) + 1)]
    for name, row in sorted(rows.items()):
        cells = []
        for key in columns:
            r = row.get(key)
            if r is None:
                cells.append("")
                continue
            cell = CELL[r["outcome"]]
            if r["why"]:
                cell += f" [{reasons.setdefault(r['why'], len(reasons) + 1)}]"
            cells.append(cell)
        out.append("| " + " | ".join([f"`{name}`", *cells]) + " |")
    return out

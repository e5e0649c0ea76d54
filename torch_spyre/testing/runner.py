"""``spyre-tests run``: suites -> collected tests -> plan -> chunks in subprocesses -> outcomes, report, JUnit.

Each source's tests are collected in a subprocess (importing a source instantiates its device-generic
tests), planned (:mod:`plan`), and the tests to run are split into chunks, each run by a worker subprocess
(:mod:`worker`): a crash or a hang loses that chunk's remaining tests, not the run. Every test that failed,
errored or was lost is then retried alone in a fresh process (at most ``max_retries`` of them) before it is
reported; one that passes alone is reported as passed, marked flaky.

Outcomes under the modes: a mandatory_success test passes or is an *unexpected failure*; an xfail test
fails (xfailed) or is an *unexpected pass*; a skip test is not run. A test that skips itself at run time
(no sample, refused by the card) is skipped whatever its mode. The run fails (exit 1) on any unexpected
failure or unexpected pass.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree as ET

from .plan import Collected, Planned, StaleEntryWarning, in_scope, plan_source, warn_stale
from .suite import Source, Suite, SuiteError, load_suite

SHIPPED_CONFIGS = Path(__file__).with_name("configs")
# lines PyTorch's test harness appends to every failure: not the reason
# ("Caused by sample input at index N" names the last sample generated, not the one that failed: the templates
# say which sample failed in their own message)
BOILERPLATE = ("PYTORCH_PRINT_REPRO_ON_FAILURE", "To execute this test, run", "PYTORCH_OPINFO_SAMPLE_INPUT_INDEX",
               "Caused by sample input at index")
ERROR_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit|Interrupt)\b: ")
CATEGORIES = ("passed", "xfailed", "skipped", "unexpected failure", "unexpected pass")


@dataclass
class Outcome:
    planned: Planned
    raw: str  # passed | failed | error | skipped | lost | not run
    message: str = ""
    time: float = 0.0
    retried: bool = False

    @property
    def category(self) -> str:
        mode, raw = self.planned.mode, self.raw
        if mode == "skip" or raw == "skipped":
            return "skipped"
        if mode == "xfail":
            return "unexpected pass" if raw == "passed" else "xfailed"
        return "passed" if raw == "passed" else "unexpected failure"

    @property
    def why(self) -> str:
        if self.planned.mode == "skip":
            return self.planned.reason
        if self.category == "xfailed":
            return self.planned.reason
        if self.category == "unexpected pass":
            return f"passes; remove its xfail ({self.planned.entry.split(' (')[0]})"
        lines = [line for line in self.message.strip().splitlines() if line.strip() and not any(
            boiler in line for boiler in BOILERPLATE)]
        # the exception's own line (a comparison's message goes on with its details and the sample) ...
        at = next((i for i in range(len(lines) - 1, -1, -1) if ERROR_LINE.match(lines[i])), None)
        if at is None:
            return lines[-1][:300] if lines else self.raw
        # ... with the largest difference when it is a comparison
        detail = next((line.strip() for line in lines[at + 1:] if line.startswith("Greatest absolute")), "")
        return f"{lines[at]} {detail}".strip()[:300]


@dataclass
class RunOptions:
    tier: str | None = None
    pytorch_src: Path | None = None
    jobs: int = 1
    chunk_size: int = 300
    max_retries: int = 25
    test_timeout: int = 300
    python: str = sys.executable
    only: set[str] | None = None  # run only these test ids (spyre-tests select's output)


@dataclass
class RunResult:
    outcomes: list[Outcome] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    # (suite name, source) -> the ids of every test of it that has a result record when it runs, whatever
    # --only chose: a record of that suite and source outside this set is stale (results.write prunes it)
    scope: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def counts(self) -> Counter:
        return Counter(o.category for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        c = self.counts()
        return 1 if c["unexpected failure"] or c["unexpected pass"] else 0


# --- sources --------------------------------------------------------------------------------------------------
def resolve_source(source: Source, suite_path: Path, pytorch_src: Path | None) -> dict:
    """``{"source", "path"}`` for the worker; a clear SuiteError when a file source cannot be found."""
    kind, _, rest = source.source.partition(":")
    if kind == "builtin":
        return {"source": source.source, "path": None}
    if kind == "pytorch":
        if pytorch_src is None:
            raise SuiteError(f"{suite_path}: source {source.source} needs a PyTorch checkout: pass --pytorch-src DIR "
                             "(a clone of pytorch/pytorch at the tag of the installed torch)")
        path = Path(pytorch_src) / rest
    else:
        path = suite_path.parent / rest
    if not path.is_file():
        raise SuiteError(f"{suite_path}: source {source.source}: no file {path}")
    return {"source": source.source, "path": str(path.resolve())}


def _worker(python: str, command: str, spec: dict, out: Path) -> subprocess.Popen:
    spec_path = out.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    return subprocess.Popen([python, "-m", "torch_spyre.testing.worker", command, str(spec_path), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def collect_source(spec: dict, workdir: Path, python: str) -> list[Collected]:
    out = workdir / f"collect-{abs(hash(spec['source'])) % 10**8}.json"
    proc = _worker(python, "collect", spec, out)
    _, err = proc.communicate()
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-15:])
        raise SuiteError(f"source {spec['source']}: collecting its tests failed (exit {proc.returncode}):\n{tail}")
    return [Collected(**t) for t in json.loads(out.read_text())]


# --- running chunks -------------------------------------------------------------------------------------------
def _chunks(planned: list[Planned], size: int) -> list[list[Planned]]:
    by_source: dict[str, list[Planned]] = {}
    for p in planned:
        by_source.setdefault(p.test.source, []).append(p)
    out = []
    for tests in by_source.values():
        out += [tests[i:i + size] for i in range(0, len(tests), size)]
    return out


def _run_chunk(chunk: list[Planned], spec: dict, workdir: Path, index: int, options: RunOptions,
               on_result) -> dict[str, dict]:
    """Run one chunk in a worker; every test's raw record. When the worker dies, the test it was running is
    recorded as ``lost`` (with the process's last output) and the chunk's remaining tests go on in a new one."""
    seen: dict[str, dict] = {}
    attempt = 0
    while len(seen) < len(chunk):
        rest = [p for p in chunk if p.test.id not in seen]
        returncode, tail = _run_worker(rest, spec, workdir / f"chunk-{index}-{attempt}.jsonl", options,
                                       seen, on_result)
        attempt += 1
        if len(seen) < len(chunk):
            victim = next(p for p in chunk if p.test.id not in seen)
            record = {"id": victim.test.id, "outcome": "lost", "time": 0.0,
                      "message": f"the worker process died (exit {returncode}) while running this test; "
                                 f"its last output:\n{tail}"}
            seen[victim.test.id] = record
            on_result(record)
    return seen


def _run_worker(tests: list[Planned], spec: dict, out: Path, options: RunOptions, seen: dict, on_result):
    body = {**spec, "timeout": options.test_timeout,
            "tests": [{"id": p.test.id, "class_name": p.test.class_name, "method": p.test.method,
                       "atol": p.atol, "rtol": p.rtol} for p in tests]}
    proc = _worker(options.python, "run", body, out)
    stderr_lines: list[str] = []
    reader = threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True)
    reader.start()
    done_lines = 0
    deadline = time.monotonic() + options.test_timeout * (len(tests) + 2)  # a hang SIGALRM cannot break
    while True:
        finished = proc.poll() is not None
        if out.exists():
            lines = out.read_text().split("\n")[:-1]  # complete lines only (the worker may be mid-write)
            for line in lines[done_lines:]:
                record = json.loads(line)
                seen[record["id"]] = record
                on_result(record)
            done_lines = len(lines)
        if finished:
            break
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.2)
    reader.join(timeout=5)
    return proc.returncode, "".join(stderr_lines[-12:]).strip()


def run_suites(config_paths: list[Path], options: RunOptions, progress=None) -> RunResult:
    """Load, collect, plan and run; ``progress(total)`` returns a callback advanced once per finished test."""
    started = time.perf_counter()
    result = RunResult()
    with tempfile.TemporaryDirectory(prefix="spyre-tests-") as tmp:
        workdir = Path(tmp)
        planned, specs = [], {}
        for path in config_paths:
            suite = load_suite(path)
            for source in suite.sources:
                if options.tier and options.tier not in (source.labels or suite.labels):
                    continue
                spec = resolve_source(source, Path(path), options.pytorch_src)
                specs[source.source] = spec
                tests = collect_source(spec, workdir, options.python)
                plan, stale = plan_source(suite, source, tests, str(path))
                with warnings.catch_warnings():
                    warnings.simplefilter("always", StaleEntryWarning)
                    result.stale += warn_stale(source, stale, str(path))
                planned += plan
                result.scope.setdefault((suite.name, source.source), set()).update(
                    p.test.id for p in plan if in_scope(p))
        if options.only is not None:
            planned = [p for p in planned if p.test.id in options.only]
        to_run = [p for p in planned if p.mode != "skip"]
        result.outcomes = [Outcome(p, "not run") for p in planned if p.mode == "skip"]
        advance = progress(len(to_run)) if progress else (lambda record: None)
        lock = threading.Lock()

        def on_result(record):
            with lock:
                advance(record)

        records: dict[str, dict] = {}
        chunks = _chunks(to_run, options.chunk_size)
        with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
            futures = [pool.submit(_run_chunk, c, specs[c[0].test.source], workdir, i, options, on_result)
                       for i, c in enumerate(chunks)]
            for f in futures:
                records.update(f.result())
        outcomes = {p.test.id: Outcome(p, records[p.test.id]["outcome"], records[p.test.id].get("message", ""),
                                       records[p.test.id].get("time", 0.0)) for p in to_run}
        _retry_alone(outcomes, specs, workdir, options)
        result.outcomes += list(outcomes.values())
    result.wall_s = time.perf_counter() - started
    return result


def _retry_alone(outcomes: dict[str, Outcome], specs: dict, workdir: Path, options: RunOptions) -> None:
    """Rerun each unexpected failure in a process of its own (the chunk's state or a crash may have caused it)."""
    failing = [o for o in outcomes.values() if o.category == "unexpected failure"][: options.max_retries]
    for i, o in enumerate(failing):
        record = _run_chunk([o.planned], specs[o.planned.test.source], workdir, 10**6 + i, options,
                            lambda r: None)[o.planned.test.id]
        o.retried = True
        if record["outcome"] == "passed":
            o.raw, o.message = "passed", "flaky: failed in its chunk, passed alone: " + o.why
        else:
            o.raw, o.message, o.time = record["outcome"], record.get("message", ""), record.get("time", 0.0)


# --- reports --------------------------------------------------------------------------------------------------
def summary_rows(result: RunResult) -> list[tuple[str, Counter]]:
    by_source: dict[str, Counter] = {}
    for o in result.outcomes:
        by_source.setdefault(o.planned.test.source, Counter())[o.category] += 1
    return sorted(by_source.items())


def print_summary(result: RunResult, console, limit: int = 40) -> None:
    from rich.table import Table

    table = Table(title=f"spyre-tests: {len(result.outcomes)} tests in {result.wall_s:.0f} s (host wall time)")
    table.add_column("source")
    for c in CATEGORIES:
        table.add_column(c, justify="right")
    total = Counter()
    for source, counts in summary_rows(result):
        total += counts
        table.add_row(source, *(str(counts[c]) for c in CATEGORIES))
    table.add_row("total", *(str(total[c]) for c in CATEGORIES), style="bold")
    console.print(table)
    for category in ("unexpected failure", "unexpected pass"):
        bad = [o for o in result.outcomes if o.category == category]
        if bad:
            console.print(f"[bold red]{len(bad)} {category}{'s' if len(bad) > 1 else ''}[/]")
            for o in bad[:limit]:
                retried = " (also alone)" if o.retried else ""
                console.print(f"  {o.planned.test.id}{retried}: {o.why}", markup=False, highlight=False)
            if len(bad) > limit:
                console.print(f"  ... and {len(bad) - limit} more (see the JUnit file)")
    xfail_reasons = Counter(o.planned.reason for o in result.outcomes if o.category == "xfailed")
    for reason, n in xfail_reasons.most_common(10):
        console.print(f"  xfailed {n}: {reason}", markup=False, highlight=False)
    for message in result.stale:
        console.print(f"[yellow]warning:[/] {message}")


def write_junit(result: RunResult, path: Path) -> None:
    root = ET.Element("testsuites", name="spyre-tests", time=f"{result.wall_s:.3f}")
    for source, counts in summary_rows(result):
        outcomes = [o for o in result.outcomes if o.planned.test.source == source]
        suite = ET.SubElement(root, "testsuite", name=source, tests=str(len(outcomes)),
                              failures=str(counts["unexpected failure"] + counts["unexpected pass"]),
                              skipped=str(counts["skipped"] + counts["xfailed"]), errors="0",
                              time=f"{sum(o.time for o in outcomes):.3f}")
        for o in outcomes:
            t = o.planned.test
            case = ET.SubElement(suite, "testcase", classname=f"{source}::{t.class_name}", name=t.method,
                                 time=f"{o.time:.3f}")
            if o.category == "unexpected failure":
                ET.SubElement(case, "failure", type=o.raw, message=o.why).text = o.message
            elif o.category == "unexpected pass":
                ET.SubElement(case, "failure", type="unexpected pass", message=o.why)
            elif o.category == "xfailed":
                ET.SubElement(case, "skipped", type="xfail", message=o.planned.reason).text = o.message
            elif o.category == "skipped":
                ET.SubElement(case, "skipped", message=o.planned.reason if o.planned.mode == "skip" else o.message)
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def shipped_configs() -> list[Path]:
    """The suite files shipped in the wheel (``torch_spyre/testing/configs/``)."""
    return sorted(SHIPPED_CONFIGS.glob("*.yaml"))


def env_ok() -> str | None:
    """None when this Python can import the test databases, else what to install."""
    import importlib.util

    if importlib.util.find_spec("expecttest") is None:
        return "PyTorch's test databases need expecttest: pip install 'torch-spyre[test]' (or pip install expecttest)"
    return None



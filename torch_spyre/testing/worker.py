"""The subprocess side of the runner: collect a source's tests, or run a chunk of them.

    python -m torch_spyre.testing.worker collect SOURCE_JSON OUT_JSON
    python -m torch_spyre.testing.worker run CHUNK_JSON RESULTS_JSONL

``run`` writes one JSON line per finished test and flushes it at once, so when the process dies (a crash in
the device, a hang killed by the runner) every test before the one that killed it is kept and the runner
knows which tests were lost. Outcomes are raw (passed, failed, error, skipped); what they mean under the
suite's modes is decided by the runner.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
import unittest
from pathlib import Path
from typing import get_args

from .suite import DtypeName

DEVICE = "spyre"
DTYPES = set(get_args(DtypeName))
BUILTIN_MODULES = {"builtin:opinfo": "torch_spyre.testing.opinfo_tests",
                   "builtin:module_info": "torch_spyre.testing.module_tests"}


GENERIC_TESTS: dict[str, set[str]] = {}  # instantiated class -> its generic test methods (filled by load_source)


def load_source(source: str, path: str | None):
    """The module of a source (a builtin template module, or an upstream-style file at ``path``)."""
    from .._torch.testing import DEVICE_ONLY_FOR_ENV, recording_generic_tests

    with recording_generic_tests(GENERIC_TESTS):
        return _import_source(source, path, DEVICE_ONLY_FOR_ENV)


def _import_source(source: str, path: str | None, env: dict[str, str]):

    os.environ.update(env)  # instantiate device-generic tests for spyre only (not the CPU)
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    sys.argv = sys.argv[:1]  # torch's test utilities read the command line
    if source in BUILTIN_MODULES:
        return importlib.import_module(BUILTIN_MODULES[source])
    file = Path(path)
    sys.path.insert(0, str(file.parent))  # upstream test files import their neighbours
    name = "spyre_suite_" + file.stem
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _classes(module) -> dict[str, type]:
    return {name: obj for name, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, unittest.TestCase) and obj.__module__ == module.__name__}


def _describe(cls: type, method: str) -> tuple[str, str | None, str | None]:
    """(generic method, op, dtype) of an instantiated test ``test_<base>[_<op>]_spyre[_<dtype>]``."""
    generics = GENERIC_TESTS.get(cls.__name__, set())
    base = max((g for g in generics if method == g or method.startswith(g + "_")), key=len, default=method)
    rest = method[len(base) + 1:]
    dtype = next((d for d in DTYPES if rest == d or rest.endswith("_" + d)), None)
    if dtype:
        rest = rest[: -len(dtype) - 1] if rest != dtype else ""
    if rest == DEVICE or rest.endswith("_" + DEVICE):
        rest = rest[: -len(DEVICE) - 1] if rest != DEVICE else ""
    return base, rest or None, dtype


def collect(source: str, path: str | None) -> list[dict]:
    module = load_source(source, path)
    out = []
    loader = unittest.TestLoader()
    for cname, cls in sorted(_classes(module).items()):
        for method in loader.getTestCaseNames(cls):
            base, op, dtype = _describe(cls, method)
            out.append({"id": f"{source}::{cname}.{method}", "source": source, "class_name": cname,
                        "method": method, "base": base, "op": op, "dtype": dtype})
    return out


def _clip(text: str, keep: int = 2000) -> str:
    """The start and the end of a long message: an error's first line (``NotImplementedError: Could not run
    ...``) can be followed by pages of dispatcher registrations before the end of the traceback."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}\n[... {len(text) - 2 * keep} characters ...]\n{text[-keep:]}"


class _Timeout(Exception):
    pass


class _JsonResult(unittest.TestResult):
    """Writes each test's outcome as a JSON line the moment it is known."""

    def __init__(self, out, ids):
        super().__init__()
        self.out, self.ids, self.started = out, ids, 0.0

    def startTest(self, test):
        super().startTest(test)
        self.started, self.outcome = time.perf_counter(), ("passed", "")

    def addError(self, test, err):
        self.outcome = ("error", self._text(err))

    def addFailure(self, test, err):
        self.outcome = ("failed", self._text(err))

    def addSkip(self, test, reason):
        self.outcome = ("skipped", reason)

    def addExpectedFailure(self, test, err):  # an upstream @expectedFailure decorator
        self.outcome = ("failed", "expected failure upstream: " + self._text(err))

    def addUnexpectedSuccess(self, test):
        self.outcome = ("passed", "unexpected success upstream")

    def stopTest(self, test):
        super().stopTest(test)
        key = (type(test).__name__, test._testMethodName)
        record = {"id": self.ids.get(key, f"?::{key[0]}.{key[1]}"), "outcome": self.outcome[0],
                  "message": _clip(self.outcome[1]), "time": round(time.perf_counter() - self.started, 3)}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    @staticmethod
    def _text(err) -> str:
        return "".join(traceback.format_exception(*err)[-3:]).strip()


def run(chunk: dict, results_path: str) -> None:
    """Run the chunk's tests (``{"source", "path", "timeout", "tests": [{id, class_name, method, atol, rtol}]}``)."""
    module = load_source(chunk["source"], chunk.get("path"))
    classes = _classes(module)
    ids, tolerances, suite = {}, {}, unittest.TestSuite()
    for t in chunk["tests"]:
        key = (t["class_name"], t["method"])
        if t.get("atol") is not None:  # the suite's tolerance: PyTorch's assertEqual takes these as its minimum
            tolerances[key] = (t["atol"], t["rtol"])
        ids[key] = t["id"]
        suite.addTest(classes[t["class_name"]](t["method"]))
    timeout = int(chunk.get("timeout") or 0)

    def on_alarm(signum, frame):
        raise _Timeout(f"the test ran longer than {timeout} s")

    if timeout:
        signal.signal(signal.SIGALRM, on_alarm)
    with open(results_path, "a") as out:
        result = _JsonResult(out, ids)
        original_start = result.startTest

        def start(test):
            original_start(test)
            # set as each test starts: PyTorch's TestCase keeps precision/rel_tol in one thread-local for every
            # instance, so a value set on each case at construction would give the whole chunk the last one's
            test.precision, test.rel_tol = tolerances.get((type(test).__name__, test._testMethodName), (0.0, 0.0))
            if timeout:
                signal.alarm(timeout)

        result.startTest = start
        suite.run(result)
        signal.alarm(0)


def main(argv: list[str]) -> int:
    command, spec, out = argv
    data = json.loads(Path(spec).read_text())
    if command == "collect":
        Path(out).write_text(json.dumps(collect(data["source"], data.get("path"))))
    elif command == "run":
        run(data, out)
    else:
        raise SystemExit(f"unknown worker command {command!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The YAML suite format: which upstream PyTorch tests must pass on spyre, which are expected to fail and why.

A suite file is read by :func:`load_suite` into a :class:`Suite` (a pydantic model). The JSON schema shipped
next to this module (``suite.schema.json``) is generated from the model (:func:`json_schema`;
``python -m torch_spyre.testing.suite > torch_spyre/testing/suite.schema.json``), so editors can validate a file
as it is written. The ideas follow IBM's RFC 1287 (modes, name regexes, edits, per-dtype tolerances, labels
choosing tiers); the format is our own. docs/test-suites.md describes every field.

A file that does not match gives a :class:`SuiteError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import SpyreError

FORMAT_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("suite.schema.json")

Mode = Literal["skip", "mandatory_success", "xfail"]
# The dtypes a test name can end with (device-type tests are instantiated per dtype, named ..._<dtype>).
DtypeName = Literal["float32", "float16", "bfloat16", "float64", "complex32", "complex64", "complex128",
                    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
                    "float8_e4m3fn", "float8_e5m2"]
Tier = Literal["smoke", "full"]
SOURCE_PATTERN = r"^(builtin:(opinfo|module_info)|pytorch:.+\.py|file:.+\.py)$"


class SuiteError(SpyreError, ValueError):
    """A suite file that cannot be used: the message names the file, the line and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tolerance(_Strict):
    """Absolute and relative tolerance of a comparison (``|a - e| <= atol + rtol * |e|``)."""

    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class Selection(_Strict):
    """Which values an entry keeps: ``include`` (all when absent) minus ``exclude``."""

    include: list[str] | None = None
    exclude: list[str] = []

    def keeps(self, value: str | None) -> bool:
        if value is None:
            return True  # a test without that parameter is not filtered by it
        return (self.include is None or value in self.include) and value not in self.exclude


class DtypeSelection(Selection):
    include: list[DtypeName] | None = None
    exclude: list[DtypeName] = []


class Edits(_Strict):
    """Changes to the instantiated tests an entry matches: instances its dtype or op selection leaves out
    are not run (skipped with a reason naming the entry); ``tolerances`` replace the suite's per dtype
    (``all``: every dtype, and tests without a dtype parameter)."""

    dtypes: DtypeSelection = DtypeSelection()
    ops: Selection = Selection()
    tolerances: dict[DtypeName | Literal["all"], Tolerance] = {}


class TestEntry(_Strict):
    """Tests whose name matches ``name`` (a regex, matched in full against ``test_method`` or
    ``Class.test_method``) run in ``mode``; xfail and skip need a ``reason``."""

    __test__ = False  # not a pytest test class
    name: str = Field(description="a regex matched in full against the test's method name or Class.method")
    mode: Mode
    reason: str | None = Field(None, description="why; required for xfail and skip")
    tags: list[str] = []
    edits: Edits = Edits()

    @field_validator("name")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regex: {e}") from None
        return v

    @model_validator(mode="after")
    def _reason(self) -> "TestEntry":
        if self.mode != "mandatory_success" and not (self.reason or "").strip():
            raise ValueError(f"mode {self.mode} needs a reason (say why the test is not expected to pass)")
        return self

    def matches(self, method: str, class_name: str) -> bool:
        return bool(re.fullmatch(self.name, method) or re.fullmatch(self.name, f"{class_name}.{method}"))


class Source(_Strict):
    """One upstream test source and how its tests run on spyre.

    ``source`` is ``builtin:opinfo`` (PyTorch's OpInfo database through torch_spyre's device-generic
    templates), ``builtin:module_info`` (ModuleInfo), ``pytorch:test/test_x.py`` (a file of the checkout
    given with ``--pytorch-src``) or ``file:path.py`` (relative to the YAML file)."""

    source: str = Field(pattern=SOURCE_PATTERN)
    unlisted_test_mode: Mode
    unlisted_reason: str | None = Field(None, description="why; required when unlisted_test_mode is xfail or skip")
    labels: list[Tier] | None = Field(None, description="tiers of this source (default: the suite's labels)")
    tests: list[TestEntry] = []

    @model_validator(mode="after")
    def _reason(self) -> "Source":
        if self.unlisted_test_mode != "mandatory_success" and not (self.unlisted_reason or "").strip():
            raise ValueError(f"unlisted_test_mode {self.unlisted_test_mode} needs an unlisted_reason")
        return self


class Suite(_Strict):
    """A suite file: its tiers, the dtypes the card supports with their tolerances, and its sources."""

    version: Literal[1] = Field(description="the format version (1)")
    name: str
    labels: list[Tier] = Field(min_length=1, description="the tiers this suite belongs to (smoke, full)")
    supported_dtypes: dict[DtypeName, Tolerance] = Field(
        min_length=1, description="dtypes the card runs, with their atol/rtol; tests of other dtypes are skipped "
        "unless an entry includes that dtype explicitly")
    sources: list[Source] = Field(min_length=1)


def json_schema() -> dict[str, Any]:
    schema = Suite.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "torch-spyre test suite"
    return schema


# --- loading with file and line in every error --------------------------------------------------------------
def _line_of(node: yaml.Node, loc: tuple) -> int:
    """The 1-based line of the YAML node at ``loc`` (pydantic's error location), or of its deepest parent."""
    line = node.start_mark.line + 1
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if k.value == key), None)
            if nxt is None:  # an unknown key: point at the key itself
                nxt = next((k for k, _ in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            nxt = node.value[key]
        else:
            nxt = None
        if nxt is None:
            break
        node, line = nxt, nxt.start_mark.line + 1
    return line


def load_suite(path: str | Path) -> Suite:
    """The suite in ``path``; :class:`SuiteError` (file, line, field, what is wrong) if it does not match."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SuiteError(f"{path}: cannot read the suite file ({e.strerror})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SuiteError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise SuiteError(f"{path}:1: a suite file is a mapping (version, name, labels, supported_dtypes, sources)")
    try:
        return Suite.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
            field = ".".join(str(x) for x in loc) or "(top level)"
            lines.append(f"{path}:{_line_of(node, loc)}: {field}: {err['msg']}")
        raise SuiteError("invalid suite file:\n" + "\n".join(lines)) from None


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2))

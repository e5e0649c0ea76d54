"""Inventories of the installed torch's tests and ops, and the tests to rerun after a torch upgrade.

An inventory (``spyre-tests inventory``) is JSON: the format and its version, the torch version, every test
id of the ``builtin:opinfo`` source with what it tests, every OpInfo entry with fingerprints of its sample
inputs, dtypes and decorators, and the schema of every ``aten`` op. Test ids come from
``opinfo_templates`` (no device tests are instantiated), so an inventory can be written for a torch release
torch_spyre does not run on yet.

:func:`select` compares two inventories. Selected are new tests, tests whose OpInfo entry changed (its
samples, dtypes, decorators or attributes) and tests of ops one of whose ``aten`` schemas changed, was
added or was removed. Committed inventories live in ``inventories/`` (gzipped JSON, package data).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from ..errors import SpyreError
from .._torch import testing as seam
from .opinfo_templates import DEVICE, DEVICE_DTYPES, TEMPLATE_CLASS, dtype_name, test_ids

FORMAT = "spyre-tests-inventory"
FORMAT_VERSION = 1
SHIPPED = Path(__file__).with_name("inventories")


class InventoryError(SpyreError, ValueError):
    """An inventory that cannot be used (unreadable, not an inventory, or of an unknown format version)."""


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _describe(x: Any) -> Any:
    """A sample argument's definition: tensors by dtype, shape and strides (their values are random)."""
    if isinstance(x, torch.Tensor):
        return ["tensor", dtype_name(x.dtype), list(x.shape), list(x.stride()), bool(x.requires_grad)]
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, [_describe(v) for v in x]]
    if isinstance(x, dict):
        return {str(k): _describe(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (int, float, bool, str, type(None))):
        return x
    return type(x).__name__ + ":" + str(x)[:80]


def _decorators(op) -> list[str]:
    """The op's decorators and skips that can apply to spyre's templates: a DecorateInfo aimed at another
    test class (TestCommon, ...) or another device (cuda, ...) never does, and its churn between releases
    must not select tests."""
    out = []
    for d in list(getattr(op, "decorators", ()) or ()) + list(getattr(op, "skips", ()) or ()):
        fields = [getattr(d, f, None) for f in ("cls_name", "test_name", "device_type", "dtypes")]
        if fields[0] not in (None, TEMPLATE_CLASS) or fields[2] not in (None, "privateuse1", DEVICE):
            continue
        inner = getattr(d, "decorators", None) or [d]
        names = [getattr(x, "__qualname__", getattr(x, "__name__", type(x).__name__)) for x in inner]
        out.append(json.dumps([names, fields], default=str))
    return sorted(out)


def _samples(op) -> dict[str, str]:
    """A fingerprint of the op's sample inputs per device dtype (None where the generator raises)."""
    out = {}
    for dtype in DEVICE_DTYPES:
        if dtype not in op.dtypes:
            continue
        torch.manual_seed(0)
        try:
            with seam.cheap_sample_tracking():
                samples = [_describe((s.input, s.args, s.kwargs)) for s in op.sample_inputs("cpu", dtype)]
            out[dtype_name(dtype)] = _digest(samples)
        except Exception as e:  # noqa: BLE001 - recorded: a generator that fails is part of its definition
            out[dtype_name(dtype)] = f"raises {type(e).__name__}"
    return out


def opinfo_entries() -> dict[str, dict]:
    out = {}
    for op in seam.opinfo_database():
        attrs = {"class": type(op).__name__, "aten_name": op.aten_name, "supports_out": bool(op.supports_out),
                 "supports_autograd": bool(op.supports_autograd),
                 "sample_inputs_func": getattr(op.sample_inputs_func, "__name__", "")}
        entry = {"aten_name": op.aten_name, "dtypes": sorted(dtype_name(d) for d in op.dtypes),
                 "decorators": _digest(_decorators(op)), "samples": _samples(op), "attributes": _digest(attrs)}
        entry["fingerprint"] = _digest(entry)
        out[op.full_name] = entry
    return out


def op_schemas() -> dict[str, str]:
    """``aten::name.overload`` -> its schema text."""
    out = {}
    for text in seam.all_op_schemas():
        name = text.split("(", 1)[0]
        if name.startswith("aten::"):
            out[name] = text
    return out


def build_inventory() -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "torch_version": torch.__version__,
            "tests": test_ids(), "opinfos": opinfo_entries(), "schemas": op_schemas()}


def load_inventory(path: str | Path) -> dict:
    """The inventory in ``path`` (JSON, or gzipped JSON ending in .gz); InventoryError if it is not one we read."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        data = json.loads(raw)
    except (OSError, ValueError) as e:
        raise InventoryError(f"{path}: not a readable inventory ({e}); write one with `spyre-tests inventory -o FILE`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InventoryError(f"{path}: not a spyre-tests inventory (no \"format\": \"{FORMAT}\")")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise InventoryError(f"{path}: inventory format version {version!r}, but this torch-spyre reads version "
                             f"{FORMAT_VERSION} only; write it again with this torch-spyre's `spyre-tests inventory`")
    return data


class Selection(set):
    """The selected test ids, with why each was selected (``reasons[id]``)."""

    def __init__(self):
        super().__init__()
        self.reasons: dict[str, str] = {}

    def add_reason(self, test_id: str, reason: str) -> None:
        if test_id not in self:
            self.add(test_id)
            self.reasons[test_id] = reason

    def counts(self) -> Counter:
        return Counter(r.split(":")[0] for r in self.reasons.values())


def _base_op(schema_name: str) -> str:
    """``aten::add_.Tensor`` -> ``add`` (the op an OpInfo's aten_name names)."""
    return schema_name.removeprefix("aten::").split(".")[0].rstrip("_")


def select(old: dict, new: dict) -> Selection:
    """The tests of ``new`` to run after moving from ``old``'s torch to ``new``'s."""
    chosen = Selection()
    changed_ops = {name for name, e in new["opinfos"].items()
                   if old["opinfos"].get(name, {}).get("fingerprint") != e["fingerprint"]}
    schema_changes = {n for n in set(old["schemas"]) | set(new["schemas"])
                      if old["schemas"].get(n) != new["schemas"].get(n)}
    changed_bases = {_base_op(n) for n in schema_changes}
    for test_id, t in sorted(new["tests"].items()):
        op = t.get("op")
        if test_id not in old["tests"]:
            chosen.add_reason(test_id, "new test")
        elif old["tests"][test_id] != t:
            chosen.add_reason(test_id, "changed test")
        elif op and op in changed_ops:
            chosen.add_reason(test_id, f"changed OpInfo: {op}")
        elif op and _base_op(new["opinfos"][op]["aten_name"]) in changed_bases:
            chosen.add_reason(test_id, f"changed schema: {new['opinfos'][op]['aten_name']}")
    return chosen

"""spyre-tests inventory and select: the inventory's content, the selection rules, bad inventories refused,
the committed inventories of two torch releases."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from torch_spyre.testing import inventory
from torch_spyre.testing.inventory import FORMAT, InventoryError, load_inventory, select


def _inv(**over):
    base = {"format": FORMAT, "format_version": 1, "torch_version": "x",
            "tests": {"t::add_f32": {"template": "compare_cpu", "op": "add", "dtype": "float32"},
                      "t::mul_f32": {"template": "compare_cpu", "op": "mul", "dtype": "float32"},
                      "t::sub_f32": {"template": "compare_cpu", "op": "sub", "dtype": "float32"},
                      "t::refused": {"template": "unsupported_dtype_refused", "op": None, "dtype": "float64"}},
            "opinfos": {n: {"aten_name": n, "fingerprint": n + "1"} for n in ("add", "mul", "sub")},
            "schemas": {"aten::add.Tensor": "aten::add.Tensor(Tensor self) -> Tensor",
                        "aten::mul.Tensor": "aten::mul.Tensor(Tensor self) -> Tensor",
                        "aten::sub.Tensor": "aten::sub.Tensor(Tensor self) -> Tensor"}}
    base.update(over)
    return base


def test_select_new_changed_and_ops_whose_opinfo_or_schema_changed():
    old = _inv()
    new = copy.deepcopy(old)
    assert select(old, new) == set()
    new["tests"]["t::div_f32"] = {"template": "compare_cpu", "op": "div", "dtype": "float32"}
    new["opinfos"]["div"] = {"aten_name": "div", "fingerprint": "d"}
    new["opinfos"]["mul"]["fingerprint"] = "mul2"
    new["schemas"]["aten::sub_.Scalar"] = "aten::sub_.Scalar(Tensor(a!) self, Scalar other) -> Tensor(a!)"
    new["tests"]["t::refused"] = {"template": "unsupported_dtype_refused", "op": None, "dtype": "complex64"}
    chosen = select(old, new)
    assert chosen.reasons == {"t::div_f32": "new test", "t::mul_f32": "changed OpInfo: mul",
                              "t::sub_f32": "changed schema: sub", "t::refused": "changed test"}
    assert chosen.counts() == {"new test": 1, "changed OpInfo": 1, "changed schema": 1, "changed test": 1}


def test_unknown_format_version_and_non_inventories_are_refused(tmp_path):
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(_inv(format_version=99)))
    with pytest.raises(InventoryError, match=r"format version 99, but this torch-spyre reads version 1 only"):
        load_inventory(path)
    path.write_text(json.dumps({"tests": {}}))
    with pytest.raises(InventoryError, match="not a spyre-tests inventory"):
        load_inventory(path)
    path.write_text("{not json")
    with pytest.raises(InventoryError, match="not a readable inventory"):
        load_inventory(path)
    gz = tmp_path / "inv.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(_inv()).encode()))
    assert load_inventory(gz)["torch_version"] == "x"


def test_select_command_prints_ids_and_the_count(tmp_path, capsys):
    from torch_spyre.testing.cli import main

    old, new = _inv(), _inv()
    new["opinfos"]["add"]["fingerprint"] = "changed"
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert main(["select", "--old", str(tmp_path / "old.json"), "--new", str(tmp_path / "new.json")]) == 0
    out = capsys.readouterr()
    assert out.out.split() == ["t::add_f32"]
    assert "selected 1 of 4 tests (1 changed OpInfo)" in out.err
    (tmp_path / "bad.json").write_text(json.dumps(_inv(format_version=0)))
    assert main(["select", "--old", str(tmp_path / "bad.json"), "--new", str(tmp_path / "new.json")]) == 2
    assert "format version 0" in capsys.readouterr().err


def test_the_committed_inventories_are_two_releases_made_by_this_tool():
    shipped = sorted(inventory.SHIPPED.glob("*.json.gz"))
    invs = [load_inventory(p) for p in shipped]
    versions = {i["torch_version"].split("+")[0] for i in invs}
    assert {"2.13.0", "2.14.1"} <= versions, versions
    for inv in invs:
        assert len(inv["tests"]) > 5000 and len(inv["opinfos"]) > 600 and len(inv["schemas"]) > 2000
        assert all(t["op"] is None or t["op"] in inv["opinfos"] for t in inv["tests"].values())
    old, new = sorted(invs, key=lambda i: i["torch_version"])
    chosen = select(old, new)
    assert 0 < len(chosen) < len(new["tests"])


@pytest.mark.slow
def test_the_inventory_names_the_tests_the_opinfo_source_instantiates(tmp_path):
    """opinfo_templates.test_ids (what the inventory lists, without the device) equals what instantiating
    the templates for spyre collects, with the same op and dtype for each test."""
    import sys

    from torch_spyre.testing.opinfo_templates import test_ids
    from torch_spyre.testing.runner import collect_source

    ids = test_ids()
    collected = collect_source({"source": "builtin:opinfo", "path": None}, tmp_path, sys.executable)
    assert {t.id for t in collected} == set(ids)
    for t in collected:
        assert (t.op, t.dtype) == ((ids[t.id]["op"] or "").replace(".", "_") or None, ids[t.id]["dtype"])

"""The builtin:module_info source: ModuleInfo templates for spyre through the runner."""

from __future__ import annotations

import sys
from xml.etree import ElementTree as ET

import pytest
import torch

from torch_spyre._torch import testing as seam
from torch_spyre.testing.module_templates import CLASS_NAME, spyre_module_infos, test_ids
from torch_spyre.testing.opinfo_templates import DEVICE_DTYPES

from .test_suites import _run_cli

SUITE = """\
version: 1
name: modules
labels: [smoke]
supported_dtypes:
  float32: {atol: 1.0e-3, rtol: 1.0e-3}
  float16: {atol: 2.0e-2, rtol: 2.0e-2}
sources:
  - source: builtin:module_info
    unlisted_test_mode: skip
    unlisted_reason: only the tests below
    tests:
      - name: test_compare_cpu_nn_Linear_spyre_(float32|float16)
        mode: mandatory_success
      - name: test_noncontiguous_nn_LayerNorm_spyre_float16
        mode: mandatory_success
      - name: test_backward_nn_Linear_spyre_float32
        mode: mandatory_success
      - name: test_compare_cpu_nn_BatchNorm1d_train_mode_spyre_float16
        mode: mandatory_success
"""


def test_module_infos_declare_the_cards_dtypes_without_changing_module_db():
    module_db = seam.module_database()
    infos = spyre_module_infos()
    assert [i.name for i in infos] == [m.name for m in module_db]
    assert all(i.dtypes == DEVICE_DTYPES for i in infos)
    assert all(torch.float64 in m.dtypes for m in module_db)  # the database itself is untouched


def test_module_test_ids_name_train_and_eval_modes_only_where_they_differ():
    ids = test_ids()
    assert f"builtin:module_info::{CLASS_NAME}.test_compare_cpu_nn_Linear_spyre_float16" in ids
    assert f"builtin:module_info::{CLASS_NAME}.test_backward_nn_BatchNorm1d_train_mode_spyre_bfloat16" in ids
    assert f"builtin:module_info::{CLASS_NAME}.test_backward_nn_BatchNorm1d_spyre_bfloat16" not in ids
    assert ids[f"builtin:module_info::{CLASS_NAME}.test_noncontiguous_nn_LSTM_eval_mode_spyre_float32"] == {
        "template": "noncontiguous", "module": "nn_LSTM_eval_mode", "dtype": "float32"}


@pytest.mark.slow
def test_the_module_source_collects_what_module_templates_lists(tmp_path):
    from torch_spyre.testing.runner import collect_source

    ids = test_ids()
    collected = collect_source({"source": "builtin:module_info", "path": None}, tmp_path, sys.executable)
    assert {t.id for t in collected} == set(ids)
    for t in collected:
        assert (t.op, t.dtype) == (ids[t.id]["module"], ids[t.id]["dtype"])


@pytest.mark.slow
def test_module_templates_run_forward_noncontiguous_backward_and_train_mode_against_the_cpu(tmp_path):
    (tmp_path / "modules.yaml").write_text(SUITE)
    junit = tmp_path / "out.xml"
    r = _run_cli(["run", "modules.yaml", "--junit", str(junit), "--jobs", "1"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    cases = {c.get("name"): c for s in ET.parse(junit).getroot() for c in s}
    ran = [n for n, c in cases.items() if len(c) == 0]  # passed: no <failure>/<skipped> child
    assert sorted(ran) == sorted([
        "test_compare_cpu_nn_Linear_spyre_float32", "test_compare_cpu_nn_Linear_spyre_float16",
        "test_noncontiguous_nn_LayerNorm_spyre_float16", "test_backward_nn_Linear_spyre_float32",
        "test_compare_cpu_nn_BatchNorm1d_train_mode_spyre_float16"]), r.stdout

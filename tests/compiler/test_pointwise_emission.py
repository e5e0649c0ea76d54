"""The pointwise generator's emission memos (issue 9 §3) change its host cost, never its programs.

Emission derives the same views, dtypes and spans once per box or value and keeps them (``Box.memo``,
the step's ``_views``, ``_value_memo``, ``sym._span_end``), places views with ``SpTensor.exact`` and
takes shortcuts for one-element boxes in ``access.py``. Here every memo is defeated (nothing is kept,
every answer derived again) and the programs must be the same, JSON for JSON.
"""

from __future__ import annotations

import numpy as np
import pytest

from torch_spyre.card import StickLayout, load_config
from torch_spyre.compiler import access
from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.pointwise import PointwiseGenerator, analysis, emit, sym
from torch_spyre.compiler.kernel_ir import KernelSpec, NodeSpec
from torch_spyre.program import SpTensor

from .test_pointwise import Ops, buf


def _padded_positions(batch=2, rows=10, data_rows=3, width=40):
    """A loop index used as data that is not affine in the loop variables (a box per element along x2),
    a guarded load, a cast into a 16-bit store."""
    o = Ops()
    keep = o("lt", o("index_expr", dtype="int64", index="x1"), o("constant", dtype="int64", value=data_rows), dtype="bool")
    x = o("load", buffer="a", index=f"{data_rows * width}*x0 + {width}*x1 + x2", guards=[keep])
    pos = o("sin", o("index_expr", index="x2*x2 + x1*x2"))
    zero = o("constant", value=0.0)
    val = o("where", keep, o("add", x, pos), zero)
    o("store", val, buffer="out", index=f"{rows * width}*x0 + {width}*x1 + x2")
    y = o("add", o("mul", val, o("load", buffer="w", index="x2")), o("constant", value=0.5))
    o("store", o("to_dtype", y, dtype="float16"), dtype="float16", buffer="out16", index=f"{rows * width}*x0 + {width}*x1 + x2")
    sizes = [batch, rows, width]
    return KernelSpec("k_pos", sizes, [], [NodeSpec("op0", sizes, [], "full", o.ops)],
                      [buf("a", [batch, data_rows, width], "input"), buf("w", [width], "input"),
                       buf("out", sizes, "output"), buf("out16", sizes, "output", "float16")])


def _weighted_row_reductions(rows=6, cols=70):
    """A sum weighted by a non-affine function of the reduction index (per-element boxes over r) and a max
    of the same rows."""
    o = Ops()
    x = o("load", buffer="a", index=f"{cols}*x0 + r0")
    o("store", o("reduction", o("mul", x, o("index_expr", index="r0*r0")), reduction="sum"), buffer="s", index="x0",
      reduction=True)
    o("store", o("reduction", x, reduction="max"), buffer="m", index="x0", reduction=True)
    return KernelSpec("k_wsum", [rows], [cols], [NodeSpec("op0", [rows], [cols], "reduction", o.ops)],
                      [buf("a", [rows, cols], "input"), buf("s", [rows], "output"), buf("m", [rows], "output")])


_DEVICE = {"float32": "float32", "float16": "dlfloat16"}


def _program(spec):
    places = {b.name: TensorView.whole(b.name, StickLayout(tuple(b.size), len(b.size) - 1, _DEVICE[b.dtype]), 0)
              for b in spec.buffers}
    return PointwiseGenerator(spec, places, load_config()).generate()


class _Forgetful(dict):
    """A memo that keeps nothing: every lookup misses."""

    def __setitem__(self, key, value):
        pass


@pytest.fixture
def no_memos(monkeypatch):
    """Every emission memo and shortcut defeated: answers derived each time they are asked."""
    real_box = analysis.KernelGen._box

    def forgetful_box(self, *args):
        box = real_box(self, *args)
        if box is not None:
            box.memo = _Forgetful()
        return box

    monkeypatch.setattr(analysis.KernelGen, "_box", forgetful_box)
    monkeypatch.setattr(analysis, "Box", _ForgetfulBox)  # boxes built elsewhere (a reduction's accumulator)
    monkeypatch.setattr(emit.Emitter, "view", emit.Emitter._view)
    monkeypatch.setattr(emit.Emitter, "_cast_alias", emit.Emitter._find_cast_alias)
    monkeypatch.setattr(emit.Emitter, "_sp_dtype_of", emit.Emitter._find_sp_dtype)
    monkeypatch.setattr(sym, "_span_end", sym._span_end.__wrapped__)
    monkeypatch.setattr(SpTensor, "exact", classmethod(lambda cls, *a: cls(*a)))  # the checked constructor


class _ForgetfulBox(analysis.Box):
    def __post_init__(self):
        self.memo = _Forgetful()


@pytest.mark.parametrize("make", [_padded_positions, _weighted_row_reductions])
def test_memos_do_not_change_programs(make, request):
    spec = make()
    fast = _program(spec)
    n = sum(len(v) for v in fast.cores.values())
    assert n > 100  # many small boxes: the memos are exercised
    request.getfixturevalue("no_memos")
    slow = _program(spec)
    assert fast.to_json() == slow.to_json()


def test_placed_views_hold_python_ints():
    """``SpTensor.exact`` keeps shapes and strides as given: the generator must give Python ints (what the
    checked constructor would have made of them)."""
    for spec in (_padded_positions(), _weighted_row_reductions()):
        for _, _, ins in _program(spec).instructions():
            for t in [getattr(ins, f, None) for f in ("out", "a", "b", "inp")] + list(getattr(ins, "inputs", ())):
                if isinstance(t, SpTensor):
                    assert all(type(x) is int for x in t.shape + t.strides), t


def test_one_element_shortcuts_agree_with_the_general_path():
    assert access.affine_strides(np.array([[[7]]])) == (7, (0, 0, 0))
    assert access.uniform_split(np.array([[np.nan]])) is None
    # A dim of size 1 splits into nothing; the other dims split as they do without it.
    row = (np.arange(96) // 32) * 64 + np.arange(96) % 32  # every other stick: (3 sticks, 32 lanes)
    assert access.choose_splits([row]) == {0: [32]}
    assert access.choose_splits([row.reshape(1, 96)]) == {1: [32]}
    assert access.choose_splits([row.reshape(1, 1, 96), row.reshape(1, 1, 96) + 5]) == {2: [32]}
    assert access.choose_splits([row.reshape(96, 1)[:1]]) == {}

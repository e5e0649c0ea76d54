"""codegen/pointwise without Inductor: hand-written KernelSpecs -> programs -> the simulated card.

Each test builds a :class:`KernelSpec` the way kernel_ir would, places its tensors in chosen stick
layouts, generates the program, prepares it (validation, timing) and launches it on a fresh card, then
compares with numpy. Bad input (no lowering, address span, scratchpad, dtype) raises clear errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from torch_spyre.card import Card, StickLayout, load_config
from torch_spyre.card.dlfloat16 import from_float32, to_float32
from torch_spyre.compiler.access import TensorView
from torch_spyre.compiler.codegen.pointwise import AddressSpanError, generate
from torch_spyre.compiler.kernel_ir import BufferSpec, KernelSpec, LoweringError, NodeSpec, Op, UnsupportedDtypeError
from torch_spyre.compiler.scratchpad import ScratchpadOverflowError
from torch_spyre.program import DmaLoad, Elementwise, Reduce
from torch_spyre.runtime.launch import launch, prepare

DT = {"float32": np.float32, "float16": np.float16}


class Ops:
    """A tiny builder of Op lists (ids in order)."""

    def __init__(self):
        self.ops: list[Op] = []

    def __call__(self, op, *args, dtype="float32", **attrs):
        self.ops.append(Op(len(self.ops), op, list(args), dtype, attrs))
        return len(self.ops) - 1


def run(spec: KernelSpec, inputs: dict, layouts: dict, offsets: dict | None = None, config=None):
    """Place ``inputs`` (numpy, host element space of each buffer) per ``layouts``; run; return outputs."""
    config = config or load_config()
    card = Card(0, config)
    offsets = offsets or {}
    places, allocs = {}, {}
    for b in spec.buffers:
        layout = layouts[b.name]
        alloc = card.memory.allocate(layout.nbytes)
        dev = alloc.view(layout.storage_dtype, 0, layout.device_numel)
        host = inputs.get(b.name, np.zeros(layout.numel, np.float32)).reshape(-1)
        enc = from_float32(host.astype(np.float32)) if layout.device_dtype == "dlfloat16" else host.astype(layout.storage_dtype)
        dev[:] = layout.pack(enc)
        places[b.name] = TensorView.whole(b.name, layout, offsets.get(b.name, 0))
        allocs[b.name] = alloc
    program = generate(spec, places, config)
    prepared = prepare(program, card)
    launch(prepared, allocs)
    out = {}
    for b in spec.buffers:
        layout = layouts[b.name]
        raw = layout.unpack(allocs[b.name].view(layout.storage_dtype, 0, layout.device_numel))
        out[b.name] = to_float32(raw) if layout.device_dtype == "dlfloat16" else raw
    return out, program


def buf(name, shape, role, dtype="float32", offset=0, stride=None):
    st = stride or list(np.cumprod([1] + list(shape[::-1]))[:-1][::-1])
    return BufferSpec(name, dtype, list(shape), [int(s) for s in st], offset, role)


def add_spec(shape, index_a="x0", index_b="x0", index_out="x0", dtype="float32"):
    o = Ops()
    a = o("load", dtype=dtype, buffer="a", index=index_a)
    b = o("load", dtype=dtype, buffer="b", index=index_b)
    s = o("add", a, b, dtype=dtype)
    o("store", s, dtype=dtype, buffer="out", index=index_out)
    n = NodeSpec("op0", list(shape), [], "full", o.ops)
    return KernelSpec("k_add", list(shape), [], [n], [buf("a", shape, "input", dtype), buf("b", shape, "input", dtype),
                                                       buf("out", shape, "output", dtype)])


def test_pointwise_add_many_cores():
    spec = add_spec([64 * 40], dtype="float32")
    a, b = np.random.randn(2560).astype(np.float32), np.random.randn(2560).astype(np.float32)
    lay = StickLayout((2560,), 0, "float32")
    out, program = run(spec, {"a": a, "b": b}, {"a": lay, "b": lay, "out": lay})
    np.testing.assert_allclose(out["out"], a + b, rtol=1e-6)
    assert len(program.cores) > 1  # work divided over cores in whole sticks
    d = program.metadata["decisions"]
    assert d["kind"] == "pointwise" and d["work_division"]["cores"] == len(program.cores)


def test_transposed_read_uses_stick_blocks():
    # out[i, j] = a[j, i] + b[i, j]: a is read across its sticks.
    n = 96
    spec = add_spec([n, n], index_a=f"{n}*x1 + x0", index_b=f"{n}*x0 + x1", index_out=f"{n}*x0 + x1")
    a, b = np.random.randn(n, n).astype(np.float32), np.random.randn(n, n).astype(np.float32)
    lay = StickLayout((n, n), 1, "float32")
    out, _ = run(spec, {"a": a, "b": b}, {"a": lay, "b": lay, "out": lay})
    np.testing.assert_allclose(out["out"].reshape(n, n), a.T + b, rtol=1e-6)


def test_broadcast_and_other_stick_dim_and_offset():
    # out[i, j] = a[i, j] (sticked on dim 0, read at an offset) + b[j] (broadcast over rows)
    rows, cols = 40, 70
    o = Ops()
    x = o("load", buffer="a", index=f"{cols}*x0 + x1")
    y = o("load", buffer="b", index="x1")
    o("store", o("mul", x, y), buffer="out", index=f"{cols}*x0 + x1")
    spec = KernelSpec("k_bc", [rows, cols], [], [NodeSpec("op0", [rows, cols], [], "full", o.ops)],
                      [buf("a", [rows, cols], "input"), buf("b", [cols], "input"), buf("out", [rows, cols], "output")])
    base = np.random.randn(rows * cols + 5).astype(np.float32)
    b = np.random.randn(cols).astype(np.float32)
    layouts = {"a": StickLayout((rows * cols + 5,), 0, "float32"), "b": StickLayout((cols,), 0, "float32"),
               "out": StickLayout((rows, cols), 0, "float32")}  # output sticked on rows
    out, _ = run(spec, {"a": base, "b": b}, layouts, offsets={"a": 5})
    np.testing.assert_allclose(out["out"].reshape(rows, cols), base[5:].reshape(rows, cols) * b, rtol=1e-6)


def _row_sum_spec(rows, cols, op="sum"):
    o = Ops()
    x = o("load", buffer="a", index=f"{cols}*x0 + r0")
    r = o("reduction", x, reduction=op)
    o("store", r, buffer="out", index="x0", reduction=True)
    return KernelSpec("k_red", [rows], [cols], [NodeSpec("op0", [rows], [cols], "reduction", o.ops)],
                      [buf("a", [rows, cols], "input"), buf("out", [rows], "output")])


@pytest.mark.parametrize("op,ref", [("sum", np.sum), ("max", np.max), ("min", np.min)])
def test_row_reduction(op, ref):
    a = np.random.randn(33, 300).astype(np.float32)
    spec = _row_sum_spec(33, 300, op)
    out, program = run(spec, {"a": a}, {"a": StickLayout((33, 300), 1, "float32"), "out": StickLayout((33,), 0, "float32")})
    np.testing.assert_allclose(out["out"], ref(a, axis=1), rtol=1e-5, atol=1e-5)
    assert any(isinstance(i, Reduce) for _, _, i in program.instructions())


def test_reduction_chunks_when_rows_do_not_fit():
    cfg = load_config(scratchpad_plannable_bytes=64 * 1024)
    a = np.random.randn(3, 40_000).astype(np.float32)
    out, program = run(_row_sum_spec(3, 40_000), {"a": a},
                       {"a": StickLayout((3, 40_000), 1, "float32"), "out": StickLayout((3,), 0, "float32")}, config=cfg)
    np.testing.assert_allclose(out["out"], a.sum(1), rtol=1e-4, atol=1e-2)
    d = program.metadata["decisions"]
    assert d["tiling"]["persistent_reduction"] is False
    assert d["scratchpad"]["peak_bytes"] <= 64 * 1024
    assert d["overlap"]["double_buffered"]


def test_fp16_rounds_to_dlfloat16_on_store():
    spec = add_spec([128], dtype="float16")
    a = np.random.randn(128).astype(np.float32)
    lay = StickLayout((128,), 0, "dlfloat16")
    out, _ = run(spec, {"a": a, "b": a}, {"a": lay, "b": lay, "out": lay})
    expect = to_float32(from_float32(to_float32(from_float32(a)) * 2))
    np.testing.assert_array_equal(out["out"], expect)


def test_masked_load_is_split_into_boxes():
    # cat([a, b]) along the only dim: masks decide per box which input is read.
    o = Ops()
    i = o("index_expr", dtype="int64", index="x0")
    c = o("constant", dtype="int64", value=50)
    m = o("lt", i, c, dtype="bool")
    la = o("load", buffer="a", index="x0", guards=[m])
    m2 = o("ge", i, c, dtype="bool")
    lb = o("load", buffer="b", index="x0 - 50", guards=[m2])
    z = o("constant", value=0.0)
    w1 = o("where", m, la, z)
    w2 = o("where", m2, lb, z)
    o("store", o("where", m, w1, w2), buffer="out", index="x0")
    spec = KernelSpec("k_cat", [120], [], [NodeSpec("op0", [120], [], "full", o.ops)],
                      [buf("a", [50], "input"), buf("b", [70], "input"), buf("out", [120], "output")])
    a, b = np.random.randn(50).astype(np.float32), np.random.randn(70).astype(np.float32)
    out, _ = run(spec, {"a": a, "b": b}, {"a": StickLayout((50,), 0, "float32"), "b": StickLayout((70,), 0, "float32"),
                                          "out": StickLayout((120,), 0, "float32")})
    np.testing.assert_array_equal(out["out"], np.concatenate([a, b]))


def _cat_rows(o, idx, guards):
    """Ops of row x0 of cat([cls, patches.T]) at column ``idx``, as Inductor writes them in each node:
    the node's own index values and masks (``guards``: "one" mask per input, or the patches' mask "split"
    in two, whose conjunction is the same)."""
    i = o("index_expr", dtype="int64", index="x0")
    first = o("lt", i, o("constant", dtype="int64", value=1), dtype="bool")
    rest = o("ge", i, o("constant", dtype="int64", value=1), dtype="bool")
    rest_guards = [rest]
    if guards == "split":
        rest_guards.append(o("lt", i, o("constant", dtype="int64", value=17), dtype="bool"))
    zero = o("constant", value=0.0)
    cls = o("where", first, o("load", buffer="cls", index=idx, guards=[first]), zero)
    patch = o("load", buffer="patches", index=f"16*{idx} + ((x0 - 1))", guards=rest_guards)
    return o("where", first, cls, o("where", rest, patch, zero))


@pytest.mark.parametrize("guards", ["one", "split"])
def test_cat_read_again_after_its_reduction(guards):
    # ViT's embeddings into a centring (LayerNorm's first half): the row sum of the cat is stored to an
    # internal buffer by one node and read by the next, which reads the cat again. The generator merges the
    # second node's loads into the first's; the second node's masks must follow them (mapped onto the first
    # node's equal masks, or the loads stay apart), or its where keeps the other node's complementary guards
    # and the whole output folds to zeros.
    o = Ops()
    o("store", o("reduction", _cat_rows(o, "r0", "one"), reduction="sum"), buffer="buf0", index="x0", reduction=True)
    n0 = NodeSpec("op0", [17], [64], "reduction", o.ops)
    o = Ops()
    e = _cat_rows(o, "x1", guards)
    mean = o("truediv", o("load", buffer="buf0", index="x0"), o("constant", value=64.0))
    o("store", o("sub", e, mean), buffer="out", index="64*x0 + x1")
    n1 = NodeSpec("op1", [17, 64], [], "full", o.ops)
    spec = KernelSpec("k_cat_centre", [17], [64], [n0, n1],
                      [buf("cls", [64], "input"), buf("patches", [64, 16], "input"), buf("out", [17, 64], "output")],
                      internal=["buf0"])
    rng = np.random.default_rng(0)
    cls, patches = rng.standard_normal(64).astype(np.float32), rng.standard_normal((64, 16)).astype(np.float32)
    out, _ = run(spec, {"cls": cls, "patches": patches},
                 {"cls": StickLayout((64,), 0, "float32"), "patches": StickLayout((64, 16), 1, "float32"),
                  "out": StickLayout((17, 64), 1, "float32")})
    e = np.concatenate([cls[None], patches.T])
    np.testing.assert_allclose(out["out"].reshape(17, 64), e - e.mean(1, keepdims=True), atol=1e-5, rtol=1e-5)


def test_scratchpad_that_cannot_fit_is_a_clear_error():
    cfg = load_config(scratchpad_plannable_bytes=128)
    with pytest.raises(ScratchpadOverflowError, match="plannable"):
        run(add_spec([4096]), {}, {k: StickLayout((4096,), 0, "float32") for k in ("a", "b", "out")}, config=cfg)


def test_address_span_is_a_clear_error():
    # One core would reach 3 x 2 MiB of device memory; this card lets a core address 1 MiB.
    n = 1 << 19
    lay = StickLayout((n,), 0, "float32")
    cfg = load_config(core_address_span_bytes=1 << 20, num_cores=1)
    with pytest.raises(AddressSpanError, match="core_address_span_bytes"):
        run(add_spec([n]), {}, {"a": lay, "b": lay, "out": lay}, config=cfg)


def test_float64_is_a_clear_error():
    with pytest.raises(UnsupportedDtypeError, match="Spyre card cannot compute in"):
        spec = add_spec([64], dtype="float64")
        lay = StickLayout((64,), 0, "float32")
        run(spec, {}, {"a": lay, "b": lay, "out": lay})


def test_every_instruction_kind_is_used_sensibly():
    spec = add_spec([256], dtype="float32")
    lay = StickLayout((256,), 0, "float32")
    _, program = run(spec, {}, {"a": lay, "b": lay, "out": lay})
    kinds = {type(i) for _, _, i in program.instructions()}
    assert DmaLoad in kinds and Elementwise in kinds

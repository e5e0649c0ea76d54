"""Loop indices used as data (Inductor's ``index_expr`` under arithmetic: ``arange * 0.5``, sinusoidal
positions) are computed on the card from the core's iota, over whole boxes (issue 9 §3).

Before, the pointwise generator evaluated them itself and needed them constant within a box, so every
element was its own box (pegasus_x's positions: 2,292,182 instructions). Here: results against numpy or
the CPU, exact for integers (int64 past 2**24 too), and instruction counts far below one box per element.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_spyre
from torch_spyre.card import StickLayout
from torch_spyre.compiler import debug
from torch_spyre.compiler.kernel_ir import KernelSpec, NodeSpec
from torch_spyre.program import Elementwise

from .spyre_compile_helpers import fresh, run_compiled
from .test_pointwise import Ops, buf, run


def _count(program) -> int:
    return sum(len(v) for v in program.cores.values())


def _index_spec(index: str, sizes: list[int], dtype: str = "int64", scale: float | None = None):
    """out[x] = index(x) (times ``scale``), stored in ``dtype``."""
    o = Ops()
    i = o("index_expr", dtype=dtype, index=index)
    if scale is not None:
        i = o("mul", i, o("constant", dtype=dtype, value=scale), dtype=dtype)
    st = " + ".join(f"{int(np.prod(sizes[d + 1:]))}*x{d}" for d in range(len(sizes)))
    o("store", i, dtype=dtype, buffer="out", index=st)
    return KernelSpec("k_index", sizes, [], [NodeSpec("op0", sizes, [], "full", o.ops)],
                      [buf("out", sizes, "output", dtype)])


def _run_index(spec, dtype: str):
    sizes = spec.x_sizes
    out, program = run(spec, {}, {"out": StickLayout(tuple(sizes), len(sizes) - 1, dtype)})
    return out["out"].reshape(sizes), program


@pytest.mark.parametrize("index, expect", [
    ("x1", lambda r, c: np.broadcast_to(np.arange(c), (r, c))),
    ("300*x0 + x1", lambda r, c: np.arange(r * c).reshape(r, c)),
    ("299 - x1 + 7*x0", lambda r, c: 299 - np.arange(c)[None, :] + 7 * np.arange(r)[:, None]),  # a negative stride
    ("4096*x0 + 3*x1", lambda r, c: 4096 * np.arange(r)[:, None] + 3 * np.arange(c)[None, :]),  # sparse strides
])
def test_affine_index_is_one_box_per_region(index, expect):
    rows, cols = 6, 300
    got, program = _run_index(_index_spec(index, [rows, cols]), "int64")
    np.testing.assert_array_equal(got, expect(rows, cols))
    # one box per element would be rows * cols instructions at least; the iota costs log2(cols) per core
    assert _count(program) < rows * cols // 4, _count(program)


def test_int64_index_past_two_to_the_24_is_exact():
    base = (1 << 24) - 100
    got, _ = _run_index(_index_spec(f"x0 + {base}", [1000]), "int64")
    np.testing.assert_array_equal(got, np.arange(base, base + 1000))
    # cast to float32 like torch's arange(...).float(): rounded once, from the exact integer
    got, _ = _run_index(_index_spec(f"3*x0 + {base}", [1000], dtype="float32"), "float32")
    np.testing.assert_array_equal(got, (np.arange(1000, dtype=np.int64) * 3 + base).astype(np.float32))


def test_index_that_is_not_affine_keeps_working():
    got, program = _run_index(_index_spec("x0*x0", [200]), "int64")
    np.testing.assert_array_equal(got, np.arange(200) ** 2)


def test_scaled_index_in_float():
    got, _ = _run_index(_index_spec("x1", [4, 300], dtype="float32", scale=0.5), "float32")
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(300, dtype=np.float32) * 0.5, (4, 300)))


def _padded_positions_spec(seq: int, width: int, total: int):
    """out[s, j] = x[s, j] + (sin(s * f(j)) if j < width else 0), with f(j) = 10000 ** (-j / width):
    sinusoidal positions padded with zeros (``constant_pad_nd``), as Inductor writes them."""
    o = Ops()
    keep = o("lt", o("index_expr", dtype="int64", index="x1"), o("constant", dtype="int64", value=width), dtype="bool")
    freq = o("reciprocal", o("pow", o("constant", value=10000.0),
                             o("mul", o("index_expr", index="x1"), o("constant", value=1.0 / width))))
    pos = o("sin", o("mul", o("index_expr", index="x0"), freq))
    val = o("where", keep, pos, o("constant", value=0.0))
    x = o("load", buffer="x", index=f"{total}*x0 + x1")
    o("store", o("add", val, x), buffer="out", index=f"{total}*x0 + x1")
    sizes = [seq, total]
    return KernelSpec("k_pos", sizes, [], [NodeSpec("op0", sizes, [], "full", o.ops)],
                      [buf("x", sizes, "input"), buf("out", sizes, "output")])


def test_padded_positions_compute_nothing_in_the_padding():
    seq, width, total = 64, 64, 512
    spec = _padded_positions_spec(seq, width, total)
    x = np.random.randn(seq, total).astype(np.float32)
    lay = StickLayout((seq, total), 1, "float32")
    out, program = run(spec, {"x": x}, {"x": lay, "out": lay})
    j = np.arange(total, dtype=np.float32)
    pos = np.where(j < width, np.sin(np.arange(seq, dtype=np.float32)[:, None]
                                     * (1.0 / 10000.0 ** (j * np.float32(1.0 / width)))), 0.0)
    np.testing.assert_allclose(out["out"].reshape(seq, total), x + pos, rtol=1e-5, atol=1e-5)
    assert _count(program) < seq * width // 4, _count(program)  # per element: at least seq * width
    sines = [i for _, _, i in program.instructions() if isinstance(i, Elementwise) and i.op == "sin"]
    assert sum(int(np.prod(i.out.shape)) for i in sines) == seq * width  # the padding computes no sine


@pytest.fixture
def programs(monkeypatch):
    """The programs the compiled kernels run, by kernel name."""
    seen: dict = {}
    real = debug.dump_kernel

    def spy(spec, program):
        seen[spec.name] = program
        return real(spec, program)

    monkeypatch.setattr(debug, "dump_kernel", spy)
    return seen


def _sinusoidal(x):
    seq, dim = x.shape[0], 64
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angle = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * inv
    pos = torch.cat([torch.sin(angle), torch.cos(angle)], -1)
    return F.pad(pos, (0, x.shape[1] - dim)) + x


def _randn(*shape):
    """Inputs fixed by a seed: parametrize builds them at collection, after whatever ran before."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


@pytest.mark.parametrize("fn, x, bound", [
    (lambda x: x + torch.arange(x.shape[-1], device=x.device) * 0.5, _randn(4, 300), 300),
    (_sinusoidal, _randn(64, 512), 64 * 64),
    # an index after a reduction (outer values) and one inside it (weights over the reduced dim)
    (lambda x: x.sum(-1) + torch.arange(x.shape[0], device=x.device) * 0.5, _randn(64, 300), None),
    (lambda x: (x * torch.arange(x.shape[-1], device=x.device)).sum(-1), _randn(8, 3000), None),
])
def test_compiled_index_data_matches_cpu(fn, x, bound, programs):
    got = run_compiled(fn, x)
    # rtol 1e-4: the reductions sum up to 3,000 fp32 terms in another order than the CPU (sums near 1e3
    # differ by ~1e-2 there)
    torch.testing.assert_close(got, fn(x), rtol=1e-4, atol=1e-3)
    assert programs
    for name, program in programs.items() if bound else ():
        assert _count(program) < bound // 4, (name, _count(program))  # one box per element: >= bound


def test_large_arange_is_one_fused_kernel():
    """An arange over 256k elements added to a tensor: with a box per element the fused kernel was refused
    (more than 4096 boxes per tile) and its ops ran as eager ops."""
    fn = lambda x: x + torch.arange(x.numel(), device=x.device).reshape(x.shape)  # noqa: E731
    x = torch.randn(256, 1024)
    fresh()
    got = torch.compile(fn)(x.to("spyre")).cpu()
    assert not torch_spyre.fallback_stats().compile_fallbacks
    torch.testing.assert_close(got, fn(x), rtol=0, atol=0)


def test_reduction_index_in_chunks():
    """A sum weighted by the reduction index over rows too long for the scratchpad: each reduction chunk
    reads the index from its own first position on."""
    from torch_spyre.card import load_config

    rows, cols = 3, 40_000
    o = Ops()
    x = o("load", buffer="a", index=f"{cols}*x0 + r0")
    w = o("mul", o("index_expr", dtype="float32", index="r0"), o("constant", value=1.0 / cols))
    o("store", o("reduction", o("mul", x, w), reduction="sum"), buffer="out", index="x0", reduction=True)
    spec = KernelSpec("k_wsum", [rows], [cols], [NodeSpec("op0", [rows], [cols], "reduction", o.ops)],
                      [buf("a", [rows, cols], "input"), buf("out", [rows], "output")])
    a = np.random.randn(rows, cols).astype(np.float32)
    out, program = run(spec, {"a": a}, {"a": StickLayout((rows, cols), 1, "float32"),
                                        "out": StickLayout((rows,), 0, "float32")},
                       config=load_config(scratchpad_plannable_bytes=64 * 1024))
    assert program.metadata["decisions"]["tiling"]["persistent_reduction"] is False
    weights = np.arange(cols, dtype=np.float32) * np.float32(1.0 / cols)
    np.testing.assert_allclose(out["out"], (a * weights).sum(1), rtol=1e-4, atol=1e-2)
    assert _count(program) < cols // 4, _count(program)

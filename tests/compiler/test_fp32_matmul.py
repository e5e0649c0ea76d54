"""fp32 matmuls honour ``torch.get_float32_matmul_precision()`` (compiler/fp32_matmul.py): "highest" (the
default) is fp32-accurate through six 16-bit passes, one matmul kernel over the parts concatenated along
K; "high"/"medium" take one pass on operands rounded to DLFloat16. The passes are PE work on the card,
so the simulated time says what accuracy costs."""

from __future__ import annotations

import re

import pytest
import torch

import torch_spyre.profiler
from torch_spyre.card import dlfloat16
from torch_spyre.compiler import eager

from .spyre_compile_helpers import fresh


@pytest.fixture(autouse=True)
def _restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


CASES = {
    "mm": (lambda a, b: a @ b, [(48, 96), (96, 40)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(3, 16, 72), (3, 72, 24)]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=2.0, alpha=0.5), [(40,), (48, 96), (96, 40)]),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), [(3, 16, 24), (3, 16, 72), (3, 72, 24)]),
    "linear": (lambda x, w, b: torch.nn.functional.linear(x, w, b), [(2, 8, 64), (32, 64), (32,)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_highest_is_fp32_accurate_compiled(name):
    fn, shapes = CASES[name]
    args = _inputs(*shapes)
    fresh()
    out = torch.compile(fn)(*[a.to("spyre") for a in args]).cpu()
    torch.testing.assert_close(out, fn(*args))  # fp32 tolerances (rtol 1.3e-6, atol 1e-5)


def test_precision_high_rounds_operands_once_and_is_only_16_bit_accurate():
    fn, shapes = CASES["mm"]
    args = _inputs(*shapes)
    exact = fn(*[a.double() for a in args])
    torch.set_float32_matmul_precision("high")
    fresh()
    out = torch.compile(fn)(*[a.to("spyre") for a in args]).cpu()
    error = (out.double() - exact).abs().max().item()
    assert 1e-3 < error < 0.1  # 16-bit products: far from fp32, within DLFloat16 tolerance
    rounded = [torch.from_numpy(dlfloat16.round_float32(a.numpy())) for a in args]  # as the PE arrays read them
    torch.testing.assert_close(out, fn(*rounded))


def _matmul_kernels(fn, args):
    fresh()
    compiled = torch.compile(fn)
    compiled(*args)
    with torch_spyre.profiler.profile() as prof:
        compiled(*args)
    return [r for r in prof.events() if r.kind == "kernel" and re.fullmatch(r"spyre_(b?mm|addmm|baddbmm)_\d+", r.name)]


def test_highest_is_one_kernel_doing_six_passes_of_pe_work():
    """The six part products are one matmul over K six times as long (each pass's K padded to whole
    sticks: 96 -> 128): one launch, six passes of PE work in the timing model."""
    fn, shapes = CASES["mm"]
    args = [a.to("spyre") for a in _inputs(*shapes)]
    torch.set_float32_matmul_precision("high")
    one = _matmul_kernels(fn, args)
    torch.set_float32_matmul_precision("highest")
    six = _matmul_kernels(fn, args)
    assert len(one) == 1 and len(six) == 1
    (m, k), (_, n) = shapes
    assert one[0].details["timing"].pe_flops == 2 * m * k * n
    assert six[0].details["timing"].pe_flops == 6 * 2 * m * 128 * n
    assert six[0].duration > one[0].duration


def test_fp16_matmul_ignores_the_fp32_setting():
    fn, shapes = CASES["mm"]
    args = [a.half().to("spyre") for a in _inputs(*shapes)]
    outs = []
    for precision in ("highest", "medium"):
        torch.set_float32_matmul_precision(precision)
        outs.append(_matmul_kernels(fn, args))
        assert len(outs[-1]) == 1


def test_eager_op_follows_the_precision_set_between_calls(monkeypatch):
    """The eager program cache keys on the precision: the same op compiles again when it changes."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "compile")
    a, b = _inputs((32, 64), (64, 16))
    exact = a.double() @ b.double()
    da, db = a.to("spyre"), b.to("spyre")
    eager.reset_cache()
    torch.set_float32_matmul_precision("medium")
    coarse = (da @ db).cpu()
    torch.set_float32_matmul_precision("highest")
    fine = (da @ db).cpu()
    assert (fine.double() - exact).abs().max() < 1e-4 < (coarse.double() - exact).abs().max()
    torch.testing.assert_close(fine, a @ b)


@pytest.mark.parametrize("name", ["addmm", "baddbmm", "linear"])
def test_highest_fast_executor_gives_the_checked_bits(name, monkeypatch):
    """The K-concatenated programs (the parts' kernels, the long-K matmul) run fast after their first,
    checked launch; TORCH_SPYRE_CHECK=compare runs them both ways and raises on any differing byte."""
    fn, shapes = CASES[name]
    args = [a.to("spyre") for a in _inputs(*shapes, seed=3)]
    fresh()
    compiled = torch.compile(fn)
    first = compiled(*args).cpu()  # each program's first launch: checked
    monkeypatch.setenv("TORCH_SPYRE_CHECK", "compare")
    second = compiled(*args).cpu()  # fast and checked, compared byte for byte
    assert torch.equal(first, second)
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "compile")
    eager.reset_cache()
    monkeypatch.setenv("TORCH_SPYRE_CHECK", "0")
    first = fn(*args).cpu()
    monkeypatch.setenv("TORCH_SPYRE_CHECK", "compare")
    torch.testing.assert_close(fn(*args).cpu(), first, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mm", "linear"])  # linear: an addmm through the epilogue rewrite
def test_decisions_say_why_k_is_six_times_longer(name, tmp_path, monkeypatch):
    """An fp32 kernel's K is the parts concatenated: its decisions say so, with the precision."""
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    fn, shapes = CASES[name]
    fresh()
    torch.compile(fn)(*[a.to("spyre") for a in _inputs(*shapes)])
    texts = [p.read_text() for p in tmp_path.glob("*.decisions.txt")]
    matmul = [t for t in texts if "fp32 operands as DLFloat16 parts" in t]
    assert len(matmul) == 1 and "6 pass(es)" in matmul[0] and "'highest'" in matmul[0]


@pytest.mark.parametrize("mode", ["compiled", "eager"])
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_operands_outside_dlfloat16_range_give_nan_rows_and_leave_the_others_right(mode, precision):
    """An fp32 operand element that DLFloat16 cannot hold (inf, or a magnitude above ~8.573e9) has the
    special code (NaN and infinity, read as NaN) as its high part: the rows it enters are NaN, at every
    precision (docs/compiler.md "fp32 matmul precision"); the CPU gives +-inf or a finite value there. The
    other rows are untouched."""
    torch.set_float32_matmul_precision(precision)
    a, b = _inputs((64, 64), (64, 48))
    bad = [3, 7, 9]
    a[3, 5], a[7, 1], a[9, 2] = float("inf"), -1e12, torch.finfo(torch.float32).min
    fresh()
    fn = torch.compile(lambda x, y: x @ y) if mode == "compiled" else (lambda x, y: x @ y)
    out, ref = fn(a.to("spyre"), b.to("spyre")).cpu(), a @ b
    assert bool(torch.isnan(out[bad]).all()) and not bool(torch.isnan(ref).any())
    good = [r for r in range(64) if r not in bad]
    tol = {} if precision == "highest" else {"rtol": 2e-2, "atol": 5e-2}
    torch.testing.assert_close(out[good], ref[good], **tol)

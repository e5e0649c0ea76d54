"""A Tensor operator whose result the card cannot hold (``x * s`` with an int32 spyre ``x`` and a float64
0-dim CPU ``s``: float64 by type promotion, as on the CPU) fails with the card's message, not Python's
"unsupported operand type(s)": torch's operators turn a TypeError raised inside them into NotImplemented,
which is why the device's UnsupportedDtypeError is a RuntimeError (device/dtypes.py)."""

from __future__ import annotations

import pytest
import torch

from torch_spyre.device.dtypes import UnsupportedDtypeError
from torch_spyre.testing.card_inputs import refused

S = 2.5  # the float64 operand's value


def _imul(a, b):
    a *= b


def _itruediv(a, b):
    a /= b


def _ipow(a, b):
    a **= b


# name -> the operator form, with the spyre operand first and the float64 one second
OPERATORS = {
    "x * s": lambda x, s: x * s,
    "s * x": lambda x, s: s * x,
    "x + s": lambda x, s: x + s,
    "s + x": lambda x, s: s + x,
    "x - s": lambda x, s: x - s,
    "s - x": lambda x, s: s - x,  # Tensor.__rsub__ (torch/_tensor.py) when s is a Python float
    "x / s": lambda x, s: x / s,
    "s / x": lambda x, s: s / x,
    "x ** s": lambda x, s: x ** s,  # Tensor.__pow__, a torch/_tensor.py wrapper
    "s ** x": lambda x, s: s ** x,
    "x // s": lambda x, s: x // s,
    "x % s": lambda x, s: x % s,
}


def _spyre_int():
    return torch.arange(1, 5, dtype=torch.int32).to("spyre")


def _check_refused(run, x, s, settled):
    base = settled()
    with pytest.raises(UnsupportedDtypeError) as info:
        run(x, s)
    message = str(info.value)
    assert "cannot hold float64" in message and "s.to(torch.float32)" in message
    assert isinstance(info.value, RuntimeError) and refused(info.value)  # the templates count it as a skip
    assert settled() == base  # refused before anything was stored


@pytest.mark.parametrize("mode", ["host", "compile"])
@pytest.mark.parametrize("name", list(OPERATORS))
def test_an_int_operand_and_a_float64_0dim_cpu_tensor(name, mode, monkeypatch, settled):
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    run, x, s = OPERATORS[name], _spyre_int(), torch.tensor(S, dtype=torch.float64)
    assert run(x.cpu(), s).dtype == torch.float64  # what the CPU computes
    _check_refused(run, x, s, settled)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_a_python_float_under_float64_default_dtype(name, settled):
    run, x = OPERATORS[name], _spyre_int()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert run(x.cpu(), S).dtype == torch.float64
        _check_refused(run, x, S, settled)
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_results_the_card_holds_still_compute(name):
    """A float32 spyre tensor with a float64 0-dim CPU tensor is float32 (the dimensioned operand's dtype)."""
    run, x, s = OPERATORS[name], torch.arange(1.0, 5.0).to("spyre"), torch.tensor(S, dtype=torch.float64)
    out, want = run(x, s), run(x.cpu(), s)
    assert out.device.type == "spyre" and out.dtype == want.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), want)


@pytest.mark.parametrize("op", [_imul, _itruediv, _ipow], ids=["*=", "/=", "**="])
def test_in_place_operators(op, settled):
    """``x *= s`` into an int32 tensor is refused as on the CPU (the result cannot be cast back), leaving
    ``x`` as it was; into a float32 one it computes in float32."""
    s = torch.tensor(S, dtype=torch.float64)
    cpu = torch.arange(1, 5, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="can't be cast") as on_cpu:
        op(cpu.clone(), s)
    x = _spyre_int()
    base = settled()
    with pytest.raises(RuntimeError, match="can't be cast") as on_card:
        op(x, s)
    assert str(on_card.value) == str(on_cpu.value)
    assert settled() == base and x.cpu().equal(cpu)
    xf, want = torch.arange(1.0, 5.0).to("spyre"), torch.arange(1.0, 5.0)
    op(xf, s)
    op(want, s)
    assert xf.dtype == torch.float32
    torch.testing.assert_close(xf.cpu(), want)


def test_a_complex_result_names_complex64(settled):
    base = settled()
    with pytest.raises(UnsupportedDtypeError, match=r"cannot hold complex64.*two float32 tensors"):
        _spyre_int() * 1j
    assert settled() == base


def test_the_function_forms_give_the_same_error():
    x, s = _spyre_int(), torch.tensor(S, dtype=torch.float64)
    for request in (lambda: torch.mul(x, s), lambda: x.mul(s), lambda: x.to(torch.float64),
                    lambda: s.to("spyre"), lambda: torch.ones(2, dtype=torch.float64, device="spyre")):
        with pytest.raises(UnsupportedDtypeError, match=r"cannot hold float64.*x\.to\(torch\.float32\)") as info:
            request()
        assert refused(info.value)


def test_compiled_operator_form_names_float64_and_float32(monkeypatch):
    """Compiled, the graph's mul is refused while Dynamo traces it (wrapped in its errors): the message names
    both dtypes."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "compile")
    torch.compiler.reset()
    fn = torch.compile(lambda a, b: a * b)
    with pytest.raises(Exception, match=r"cannot hold float64.*s\.to\(torch\.float32\)") as info:
        fn(_spyre_int(), torch.tensor(S, dtype=torch.float64))
    assert refused(info.value)

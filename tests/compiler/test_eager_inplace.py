"""In-place eager ops (``x.add_(y)`` reaches ``add.out(x, y, out=x)``): the written view is one program input.

Passed twice, the two aliasing inputs (one mutated) made aot_autograd build a "synthetic base" at trace time
from the fake placeholders (no ``_base``: a 1-d tensor over the whole storage) and at run time from the real
tensors (a row view's ``_base``, 2-d): the compiled graph's input check failed and the op went to the host.
"""

from __future__ import annotations

import pytest
import torch

import torch_spyre
from torch_spyre.compiler import eager, wrapper
from torch_spyre.device.op_call import op_info
from torch_spyre.device.storage import allocation_of

from .spyre_compile_helpers import eager_compile_mode


@pytest.fixture(autouse=True)
def compile_mode(monkeypatch):
    eager_compile_mode(monkeypatch, fresh_cache=True)
    yield


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _on_card_only():
    assert torch_spyre.fallback_stats().host == {} and wrapper.host_fallback_stats() == {}, \
        (torch_spyre.fallback_stats().host, eager.host_reasons())


def _twice(fn, *cpu):
    """``fn`` on spyre copies of ``cpu`` twice (a compile, then a cache hit), each matched against the CPU."""
    dev = [t.to("spyre") for t in cpu]
    before = eager.cache_stats()
    for _ in range(2):
        fn(*dev)
        fn(*cpu)
        for d, c in zip(dev, cpu):
            torch.testing.assert_close(d.cpu(), c, rtol=1e-5, atol=1e-5)
    after = eager.cache_stats()
    assert (after["compiles"] - before["compiles"], after["hits"] - before["hits"]) == (1, 1), after
    _on_card_only()
    return dev


def test_the_written_view_is_one_program_input():
    x, y = _x(64).to("spyre"), _x(64, seed=1).to("spyre")
    op = torch.ops.aten.add.out
    _, tensors = eager.one_op_function(op, op_info(op), (x, y), {"out": x})
    assert len(tensors) == 2 and tensors[0] is x and tensors[1] is y
    _, tensors = eager.one_op_function(op, op_info(op), (x, x), {"out": x})  # x.add_(x)
    assert len(tensors) == 1
    _, tensors = eager.one_op_function(op, op_info(op), (y, y), {"out": x})  # only written storages merge
    assert len(tensors) == 3


@pytest.mark.parametrize("n", [64, 100, 128, 4096])
def test_in_place_ops_on_1d_tensors(n):
    r = _twice(lambda c: c.mul_(3), _x(n))
    _twice(lambda c: c.add_(1), _x(n, seed=2))
    x = r[0]
    assert x.mul_(2) is x  # the result is the argument itself


@pytest.mark.parametrize("shape, index", [((64, 64), (3,)), ((4, 8, 64), (1, 2))])
def test_in_place_op_on_a_row_view_leaves_its_neighbours(shape, index):
    xc, zc = _x(*shape), _x(64, seed=1)
    before = xc.clone()
    x, _ = _twice(lambda x, z: x[index].add_(z), xc, zc)
    # Only the row changed (twice), the rest as it was.
    mask = torch.ones(shape, dtype=torch.bool)
    mask[index] = False
    assert torch.equal(x.cpu()[mask], before[mask])
    torch.testing.assert_close(x.cpu()[index], before[index] + 2 * zc)


def test_out_into_an_input_and_self_as_the_other_operand():
    _twice(lambda x, y: torch.mul(x, y, out=x), _x(64), _x(64, seed=1))
    _twice(lambda x, y: torch.sub(y, x, out=x), _x(8, 64), _x(8, 64, seed=1))  # out= the second operand
    (x,) = _twice(lambda x: x.add_(x), _x(64))
    assert x.add_(x) is x


def test_a_written_view_overlapping_another_view_still_goes_to_the_host():
    xc = _x(64)
    x = xc.to("spyre")
    r = torch.add(x[1:], x[:-1], out=x[1:])  # the CPU refuses this (internal overlap); the host copies first
    expected = xc.clone()
    expected[1:] = xc[1:] + xc[:-1]
    assert torch.equal(x.cpu(), expected) and r.shape == (63,)
    assert torch_spyre.fallback_stats().host.get("add.out") == 1
    assert "overlaps another argument" in eager.host_reasons()["add.out"]
    assert eager.cache_stats()["compiles"] == 0


def test_in_place_op_in_timing_only_mode():
    xc, yc = _x(64), _x(64, seed=1)
    with torch_spyre.timing_only():
        x, y = xc.to("spyre"), yc.to("spyre")
        assert x.add_(y) is x
    assert not allocation_of(x).has_data
    x, y = xc.to("spyre"), yc.to("spyre")
    x.add_(y)  # the same program, run for real
    assert torch.equal(x.cpu(), xc + yc)
    stats = eager.cache_stats()
    assert (stats["compiles"], stats["hits"]) == (1, 1)
    _on_card_only()


def test_a_1d_in_place_op_after_the_same_op_on_a_row_view():
    # Before: torch's graph cache served the row's synthetic-base graph (a base of 12*64 elements) to this.
    zc = _x(64, seed=1)
    _twice(lambda x, z: x[3].add_(z), _x(12, 64), zc)
    _twice(lambda c, z: c.add_(z), _x(64), zc)


def test_an_fp32_addmm_into_a_row_view_of_its_bias_runs_on_the_weight_parts():
    # The parts matmul's program took the bias and out= as two inputs: its run failed ("wrong number of
    # dimensions2") and the op went the ordinary way (which, taking them twice too, ran on the host).
    from torch_spyre.compiler import weight_parts

    weight_parts.clear()
    ac, wc, bc = _x(8, 64), _x(64, 64, seed=1), _x(16, 64, seed=2)
    a, b = ac.to("spyre"), bc.to("spyre")
    w = torch.nn.Parameter(wc.to("spyre"), requires_grad=False)
    expected = bc.clone()
    before = weight_parts.stats()
    with torch.no_grad():
        for _ in range(2):
            v = b[4:12]
            assert torch.addmm(v, a, w, out=v) is v
            expected[4:12] += ac @ wc
    torch.testing.assert_close(b.cpu(), expected, rtol=1e-4, atol=1e-4)
    stats = eager.cache_stats()
    assert (stats["compiles"], stats["failures"], stats["hits"]) == (2, 0, 1), stats  # the split, the matmul
    after = weight_parts.stats()
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 1)
    _on_card_only()

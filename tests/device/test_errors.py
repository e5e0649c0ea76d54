"""Bad input: a clear error, and nothing corrupted."""

from __future__ import annotations

import pytest
import torch

import torch_spyre  # noqa: F401
from torch_spyre.device.dtypes import UnsupportedDtypeError


def test_mixing_cpu_and_spyre_in_one_op(settled):
    a = torch.ones(3, device="spyre")
    base = settled()
    for op in (lambda: a + torch.ones(3), lambda: torch.mm(a.view(1, 3), torch.ones(3, 1)),
               lambda: torch.relu(a).add_(torch.ones(3)), lambda: torch.cat([a, torch.ones(3)])):
        with pytest.raises(RuntimeError, match="same device.*spyre:0.*cpu|cpu.*spyre:0"):
            op()
    assert a.cpu().tolist() == [1.0, 1.0, 1.0]
    assert settled() == base


def test_cpu_scalars_mix_like_on_cuda():
    a = torch.ones(3, device="spyre")
    assert (a * torch.tensor(2.0)).cpu().tolist() == [2.0, 2.0, 2.0]


def test_fallback_names_the_op_and_the_fix():
    a = torch.ones(3, device="spyre")
    with pytest.raises(RuntimeError, match=r"aten::.*\.to\('spyre'\)"):
        torch.dot(a, torch.ones(3))


def test_device_index_beyond_the_cards():
    with pytest.raises(RuntimeError, match=r"spyre:3 does not exist.*1 card.*TORCH_SPYRE_NUM_CARDS"):
        torch.ones(2, device="spyre:3")
    with pytest.raises(RuntimeError, match="spyre:3 does not exist"):
        torch.ones(2).to("spyre:3")
    with pytest.raises(RuntimeError, match="spyre:3 does not exist"):
        torch.spyre.set_device(3)
    with pytest.raises(RuntimeError, match="spyre:3 does not exist"):
        torch.spyre.memory_allocated(3)
    assert torch.spyre.current_device() == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.complex128])
def test_dtypes_the_card_cannot_hold(dtype):
    with pytest.raises(UnsupportedDtypeError, match=r"cannot hold .*supported: .*float32.*;"):
        torch.ones(2, dtype=dtype).to("spyre")
    with pytest.raises(UnsupportedDtypeError, match="cannot hold"):
        torch.zeros(2, dtype=dtype, device="spyre")
    with pytest.raises(UnsupportedDtypeError, match="cannot hold"):
        torch.ones(2, device="spyre").to(dtype)


@pytest.mark.parametrize("mode", ["host", "compile"])
def test_sparse_layouts_are_refused_and_leave_the_card_as_it_was(mode, monkeypatch, settled):
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    a = torch.arange(12.0).reshape(3, 4).to("spyre")
    base = settled()
    for op, layout in ((lambda: a.to_sparse(), "sparse_coo"), (lambda: a.to_sparse(1), "sparse_coo"),
                       (lambda: a.to_sparse_csr(), "sparse_csr"),
                       (lambda: torch.ones(2, 2).to_sparse().to("spyre"), "sparse_coo"),
                       # compressed layouts copied from the host (a CPU kernel copies their parts to the card)
                       (lambda: torch.eye(3).to_sparse_csr().to("spyre"), "sparse_csr"),
                       (lambda: torch.zeros(0, 5).to_sparse_csr().to("spyre"), "sparse_csr"),
                       (lambda: torch.eye(3).to_sparse_csc().to("spyre"), "sparse_csc"),
                       (lambda: torch.eye(4).to_sparse_bsr((2, 2)).to("spyre"), "sparse_bsr")):
        with pytest.raises(UnsupportedDtypeError,
                           match=rf"cannot hold {layout} tensors .*only dense, strided tensors.*x\.cpu\(\)\.to_sparse\(\)"):
            op()
    assert settled() == base
    assert a.cpu().equal(torch.arange(12.0).reshape(3, 4))


def test_float64_suggests_float32():
    with pytest.raises(UnsupportedDtypeError, match=r"x\.to\(torch\.float32\)"):
        torch.ones(2, dtype=torch.float64).to("spyre")


def test_numpy_points_to_cpu():
    with pytest.raises(TypeError, match=r"\.cpu\(\)"):
        torch.ones(2, device="spyre").numpy()


def test_invalid_configuration_is_reported_on_first_use(run_python):
    r = run_python(
        """
        import torch
        from torch_spyre.card import ConfigError
        print("imported", hasattr(torch, "spyre"))
        try:
            torch.ones(2, device="spyre")
        except ConfigError as e:
            print("ConfigError:", e)
        """,
        env={"TORCH_SPYRE_NUM_CARDS": "twelve"},
    )
    assert r.returncode == 0, r.stderr
    assert "imported True" in r.stdout  # import torch itself never fails on a bad configuration
    assert "ConfigError: invalid Spyre card configuration" in r.stdout and "num_cards" in r.stdout


def test_dlfloat16_switch_rejects_nonsense(monkeypatch):
    from torch_spyre.device import dtypes

    monkeypatch.setenv(dtypes.DLFLOAT16_ENV, "maybe")
    with pytest.raises(ValueError, match="TORCH_SPYRE_DLFLOAT16"):
        dtypes._env_default()

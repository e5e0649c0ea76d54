"""PyTorch's OpInfo database (op_db) on spyre: float32 samples of every op, compared with the CPU.

Ops expected to differ are listed with the reason, and results the card cannot hold (complex, float64,
uint64) must be refused with the dtype error (device/dtypes.py); any other failure fails the test, and so does an
"An output ... was resized" warning that the CPU does not give for the same sample.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._pytree import tree_map

import torch_spyre  # noqa: F401

pytestmark = pytest.mark.slow

EXPECTED = {
    # fp32 -> fp16 on the card rounds through DLFloat16 (docs/numerics.md)
    "half": "DLFloat16",
    # uninitialized memory differs from the CPU's
    "empty": "uninitialized", "empty_like": "uninitialized", "empty_permuted": "uninitialized",
    "empty_strided": "uninitialized", "new_empty": "uninitialized", "new_empty_strided": "uninitialized",
    # x.to("spyre") copies a view's elements, not its whole storage: as_strided beyond them differs
    "as_strided": "storage of a copied view",
    # index tensors must stay on the CPU (as on CUDA)
    "tensor_split": "CPU index argument",
    # sparse layouts are not supported on spyre
    "sparse.sampled_addmm": "sparse", "sparse.mm": "sparse", "to_sparse": "sparse",
}
UNSUPPORTED_DTYPE = "cannot hold"  # complex, float64, uint64 results: the card refuses them (UnsupportedDtypeError)


def _resize_warnings(caught) -> set[str]:
    """The "An output ... was resized" warnings among ``caught`` (the fallback must not add any)."""
    return {str(w.message).split(". ")[0] for w in caught if "was resized" in str(w.message)}


def _run_samples():
    from torch.testing._internal.common_methods_invocations import op_db

    to_s = lambda x: x.to("spyre") if isinstance(x, torch.Tensor) else x  # noqa: E731
    to_c = lambda x: x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "spyre" else x  # noqa: E731
    failed: dict[str, str] = {}
    passed: set[str] = set()
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:3]
        except Exception:  # noqa: BLE001 - a sample generator that needs something this machine lacks
            continue
        for s in samples:
            try:
                with warnings.catch_warnings(record=True) as cpu_warnings:
                    warnings.simplefilter("always")
                    ref = op(s.input, *s.args, **s.kwargs)
            except Exception:  # noqa: BLE001 - invalid on the CPU too
                continue
            try:
                with warnings.catch_warnings(record=True) as spyre_warnings:
                    warnings.simplefilter("always")
                    out = op(to_s(s.input), *tree_map(to_s, s.args), **tree_map(to_s, s.kwargs))
                torch.testing.assert_close(tree_map(to_c, out), ref, equal_nan=True, atol=1e-4, rtol=1e-4,
                                           check_device=False)
                spurious = _resize_warnings(spyre_warnings) - _resize_warnings(cpu_warnings)
                if spurious:
                    raise AssertionError(f"spurious warning on spyre: {sorted(spurious)[0]}")
                passed.add(op.name)
            except Exception as e:  # noqa: BLE001
                failed.setdefault(op.name, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return passed, failed


def test_op_db_float32_samples_match_cpu():
    # Warnings are recorded per sample: one the CPU does not give (an out= resized) fails the op.
    passed, failed = _run_samples()
    unexpected = {k: v for k, v in failed.items() if k not in EXPECTED and UNSUPPORTED_DTYPE not in v}
    assert not unexpected, "ops that fail on spyre:\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(unexpected.items()))
    assert len(passed) > 500

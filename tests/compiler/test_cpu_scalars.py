"""0-dim CPU tensors read by compiled spyre kernels (kernel_runtime.SpyreKernel._cpu_scalars_on_card).

Eager torch lets a 0-dim CPU tensor meet device tensors; Inductor then computes it in a CPU kernel (or takes
it as a CPU graph input) and hands the buffer to the spyre kernel reading it. SEW-D's relative positions
(``torch.log(torch.tensor((max_position - 1) / mid))``) failed that way: "buffer buf121 is on cpu".
"""

from __future__ import annotations

import pytest
import torch

from torch_spyre.compiler import wrapper

from .spyre_compile_helpers import check, fresh


def _sew_d_log_bucket(relative_pos: torch.Tensor) -> torch.Tensor:
    # transformers' sew_d make_log_bucket_position, bucket_size 8, max_position 64: both torch.tensor()
    # calls have no device= (the first is moved by type_as, the second stays a CPU scalar).
    mid = 4
    sign = torch.sign(relative_pos)
    abs_pos = torch.where((relative_pos < mid) & (relative_pos > -mid),
                          torch.tensor(mid - 1).type_as(relative_pos), torch.abs(relative_pos))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((64 - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos, log_pos * sign)


def test_cpu_scalar_computed_in_the_graph_matches_cpu():
    rel = (torch.arange(16)[:, None] - torch.arange(64)[None, :]).float()
    check(_sew_d_log_bucket, rel, tol=dict(atol=0, rtol=0))  # integers in fp32: exact


def test_cpu_scalar_graph_input_is_read_each_call():
    # A CPU 0-dim input changes between calls without recompiling: the copy is made per call.
    def f(x, s):
        return x * s + 1.0

    fresh()
    x = torch.randn(4, 64)
    compiled = torch.compile(f)
    for v in (2.5, -0.75):
        s = torch.tensor(v)
        got = compiled(x.to("spyre"), s)
        assert got.device.type == "spyre"
        torch.testing.assert_close(got.cpu(), f(x, s), atol=1e-2, rtol=1e-2)
    assert wrapper.host_fallback_stats() == {}


def test_a_cpu_tensor_that_is_not_0_dim_is_still_refused():
    # torch refuses to mix it with device tensors eagerly; compiled, the kernel says which buffer.
    def f(x, t):
        return x + t

    fresh()
    x = torch.randn(4, 64).to("spyre")
    with pytest.raises(Exception, match="same device|is on cpu"):
        f(x, torch.randn(64))
    with pytest.raises(Exception, match="same device|is on cpu"):
        torch.compile(f)(x, torch.randn(64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_float64_cpu_scalar_is_read_in_the_dtype_the_kernel_computes_in(dtype):
    # x * torch.tensor(v, dtype=float64): a 0-dim tensor does not promote a dimensioned one of its category, so
    # the result is x's dtype; eager torch (and CUDA, which passes the scalar in the kernel's compute dtype)
    # accepts it. The scalar comes to the card as fp32; it used to be refused as a float64 load.
    def f(x, s):
        return x * s + torch.log(s)  # log(s): computed on the CPU in float64, then read by the kernel

    fresh()
    x = torch.randn(4, 64).to(dtype)
    xd = x.to("spyre")
    compiled = torch.compile(f)
    before = torch.spyre.memory_allocated()
    for v in (0.1, 3.0):  # 0.1: not a float32, rounded as eager CPU rounds it (to the compute dtype)
        s = torch.tensor(v, dtype=torch.float64)
        got = compiled(xd, s)
        want = f(x, s)
        assert got.dtype == want.dtype == dtype
        tol = dict(atol=0, rtol=0) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(got.cpu(), want, **tol)
        del got
    assert torch.spyre.memory_allocated() == before  # the per-call copies of the scalars are freed
    assert wrapper.host_fallback_stats() == {}


def test_a_float64_result_is_still_refused():
    # An integer tensor times a float64 0-dim tensor: the 0-dim one is of a higher category, so the result is
    # float64 (eager CPU says so), which the card cannot compute.
    def f(x, s):
        return x * s

    fresh()
    x = torch.arange(64, dtype=torch.int32).reshape(1, 64)
    s = torch.tensor(2.5, dtype=torch.float64)
    assert f(x, s).dtype == torch.float64
    # Refused while Dynamo traces the mul (the device cannot hold its float64 result), before the compiler.
    with pytest.raises(Exception, match=r"cannot hold float64 .*s\.to\(torch\.float32\)"):
        torch.compile(f)(x.to("spyre"), s)

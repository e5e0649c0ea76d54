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

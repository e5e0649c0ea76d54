# An upstream-style PyTorch test file (as in pytorch/test/): device-generic tests instantiated with
# instantiate_device_type_tests, not edited for spyre. tests/testing/test_suites.py runs it through
# spyre-tests with suite.yaml (CI has no PyTorch checkout). Not collected by pytest (no test_ prefix).
import os

import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests


class TestUpstreamStyle(TestCase):
    @dtypes(torch.float32, torch.float16)
    def test_add(self, device, dtype):
        a = torch.arange(6, dtype=dtype).reshape(2, 3)
        self.assertEqual((a.to(device) + 1).cpu(), a + 1)

    def test_needs_tolerance(self, device):
        # off by 0.05: passes only with the suite's tolerance override (atol 0.1)
        self.assertEqual(torch.tensor([1.05], device=device).cpu(), torch.tensor([1.0]))

    def test_known_failure(self, device):
        self.assertEqual(torch.ones(2, device=device).cpu(), torch.zeros(2))

    def test_crash(self, device):
        os._exit(3)  # a crash of the process: the runner must lose this test only

    def test_after_crash(self, device):
        self.assertEqual(torch.ones(3, device=device).sum().item(), 3.0)

    @ops([o for o in op_db if o.name in ("abs", "neg", "exp")], allowed_dtypes=(torch.float32,))
    def test_unary(self, device, dtype, op):
        s = next(iter(op.sample_inputs("cpu", dtype)))
        self.assertEqual(op(s.input.to(device)).cpu(), op(s.input), atol=1e-3, rtol=1e-3)


instantiate_device_type_tests(TestUpstreamStyle, globals())

if __name__ == "__main__":
    run_tests()

"""The ``builtin:opinfo`` source: device-generic tests over PyTorch's OpInfo database, instantiated for spyre.

Importing this module creates ``TestSpyreOpsPRIVATEUSE1`` (PyTorch's ``instantiate_device_type_tests`` for
the PrivateUse1 device), one test per template, OpInfo and dtype, named
``test_<template>_<op>_spyre_<dtype>``. Each template compares spyre with the CPU:

- ``compare_cpu``: the op's samples (the first :data:`SAMPLES`) on spyre against the CPU;
- ``out``: the ``out=`` variant writes the CPU's result into a spyre tensor and returns it;
- ``noncontiguous``: the samples with every tensor a strided view on spyre;
- ``type_promotion``: binary ops with the other operand in another dtype give the CPU's dtype and values;
- ``backward``: the gradients of differentiable ops;
- ``compiled``: ``torch.compile`` of the op on spyre (the first sample);
- ``unsupported_dtype_refused`` (per dtype, not per op): a dtype the card cannot hold is refused with the
  device's UnsupportedDtypeError (a RuntimeError) naming it.

For 16-bit dtypes the CPU reference runs on inputs rounded as the card stores them (DLFloat16): each input
makes the round trip to the card first. A sample whose CPU reference raises is not a spyre question and is
left out; a sample spyre refuses because its result needs a dtype the card cannot hold is not counted as a
pass (the test is skipped when every sample is refused). Tolerances come from the suite (the runner sets
``precision``/``rel_tol`` per test from ``supported_dtypes`` and the entry's edits); run outside the runner,
:data:`DEFAULT_TOLERANCES` apply.
"""

from __future__ import annotations

import itertools
import unittest
import warnings

import torch

from .._torch import testing as seam
from .opinfo_templates import DEVICE_DTYPES, REFUSED_DTYPES, TEMPLATE_CLASS, template_ops
from .card_inputs import DEFAULT_TOLERANCES, REFUSED, as_card_result, as_stored, noncontiguous_on, refused, to_device

SAMPLES = 3
def _samples(op, dtype, requires_grad=False):
    torch.manual_seed(0)  # OpInfo samples draw from the global generator
    with seam.cheap_sample_tracking():
        # the first SAMPLES only: generating every sample costs more than running three
        return list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=requires_grad), SAMPLES))


class TestSpyreOps(seam.device_test_case()):
    """Device-generic templates over op_db (see the module docstring)."""

    def _tolerance(self, dtype):
        if self.precision or self.rel_tol:
            return self.precision, self.rel_tol
        return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))

    def _assert_close(self, actual, expected, dtype, msg=""):
        atol, rtol = self._tolerance(dtype)
        actual = to_device(actual, "cpu")
        self.assertEqual(actual, as_card_result(expected, actual), atol=atol, rtol=rtol, exact_device=False,
                         msg=msg or None)

    def _reference(self, device, fn, sample, dtype):
        """The CPU result on the inputs as the card stores them, or None when the CPU refuses the sample."""
        args = as_stored((sample.input, *sample.args, sample.kwargs), device)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return (fn(args[0], *args[1:-1], **args[-1]),)
        except Exception:  # noqa: BLE001 - invalid on the CPU too: not a spyre question
            return None

    def _run_samples(self, device, dtype, op, samples, place):
        ran, refused_msg = 0, None
        for i, s in enumerate(samples):
            try:
                ref = self._reference(device, op, s, dtype)
            except Exception as e:  # noqa: BLE001 - the card refused an input (its round trip)
                if refused(e):
                    refused_msg = str(e).splitlines()[0]
                    continue
                raise
            if ref is None:
                continue
            args = place((s.input, *s.args, s.kwargs), device)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = op(args[0], *args[1:-1], **args[-1])
            except Exception as e:  # noqa: BLE001
                if refused(e):
                    refused_msg = str(e).splitlines()[0]
                    continue
                raise
            self._assert_close(out, ref[0], dtype, msg=f"sample {i}: {s.summary() if hasattr(s, 'summary') else s}")
            ran += 1
        if not ran:
            raise unittest.SkipTest(f"refused by the card: {refused_msg}" if refused_msg else "no sample the CPU accepts")

    @seam.ops(template_ops("compare_cpu"), allowed_dtypes=DEVICE_DTYPES)
    def test_compare_cpu(self, device, dtype, op):
        self._run_samples(device, dtype, op, _samples(op, dtype), to_device)

    @seam.ops(template_ops("noncontiguous"), allowed_dtypes=DEVICE_DTYPES)
    def test_noncontiguous(self, device, dtype, op):
        self._run_samples(device, dtype, op, _samples(op, dtype), noncontiguous_on)

    @seam.ops(template_ops("out"), allowed_dtypes=DEVICE_DTYPES)
    def test_out(self, device, dtype, op):
        for s in _samples(op, dtype):
            ref = self._reference(device, op, s, dtype)
            if ref is None or not isinstance(ref[0], (torch.Tensor, tuple)):
                continue
            expected = ref[0]
            out = seam.tree_map(lambda t: torch.empty_like(t, device=device) if isinstance(t, torch.Tensor) else t,
                                expected)
            args = to_device((s.input, *s.args, s.kwargs), device)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    returned = op(args[0], *args[1:-1], **args[-1], out=out)
            except Exception as e:  # noqa: BLE001
                if refused(e):
                    raise unittest.SkipTest(f"refused by the card: {str(e).splitlines()[0]}") from None
                raise
            self._assert_close(out, expected, dtype, msg="the out= tensor")
            for r, o in zip(seam.tree_leaves(returned), seam.tree_leaves(out)):
                self.assertTrue(r is o or r.data_ptr() == o.data_ptr(), "out= must return the out tensor")
            return
        raise unittest.SkipTest("no sample the CPU accepts with out=")

    @seam.ops(template_ops("type_promotion"), allowed_dtypes=DEVICE_DTYPES)
    def test_type_promotion(self, device, dtype, op):
        other_dtype = torch.float16 if dtype == torch.float32 else torch.float32
        for s in _samples(op, dtype):
            if not (s.args and isinstance(s.args[0], torch.Tensor) and s.args[0].dtype == dtype):
                continue
            mixed = s.transform(lambda t: t)  # a copy whose other operand we replace
            mixed.args = (s.args[0].to(other_dtype), *s.args[1:])
            ref = self._reference(device, op, mixed, dtype)
            if ref is None:
                continue
            args = to_device((mixed.input, *mixed.args, mixed.kwargs), device)
            out = op(args[0], *args[1:-1], **args[-1])
            expected = ref[0]
            for o, e in zip(seam.tree_leaves(out), seam.tree_leaves(expected)):
                if isinstance(e, torch.Tensor):
                    self.assertEqual(o.dtype, e.dtype, f"result dtype of {dtype} with {other_dtype}")
            self._assert_close(out, expected, torch.promote_types(dtype, other_dtype))
            return
        raise unittest.SkipTest("no sample with a tensor other operand the CPU accepts")

    @seam.ops(template_ops("backward"), allowed_dtypes=DEVICE_DTYPES)
    def test_backward(self, device, dtype, op):
        for s in _samples(op, dtype, requires_grad=True):
            args = (s.input, *s.args, s.kwargs)
            leaves = {id(t): t for t in seam.tree_leaves(args) if isinstance(t, torch.Tensor) and t.requires_grad}
            if not leaves:
                continue
            stored = {k: t.detach().to(device).cpu().requires_grad_() for k, t in leaves.items()}
            on_card = {k: t.detach().to(device).requires_grad_() for k, t in leaves.items()}
            cpu_args = seam.tree_map(lambda t: stored.get(id(t), t) if isinstance(t, torch.Tensor) else t, args)
            dev_args = seam.tree_map(lambda t: on_card.get(id(t), t.to(device)) if isinstance(t, torch.Tensor)
                                     else t, args)
            try:
                ref = _grads(op, cpu_args, list(stored.values()))
            except Exception:  # noqa: BLE001 - not differentiable on the CPU for this sample
                continue
            if ref is None:
                continue
            got = _grads(op, dev_args, list(on_card.values()))
            self._assert_close(got, ref, dtype, msg="gradients")
            return
        raise unittest.SkipTest("no differentiable sample the CPU accepts")

    @seam.ops(template_ops("compiled"), allowed_dtypes=DEVICE_DTYPES)
    def test_compiled(self, device, dtype, op):
        samples = _samples(op, dtype)[:1]
        torch.compiler.reset()  # one lambda's code for every op: without a reset Dynamo hits its recompile limit
        compiled = torch.compile(lambda *a, **k: op(*a, **k), dynamic=False)
        self._run_samples(device, dtype, compiled, samples, to_device)

    @seam.dtypes(*REFUSED_DTYPES)
    def test_unsupported_dtype_refused(self, device, dtype):
        with self.assertRaisesRegex(RuntimeError, f"{REFUSED} {str(dtype).replace('torch.', '')}"):
            torch.zeros(4, dtype=dtype).to(device)


def _grads(op, args, leaves):
    """Gradients of the sum of the op's floating outputs with respect to ``leaves`` (None: no float output)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = op(args[0], *args[1:-1], **args[-1])
    outs = [o for o in seam.tree_leaves(out) if isinstance(o, torch.Tensor) and o.is_floating_point()
            and o.requires_grad]
    if not outs:
        return None
    total = sum(o.float().sum() for o in outs)
    return torch.autograd.grad(total, leaves, allow_unused=True)


assert TestSpyreOps.__name__ == TEMPLATE_CLASS
seam.instantiate_for_device(TestSpyreOps, globals())

"""The ``builtin:module_info`` source: device-generic tests over PyTorch's ModuleInfo database (``module_db``),
instantiated for spyre.

Importing this module creates ``TestSpyreModulesPRIVATEUSE1``, one test per template, module and dtype
(and training mode, for modules whose train and eval modes differ), named
``test_<template>_<module>[_train_mode|_eval_mode]_spyre_<dtype>``, e.g.
``test_compare_cpu_nn_Linear_spyre_float16``. Each template builds the module on the CPU from the ModuleInfo's
constructor inputs, moves a copy to spyre and compares it with the CPU, as upstream's ``test_cpu_gpu_parity``
does for CUDA:

- ``compare_cpu``: the forward outputs of the first :data:`SAMPLES` module inputs, and the module's buffers
  after them (running statistics are updated in train mode);
- ``noncontiguous``: the same with every input a strided view on spyre (upstream's
  ``test_non_contiguous_tensors``);
- ``backward``: the gradients of the sum of the float outputs with respect to the inputs and the parameters
  (upstream's ``test_grad`` against the CPU instead of gradcheck, which needs float64).

Same conventions as the OpInfo templates (``opinfo_tests.py``): for 16-bit dtypes the CPU module and inputs
hold the values the card stores (DLFloat16; each tensor makes a round trip through the card); a sample the
CPU refuses is left out, and one the card refuses for a dtype it cannot hold is not counted as a pass.

``module_db`` declares float32 and float64 for nearly every module (the dtypes upstream tests on CPU and
CUDA). The card's working dtypes are 16-bit, so every module is instantiated for float32, float16 and bfloat16
(:func:`module_templates.spyre_module_infos`); a 16-bit sample the CPU cannot run is left out as above.
"""

from __future__ import annotations

import copy
import unittest
import warnings

import torch

from .._torch import testing as seam
from .module_templates import TEMPLATE_CLASS, spyre_module_infos
from .card_inputs import DEFAULT_TOLERANCES, as_card_result, as_stored, noncontiguous_on, refused, to_device

SAMPLES = 3


def _module_inputs(module_info, dtype, training, requires_grad=False):
    torch.manual_seed(0)  # module inputs draw from the global generator
    inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype, requires_grad=requires_grad,
                                            training=training)
    return [i for i in inputs if i.forward_input is not None][:SAMPLES]


def _build_pair(module_info, module_input, dtype, training, device):
    """(CPU module, spyre module) with equal values: the CPU one holds what the card stores for 16-bit dtypes.
    None when the CPU cannot build or run the module in ``dtype``."""
    args, kwargs = module_input.constructor_input.args, module_input.constructor_input.kwargs
    torch.manual_seed(0)
    fwd = module_input.forward_input
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu = module_info.module_cls(*args, **kwargs).to(dtype)
            if isinstance(cpu, torch.nn.modules.lazy.LazyModuleMixin):  # parameters exist after a forward
                with torch.no_grad():
                    cpu(*_detached(fwd.args), **_detached(fwd.kwargs))
    except Exception:  # noqa: BLE001 - not constructible on the CPU in this dtype: not a spyre question
        return None
    cpu.train(training)
    on_card = copy.deepcopy(cpu).to(device)
    with torch.no_grad():
        for t in [*cpu.parameters(), *cpu.buffers()]:
            if t.dtype.is_floating_point:
                t.copy_(as_stored(t.detach(), device))
    return cpu, on_card


def _quietly(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with warnings silenced: module_db's modules and inputs warn about deprecated
    arguments and the like, on the CPU and the card alike, which is not what these tests look at."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _detached(tree):
    return seam.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def _float_outputs(out):
    return [o for o in seam.tree_leaves(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]


class TestSpyreModules(seam.device_test_case()):
    """Device-generic templates over module_db (see the module docstring)."""

    def _tolerance(self, dtype):
        if self.precision or self.rel_tol:
            return self.precision, self.rel_tol
        return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))

    def _assert_close(self, actual, expected, dtype, msg):
        atol, rtol = self._tolerance(dtype)
        actual = to_device(actual, "cpu")
        self.assertEqual(actual, as_card_result(expected, actual), atol=atol, rtol=rtol, exact_device=False,
                         msg=msg)

    def _forward(self, device, dtype, module_info, training, place):
        ran, refused_msg = 0, None
        for i, mi in enumerate(_module_inputs(module_info, dtype, training)):
            pair = _build_pair(module_info, mi, dtype, training, device)
            if pair is None:
                continue
            cpu, on_card = pair
            fwd = mi.forward_input
            try:
                expected = _quietly(cpu, *as_stored(_detached(fwd.args), device),
                                    **as_stored(_detached(fwd.kwargs), device))
            except Exception:  # noqa: BLE001 - the CPU refuses this input: not a spyre question
                continue
            try:
                got = _quietly(on_card, *place(_detached(fwd.args), device), **place(_detached(fwd.kwargs), device))
            except Exception as e:  # noqa: BLE001
                if refused(e):
                    refused_msg = str(e).splitlines()[0]
                    continue
                raise
            where = f"input {i} ({mi.desc or 'default'})"
            self._assert_close(got, expected, dtype, f"{where}: forward output")
            self._assert_close(dict(on_card.named_buffers()), dict(cpu.named_buffers()), dtype,
                               f"{where}: buffers after the forward")
            ran += 1
        if not ran:
            raise unittest.SkipTest(f"refused by the card: {refused_msg}" if refused_msg else "no input the CPU accepts")

    @seam.modules(spyre_module_infos())
    def test_compare_cpu(self, device, dtype, module_info, training):
        self._forward(device, dtype, module_info, training, to_device)

    @seam.modules(spyre_module_infos())
    def test_noncontiguous(self, device, dtype, module_info, training):
        self._forward(device, dtype, module_info, training, noncontiguous_on)

    @seam.modules(spyre_module_infos())
    def test_backward(self, device, dtype, module_info, training):
        for i, mi in enumerate(_module_inputs(module_info, dtype, training, requires_grad=True)):
            pair = _build_pair(module_info, mi, dtype, training, device)
            if pair is None:
                continue
            cpu, on_card = pair
            fwd = mi.forward_input
            try:
                expected = _grads(cpu, as_stored(_detached(fwd.args), device),
                                  as_stored(_detached(fwd.kwargs), device))
            except Exception:  # noqa: BLE001 - not differentiable on the CPU for this input
                continue
            if expected is None:
                continue
            got = _grads(on_card, to_device(_detached(fwd.args), device), to_device(_detached(fwd.kwargs), device))
            self._assert_close(got, expected, dtype, f"input {i} ({mi.desc or 'default'}): gradients")
            return
        raise unittest.SkipTest("no differentiable input the CPU accepts")


def _grads(module, args, kwargs):
    """Gradients of the sum of the module's float outputs: (input gradients, parameter gradients), or None when
    nothing requires grad. ``args``/``kwargs`` are detached copies; their float tensors are made leaves here."""
    leaves = [t for t in seam.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    for t in leaves:
        t.requires_grad_()
    params = [p for p in module.parameters() if p.requires_grad]
    outs = [o for o in _float_outputs(_quietly(module, *args, **kwargs)) if o.requires_grad]
    wrt = leaves + params
    if not outs or not wrt:
        return None
    total = sum(o.float().sum() for o in outs)
    return torch.autograd.grad(total, wrt, allow_unused=True)


assert TestSpyreModules.__name__ == TEMPLATE_CLASS
seam.instantiate_for_device(TestSpyreModules, globals())

"""program_runner.py: the device asks the runner the compiler installed at registration, and computes on the
host when none is set or it declines."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

import torch_spyre
from torch_spyre.device import program_runner
from torch_spyre.device.program_runner import Ran


def test_registration_installs_the_compilers_runner():
    from torch_spyre.compiler import hooks

    assert program_runner.program_runner() is hooks.RUNNER


def test_without_a_runner_every_op_runs_on_the_host():
    x = torch.arange(4.0).to("spyre")
    previous = program_runner.set_program_runner(None)
    try:
        torch_spyre.reset_fallback_stats()
        assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
        assert sum(torch_spyre.fallback_stats().host.values()) >= 1 and not torch_spyre.fallback_stats().compiled
    finally:
        program_runner.set_program_runner(previous)


def test_a_runner_is_asked_and_may_decline():
    asked = []

    class Declines:
        def run(self, op, info, args, kwargs, card):
            asked.append(info.name)
            return None

        def probing(self):
            return False

    class Answers(Declines):
        def run(self, op, info, args, kwargs, card):
            asked.append(info.name)
            return Ran(args[0])  # "computes" by returning its first argument

    x = torch.arange(4.0).to("spyre")
    previous = program_runner.set_program_runner(Declines())
    try:
        torch_spyre.reset_fallback_stats()
        assert (x + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
        assert asked and torch_spyre.fallback_stats().host
        program_runner.set_program_runner(Answers())
        torch_spyre.reset_fallback_stats()
        from torch_spyre.device import fallback

        assert fallback.run(torch.ops.aten.neg.default, x) is x
        assert asked[-1] == "neg"
        assert sum(torch_spyre.fallback_stats().compiled.values()) == 1
    finally:
        program_runner.set_program_runner(previous)


def test_eager_ops_run_as_programs_in_a_fresh_process_without_inductor_at_import():
    code = textwrap.dedent("""
        import os, sys
        os.environ.pop("TORCH_SPYRE_EAGER", None)
        import torch, torch_spyre
        assert not any(m.startswith(("torch._inductor", "torch._dynamo")) for m in sys.modules), "Inductor at import"
        y = (torch.ones(64).to("spyre") * 3).cpu()
        assert y.tolist() == [3.0] * 64
        print(torch_spyre.fallback_stats().compiled)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "mul" in out.stdout, out.stdout

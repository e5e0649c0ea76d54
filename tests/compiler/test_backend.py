"""backend.py + wrapper.py + debug.py: registration, the generated wrapper, prepare-once, fallbacks, debug files."""

from __future__ import annotations

import os

import pytest
import torch

import torch_spyre
from torch_spyre.compiler import backend, wrapper

from .spyre_compile_helpers import fresh


def test_registration_is_idempotent_and_complete():
    backend.register()
    backend.register()
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import (
        get_device_op_overrides,
        get_scheduling_for_device,
        get_wrapper_codegen_for_device,
    )

    assert get_scheduling_for_device("spyre") is not None
    assert get_wrapper_codegen_for_device("spyre").__name__ == "SpyreWrapperCodegen"
    assert "torch.spyre.synchronize()" == get_device_op_overrides("spyre").synchronize()
    props = get_interface_for_device("spyre").get_device_properties()
    assert props.multi_processor_count == 32 and props.num_cores == 32
    assert backend.inductor_attr("Scheduling") is get_scheduling_for_device("spyre")
    assert backend.inductor_attr("CppWrapperCodegen") is None


def test_generated_wrapper_is_readable():
    from torch._inductor.utils import run_and_get_code

    fresh()
    a, b = torch.randn(32, 64).to("spyre"), torch.randn(64).to("spyre")
    out, (code,) = run_and_get_code(torch.compile(lambda x, y: torch.sigmoid(x) * y), a, b)
    assert "from torch_spyre.compiler.wrapper import SpyreKernel, empty_spyre" in code
    assert "= SpyreKernel.load(" in code and "# kernel spyre_" in code
    assert "empty_spyre((32, 64), (64, 1), torch.float32, 0)  # host [32, 64] sticked on dim 1" in code
    assert ".run(arg0_1=arg0_1, arg1_1=arg1_1, buf0=buf0)" in code
    torch.testing.assert_close(out.cpu(), torch.sigmoid(a.cpu()) * b.cpu())


def test_programs_are_prepared_once_and_launched_per_call():
    fresh()
    captured = []
    orig = wrapper.SpyreKernel._prepare

    def spy(self, places, card, key):
        captured.append(self.name)
        return orig(self, places, card, key)

    wrapper.SpyreKernel._prepare = spy
    try:
        f = torch.compile(lambda x: x * 3 - 1)
        x = torch.randn(64, 64).to("spyre")
        for _ in range(3):
            y = f(x)
    finally:
        wrapper.SpyreKernel._prepare = orig
    assert len(captured) == 1
    torch.testing.assert_close(y.cpu(), x.cpu() * 3 - 1)


def test_host_fallbacks_in_compiled_graphs_are_counted():
    fresh()
    f = torch.compile(lambda x: torch.sort(x, -1).values * 2)
    x = torch.randn(8, 16).to("spyre")
    torch.testing.assert_close(f(x).cpu(), torch.sort(x.cpu(), -1).values * 2)
    stats = wrapper.host_fallback_stats()
    assert stats and any("sort" in k for k in stats), stats


def test_an_op_without_lowering_is_a_clear_error():
    fresh()
    with pytest.raises(Exception, match="no Spyre lowering"):
        torch.compile(lambda x: torch.argmax(x, -1))(torch.randn(8, 16).to("spyre"))


def test_debug_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    fresh()
    x = torch.randn(16, 128).to("spyre")
    torch.compile(lambda a: torch.softmax(a, -1))(x)
    files = sorted(os.listdir(tmp_path))
    stems = {f.split(".")[0] for f in files}
    assert len(stems) == 1
    stem = stems.pop()
    for suffix in (".program.txt", ".program.json", ".decisions.txt", ".spec.txt"):
        assert stem + suffix in files
    text = (tmp_path / f"{stem}.decisions.txt").read_text()
    assert "(reduction)" in text and "work division" in text and "scratchpad" in text
    assert "aten.amax" in text and "test_backend.py" in text  # provenance: op and source line
    from torch_spyre.program import Program

    assert Program.load(str(tmp_path / f"{stem}.program.json")).name == stem

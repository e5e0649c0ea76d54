"""Registration: `import torch_spyre`, the torch.backends autoload entry point, torch.spyre, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

import torch_spyre


def test_bare_import_torch_makes_spyre_available(run_python):
    r = run_python(
        """
        import torch
        x = torch.randn(4, 4).to("spyre")
        print(x.device, torch.spyre.is_available(), torch.spyre.device_count())
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "spyre:0 True 1"


def test_import_torch_loads_no_heavy_module(run_python):
    r = run_python("import sys, torch; print(sorted(m for m in ('pydantic', 'rich', 'torch_spyre.card.config', "
                   "'torch_spyre.device.fallback', 'numpy.random') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert "pydantic" not in r.stdout and "torch_spyre.card.config" not in r.stdout and "rich" not in r.stdout


def test_import_torch_spyre_first_also_works(run_python):
    r = run_python("import torch_spyre, torch; print(torch.ones(2, device='spyre').cpu().tolist())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[1.0, 1.0]"


def test_register_is_idempotent():
    torch_spyre.register()
    torch_spyre.register()
    assert torch._C._get_privateuse1_backend_name() == "spyre"


def test_torch_spyre_mirrors_torch_cuda():
    for name in ("device_count", "current_device", "set_device", "device", "is_available", "synchronize",
                 "Stream", "Event", "current_stream", "default_stream", "set_stream", "stream",
                 "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "memory_reserved",
                 "max_memory_reserved", "memory_stats", "mem_get_info", "empty_cache", "manual_seed",
                 "manual_seed_all", "get_rng_state", "set_rng_state", "get_device_name", "get_device_properties"):
        assert callable(getattr(torch.spyre, name)), name
    assert torch.spyre.get_device_name() == "IBM Spyre (simulated)"
    with torch.spyre.device(0):
        assert torch.spyre.current_device() == 0
    x = torch.ones(1).spyre()  # generated Tensor.spyre()
    assert x.is_spyre and x.device.type == "spyre"


def test_device_context_selects_the_card(run_python):
    r = run_python(
        """
        import torch, torch_spyre
        with torch.spyre.device(1):
            a = torch.ones(2, device="spyre")
            s = torch.spyre.current_stream()
        print(a.device, s.card, torch.spyre.current_device(), torch.accelerator.device_count())
        """,
        env={"TORCH_SPYRE_NUM_CARDS": "2"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "spyre:1 1 0 2"


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "torch_spyre.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_info_prints_every_figure_with_provenance_and_peaks():
    r = run_cli("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    names = {f["name"] for f in info["figures"]}
    assert {"num_cores", "clock_hz", "dram_peak_bandwidth", "pcie_effective_bandwidth", "kernel_fixed_cost_s"} <= names
    assert all(f["confidence"] and f["source"] for f in info["figures"])
    peaks = {d["name"]: d["value"] for d in info["derived"]}
    assert peaks["peak_fp16_flops"] == 32 * 2 * 512 * 2 * 1.1e9
    r = run_cli("info")
    assert r.returncode == 0 and "Derived peaks" in r.stdout and "peak_fp16_flops" in r.stdout


def test_cli_invalid_config_exits_2():
    import os

    env = {**os.environ, "TORCH_SPYRE_CLOCK_HZ": "-5"}
    r = run_cli("info", env=env)
    assert r.returncode == 2
    assert "clock_hz" in r.stderr and "-5" in r.stderr


def test_cli_without_a_command_exits_2():
    assert run_cli().returncode == 2

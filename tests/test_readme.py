"""The README's tour runs as written (each ```python block in a fresh interpreter, from the repo root)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)

# What each block's comments promise, checked against what it prints.
PROMISED = [
    [r"^spyre:0$", r"device_size=\[2, 5, 64\]", r"^1280$", r"simulated ms", r"^spyre 1$"],
    [r"^program matmul_1024x1024x1024", r"dma_load", r"achieved [\d.]+ % of it", r"Simulated device time total"],
    [r"^max error vs CPU: (0\.00|[0-9]\.[0-9]+e-0[3-9])", r"^spyre_mlp_gelu_0 ", r"Simulated device time total"],
]


def test_readme_has_a_tour():
    assert len(BLOCKS) == len(PROMISED)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_tour_block_runs(index, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", BLOCKS[index]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for pattern in PROMISED[index] if index < len(PROMISED) else [r"\S"]:
        assert re.search(pattern, run.stdout, flags=re.M), f"block {index} should print {pattern!r}:\n{run.stdout}"

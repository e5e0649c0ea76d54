"""Tensor parallel over two simulated cards through vLLM's own multiprocess executor.

TP=2 runs two vLLM worker processes, each serving on its own card (spyre:0, spyre:1) with the spyre device
communicator (``serving/communicator.py``); its greedy tokens must equal TP=1's, and its steps must include
card-to-card collective time (TP=1 none). The runs happen in a child process (``tp_run.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import tiny_models
from .tp_run import NEW_TOKENS, PROMPTS

pytest.importorskip("vllm", reason="the vLLM serving tests need the serve extra: pip install -e '.[serve]'")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.models
def test_tp2_gives_tp1_tokens_and_charges_the_link(tmp_path, vllm_env):
    from torch_spyre.serving import sim_metrics

    model = tiny_models.build("llama", tmp_path / "llama")
    refs = [tiny_models.hf_greedy(model, p, NEW_TOKENS) for p in PROMPTS]
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    # Two cards; one OpenMP thread per worker on this 2-core machine (vLLM's CPU binding needs a core per rank).
    env = {**os.environ, **vllm_env, "TORCH_SPYRE_NUM_CARDS": "2", "VLLM_CPU_OMP_THREADS_BIND": "0|1",
           "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "tests.serving.tp_run", str(tmp_path / "llama"), str(metrics_dir)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    tp1, tp2 = out["tokens"]["1"], out["tokens"]["2"]
    for got1, got2, ref in zip(tp1, tp2, refs, strict=True):
        tiny_models.assert_greedy_matches(got1, ref)
        tiny_models.assert_greedy_matches(got2, ref)
        tie = next((i for i, gap in enumerate(ref.gaps) if gap < tiny_models.NEAR_TIE), len(ref))
        assert got2[:tie] == got1[:tie]  # equal up to the reference's first near-tie (where fp16 may pick either)

    s1, s2 = out["series"]["tp1"], out["series"]["tp2"]
    link, steps = sim_metrics.LINK + "_total", sim_metrics.STEPS + "_total"
    assert s1[link] == 0 and 0 < s2[link] < s2[steps]
    # TP rank 0 alone records the steps: one TTFT per prompt, one TPOT per later token, as with TP=1.
    for s in (s1, s2):
        assert s[sim_metrics.TTFT + "_count"] == len(PROMPTS)
        assert s[sim_metrics.TPOT + "_count"] == len(PROMPTS) * (NEW_TOKENS - 1)
        assert s[sim_metrics.TTFT + "_sum"] + s[sim_metrics.TPOT + "_sum"] == pytest.approx(len(PROMPTS) * s[steps])

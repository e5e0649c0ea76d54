"""Where the per-model checks run: local worker processes, or Ray tasks on a cluster.

Either way each model runs in its own fresh process (``worker.py``) under a hard time limit: a model that
hangs is killed when its time runs out, one that crashes its process becomes a ``crash`` record, and
neither costs the rest of the sweep. The parallelism is the standard library's thread pool
(``--workers N``) or Ray's own scheduling (``--ray``): one task per model, ``max_calls=1`` so every task
gets a fresh Ray worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .worker import MARK

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding torch_spyre/
_GRACE_S = 60.0  # the hard limit is the model's timeout plus this (building and importing take time too)


class RayUnreachable(Exception):
    """The Ray address given cannot be reached (one line says which and what to do)."""


_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()


def kill_all() -> None:
    """Kill every worker process this runner started (Ctrl-C)."""
    with _live_lock:
        procs = list(_live)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_isolated(model_type: str, options: dict) -> dict:
    """Check ``model_type`` in a fresh Python process; a record even when the process hangs or dies."""
    timeout = options.get("timeout")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "torch_spyre.coverage.worker", model_type, json.dumps(options)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # its own process group: Ctrl-C reaches us, we kill it
    with _live_lock:
        _live.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout + _GRACE_S if timeout else None)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return _failed(model_type, "timeout", f"killed after {timeout + _GRACE_S:g} s (the model's time ran out)")
    finally:
        with _live_lock:
            _live.discard(proc)
    for line in reversed(out.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = [line for line in err.strip().splitlines() if line.strip()]
    why = f"the worker process exited with code {proc.returncode}" + (f": {tail[-1][:300]}" if tail else "")
    return _failed(model_type, "crash", why)


def _failed(model_type: str, cls: str, detail: str) -> dict:
    from .catalog import classify

    try:
        family, modality = classify(model_type)
    except Exception:  # noqa: BLE001 - an unknown type still gets its record
        family, modality = "other", "other"
    return {"model_type": model_type, "family": family, "modality": modality, "status": "fail",
            "failure": {"class": cls, "detail": detail, "op": None}}


def run_local(model_types: Iterable[str], options: dict, workers: int) -> Iterator[dict]:
    """Records as the models finish, ``workers`` at a time (each in its own process)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: set[Future] = {pool.submit(run_isolated, mt, options) for mt in model_types}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield f.result()
        finally:
            for f in pending:
                f.cancel()
            kill_all()


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise RayUnreachable unless ``host:port`` (or ``ray://host:port``) accepts a TCP connection."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RayUnreachable(f"Ray address {address!r} is not HOST:PORT (or ray://HOST:PORT, or 'local')")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise RayUnreachable(f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start it with "
                             f"`ray start --head` or pass --ray local") from None


def run_ray(model_types: Iterable[str], options: dict, address: str, workers: int,
            on_start: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Records as the models finish: one Ray task per model (``address`` "local" starts a loopback cluster
    of ``workers`` CPUs in this process and stops it at the end)."""
    import ray

    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])),
                                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
    if address == "local":
        ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1",
                 runtime_env=runtime_env, log_to_driver=False)
    else:
        check_reachable(address)
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        except Exception as e:  # noqa: BLE001 - e.g. a token the cluster refuses: one line, not Ray's trace
            raise RayUnreachable(f"cannot connect to the Ray cluster at {address}: "
                                 f"{str(e).strip().splitlines()[0][:300]}") from None
    if on_start:
        on_start(f"Ray cluster: {ray.cluster_resources().get('CPU', 0):g} CPUs")
    task = ray.remote(num_cpus=1, max_calls=1, max_retries=0)(run_isolated)
    refs = {task.remote(mt, options): mt for mt in model_types}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost task is that model's crash, not the sweep's
                    yield _failed(refs[ref], "crash", f"the Ray task failed: {str(e).strip().splitlines()[0][:300]}")
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.shutdown()

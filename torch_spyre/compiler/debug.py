"""``TORCH_SPYRE_DEBUG=1``: per kernel, the program and the decisions, written where a person can read them.

Files under ``TORCH_SPYRE_DEBUG_DIR`` (default ``./spyre_debug``), one set per generated program:

- ``<kernel>.program.txt``: the program, one instruction per line (``Program.format``);
- ``<kernel>.program.json``: the program itself (``Program.load`` reads it back);
- ``<kernel>.decisions.txt``: layouts, work division, tiling, scratchpad plan, overlap, provenance;
- ``<kernel>.spec.txt``: the kernel's op DAG as the compiler understood it from Inductor.

A kernel prepared for several placements of its tensors gets a ``.<n>`` suffix after the first.
"""

from __future__ import annotations

import os
import threading
from typing import Any

ENV = "TORCH_SPYRE_DEBUG"
DIR_ENV = "TORCH_SPYRE_DEBUG_DIR"
_lock = threading.Lock()
_seen: dict[str, int] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def debug_dir() -> str:
    return os.environ.get(DIR_ENV) or os.path.join(os.getcwd(), "spyre_debug")


def dump_kernel(spec: Any, program: Any) -> list[str]:
    """Write the debug files of one generated program (if enabled); returns the paths written."""
    if not enabled():
        return []
    from .decisions import KernelDecisions

    out = debug_dir()
    os.makedirs(out, exist_ok=True)
    with _lock:
        n = _seen.get(program.name, 0)
        _seen[program.name] = n + 1
    stem = os.path.join(out, program.name if n == 0 else f"{program.name}.{n}")
    paths = []

    def write(suffix: str, text: str) -> None:
        path = stem + suffix
        with open(path, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        paths.append(path)

    write(".program.txt", program.format())
    program.save(stem + ".program.json")
    paths.append(stem + ".program.json")
    d = program.metadata.get("decisions")
    write(".decisions.txt", KernelDecisions.from_dict(d).format() if d else f"kernel {program.name}: no decisions recorded")
    if spec is not None:
        write(".spec.txt", spec.describe())
    return paths

"""Compile cost of the card's backend: what a first call waits for, against Inductor's CPU backend.

    python benchmarks/compile_cost.py                 # all rows
    python benchmarks/compile_cost.py --quick         # no MiniLM subprocesses
    python benchmarks/compile_cost.py --rows 4096 --json

Rows:
1. MiniLM first call (all-MiniLM-L6-v2, batch 8, seq 128): ``torch.compile`` for spyre (fp16 on the card)
   against the Inductor CPU backend (fp32), each in a fresh process with an empty Inductor cache. The
   spyre figure is split into compile (first call minus a repeat call) and execution (the repeat call:
   the functional simulator running the programs). Median of ``--repeat`` process pairs; the ratio is
   spyre first call / CPU first call.
2. A new sequence length in an already-compiled MLP 384-1536-384 (``dynamic=True``): the first call at a
   new length, the repeat call at that length (execution) and the difference (program generation).
3. The matmul plan search alone for those MLP matmuls at a new length (``build_matmul``, host CPU seconds),
   and the same search from the plan cache.
4. The relayout program of a ``--rows`` x 4096 fp16 weight (sticked on dim 1 -> dim 0, what a matmul
   wants of an nn.Linear weight): host seconds to generate it, its instructions, its simulated time.
5. The first call of a compiled Granite-shaped MLP (hidden 4096, intermediate 12800, SiLU-gated, fp16,
   ``--mlp-tokens`` tokens) in timing-only mode (no data: the host cost is the compile, the relayouts of
   its three weights and the timing model, not the functional simulator), against the repeat call
   (``--mlp-only`` alone, ``--mlp`` beside the other rows).

Host wall time depends on this machine and its load (it is shared): read medians, compare ratios measured
in one run, and never assert on them in tests. Simulated time is the card's and does not depend on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# One process's first call: the model loaded, compiled for ``device``, called twice (the second is a pure
# execution of what the first compiled). Prints one JSON line.
_FIRST_CALL = r"""
import json, sys, time, copy
import torch
torch.set_num_threads(1)
device = sys.argv[1]
from torch_spyre.jobs import embed as job
tokenizer, model = job.load_minilm(torch.float32)
inputs = job.tokenize(tokenizer, [job.DEFAULT_SENTENCES[i % len(job.DEFAULT_SENTENCES)] for i in range(8)], 128)
if device == "spyre":
    import torch_spyre  # noqa: F401
    forward = job.build_forward(copy.deepcopy(model).half().to("spyre"), "compiled")
    inputs = {k: v.to("spyre") for k, v in inputs.items()}
    sync = torch.spyre.synchronize
else:
    forward = torch.compile(job.sentence_embedder(model), dynamic=False)
    sync = lambda: None
times, cpus = [], []
with torch.no_grad():
    for _ in range(2):
        t0, c0 = time.perf_counter(), time.process_time()
        forward(inputs)
        sync()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
print(json.dumps({"first_s": times[0], "repeat_s": times[1], "first_cpu_s": cpus[0], "repeat_cpu_s": cpus[1]}))
"""


def _first_call(device: str) -> dict[str, float]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix=f"compile_cost_{device}_"),
               HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _FIRST_CALL, device], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the {device} first-call process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def minilm_first_call(repeat: int) -> dict[str, Any]:
    spyre, cpu = [], []
    for _ in range(repeat):  # interleaved, so both see the same machine load
        spyre.append(_first_call("spyre"))
        cpu.append(_first_call("cpu"))
    first = statistics.median(r["first_s"] for r in spyre)
    execute = statistics.median(r["repeat_s"] for r in spyre)
    cpu_first = statistics.median(r["first_s"] for r in cpu)
    # The same in CPU seconds of each process (Inductor's CPU compile spends some in worker processes it
    # starts, not counted here), less sensitive to the load of a shared machine than wall time.
    first_cpu = statistics.median(r["first_cpu_s"] for r in spyre)
    execute_cpu = statistics.median(r["repeat_cpu_s"] for r in spyre)
    cpu_first_cpu = statistics.median(r["first_cpu_s"] for r in cpu)
    return {"row": "MiniLM first call (batch 8, seq 128)", "spyre_first_s": first, "spyre_execute_s": execute,
            "spyre_compile_s": first - execute, "cpu_first_s": cpu_first, "ratio": first / cpu_first,
            "compile_ratio": (first - execute) / cpu_first, "spyre_first_cpu_s": first_cpu,
            "spyre_execute_cpu_s": execute_cpu, "cpu_first_cpu_s": cpu_first_cpu,
            "cpu_ratio": first_cpu / cpu_first_cpu, "target_ratio": 1.5}


def _mlp_matmul_specs(length: int) -> list[Any]:
    from torch_spyre.card import StickLayout
    from torch_spyre.compiler.access import TensorView
    from torch_spyre.compiler.codegen.matmul import addmm_spec

    def buf(name: str, shape: tuple[int, ...], stick: int = -1) -> TensorView:
        return TensorView.whole(name, StickLayout(shape, stick, "dlfloat16"))

    return [addmm_spec(buf("bias", (n,)), buf("a", (length, k)), buf("b", (k, n)), buf("c", (length, n)))
            for k, n in ((384, 1536), (1536, 384))]


def new_sequence_length(repeat: int) -> dict[str, Any]:
    import torch

    import torch_spyre  # noqa: F401

    mlp = torch.nn.Sequential(torch.nn.Linear(384, 1536), torch.nn.GELU(), torch.nn.Linear(1536, 384)).half()
    on_card = torch.compile(mlp.to("spyre"), dynamic=True)
    firsts, repeats, first_cpus, repeat_cpus = [], [], [], []
    with torch.no_grad():
        on_card(torch.randn(64, 384, dtype=torch.float16).to("spyre"))  # compiles the symbolic graph
        torch.spyre.synchronize()
        for length in (96, 160, 224, 288, 352)[:max(1, repeat)]:
            x = torch.randn(length, 384, dtype=torch.float16).to("spyre")
            for sink, cpu_sink in ((firsts, first_cpus), (repeats, repeat_cpus)):
                t0, c0 = time.perf_counter(), time.process_time()
                on_card(x)
                torch.spyre.synchronize()
                sink.append(time.perf_counter() - t0)
                cpu_sink.append(time.process_time() - c0)
    first, execute = statistics.median(firsts), statistics.median(repeats)
    # CPU seconds too: on a loaded machine the wall time is several times the work done.
    first_cpu, execute_cpu = statistics.median(first_cpus), statistics.median(repeat_cpus)
    return {"row": "new sequence length, compiled MLP 384-1536-384", "first_s": first, "execute_s": execute,
            "generate_s": first - execute, "first_cpu_s": first_cpu, "execute_cpu_s": execute_cpu,
            "generate_cpu_s": first_cpu - execute_cpu, "target_s": 2.0}


def plan_search(repeat: int) -> dict[str, Any]:
    from torch_spyre.card import CardConfig
    from torch_spyre.compiler.codegen.matmul import build_matmul

    cfg, fresh, cached = CardConfig(), [], []
    for length in (112, 176, 240, 304, 368)[:max(1, repeat)]:
        specs = _mlp_matmul_specs(length)
        for sink in (fresh, cached):
            t0 = time.process_time()
            for spec in specs:
                build_matmul(spec, cfg)
            sink.append(time.process_time() - t0)
    return {"row": "matmul plans of the MLP at a new length (host CPU s)", "search_s": statistics.median(fresh),
            "cached_s": statistics.median(cached)}


def relayout_generation(rows: int) -> dict[str, Any]:
    from torch_spyre.card import CardConfig, StickLayout
    from torch_spyre.card.timing import time_program
    from torch_spyre.compiler.relayout import relayout_program

    cfg = CardConfig()
    src, dst = StickLayout((rows, 4096), 1, "dlfloat16"), StickLayout((rows, 4096), 0, "dlfloat16")
    t0, c0 = time.perf_counter(), time.process_time()
    program = relayout_program(src, dst, cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tiling = program.metadata["decisions"]["tiling"]
    return {"row": f"relayout program of a {rows}x4096 fp16 weight", "generate_s": wall, "generate_cpu_s": cpu,
            "instructions": sum(len(v) for v in program.cores.values()), "tile": tiling["tile"],
            "cores": len(program.cores), "simulated_us": time_program(program, cfg).total_s * 1e6}


def granite_mlp(hidden: int = 4096, intermediate: int = 12800) -> Any:
    """Granite-3.3-8B's MLP: down(silu(gate(x)) * up(x)), no biases."""
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=False)
            self.up_proj = torch.nn.Linear(hidden, intermediate, bias=False)
            self.down_proj = torch.nn.Linear(intermediate, hidden, bias=False)

        def forward(self, x: Any) -> Any:
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    return MLP()


def granite_mlp_first_call(tokens: int) -> dict[str, Any]:
    import torch

    import torch_spyre

    with torch_spyre.timing_only(), torch.no_grad():
        with torch.device("meta"):
            mlp = granite_mlp().half()
        mlp = mlp.to_empty(device="spyre")
        on_card = torch.compile(mlp, dynamic=False)
        x = torch.empty(1, tokens, 4096, dtype=torch.float16, device="spyre")
        times, cpus = [], []
        for _ in range(2):
            t0, c0 = time.perf_counter(), time.process_time()
            on_card(x)
            torch.spyre.synchronize()
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    return {"row": f"Granite MLP 4096-12800 first call, {tokens} tokens, timing-only", "first_s": times[0],
            "first_cpu_s": cpus[0], "repeat_s": times[1], "target_s": 60.0}


def print_table(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        name = r.pop("row")
        cells = ", ".join(f"{k} {v:,.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
        print(f"- {name}: {cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="samples per row (median)")
    parser.add_argument("--quick", action="store_true", help="skip the MiniLM subprocesses")
    parser.add_argument("--rows", type=int, default=1024, help="rows of the relayouted 4096-wide weight")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--mlp", action="store_true", help="add the Granite MLP first call (row 5)")
    parser.add_argument("--mlp-only", action="store_true", help="only the Granite MLP first call")
    parser.add_argument("--minilm-only", action="store_true", help="only the MiniLM first call (row 1)")
    parser.add_argument("--mlp-tokens", type=int, default=128, help="tokens of the Granite MLP's input")
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="compile_cost_"))
    import torch

    torch.set_num_threads(1)
    if args.minilm_only:
        rows = []
    elif args.mlp_only:
        rows = [granite_mlp_first_call(args.mlp_tokens)]
    else:
        rows = [plan_search(args.repeat), new_sequence_length(args.repeat), relayout_generation(args.rows)]
        if args.mlp:
            rows.append(granite_mlp_first_call(args.mlp_tokens))
    if not args.quick and not args.mlp_only:
        rows.insert(0, minilm_first_call(args.repeat))
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The fused MLP (issue 13 §4b) off and on: kernels, simulated time and the op roofline.

    python benchmarks/fused_mlp.py                # Granite's SwiGLU MLP (512 tokens, 4096 -> 12800 -> 4096)
                                                  # and a smaller one (256 tokens, 1024 -> 2816 -> 1024)
    python benchmarks/fused_mlp.py --tiny         # 64 tokens, 128 -> 256 -> 128 (seconds)

An ``nn.Module`` SwiGLU MLP (``down(silu(gate(x)) * up(x))``, no biases, fp16, weights as parameters) is
compiled for the spyre device with ``torch.compile`` under ``torch.no_grad`` with the ``fused_mlp``
optimization switched off, then on, and one steady call is profiled in timing-only mode (programs
generated, prepared and timed, not executed: the parameters are allocated without data). Kernels are
the profiler's compute records of that call; time is their summed simulated duration (deterministic).

The op roofline is the whole MLP's, as one op: max(its three matmuls' flops at the chip's peak, x and the
weights read once and the output written once at DRAM bandwidth) + one kernel's fixed cost
(``card/timing/roofline.py``); "of op roofline" is that over the measured time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

GRANITE = (512, 4096, 12800)
SMALL = (256, 1024, 2816)
TINY = (64, 128, 256)


class SwiGLU(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down = torch.nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def op_roofline_s(tokens: int, hidden: int, inter: int, config) -> float:
    from torch_spyre.card.timing.roofline import OpWork, op_roofline_s as roofline

    reads = 2 * (tokens * hidden + 3 * hidden * inter)  # fp16: every dim a whole number of sticks here
    return roofline(OpWork(2.0 * tokens * hidden * inter * 3, 0.0, reads, 2 * tokens * hidden, "mlp"), config)


def measure(tokens: int, hidden: int, inter: int, on: bool) -> dict:
    """Kernels and simulated µs of one steady call of the compiled MLP, ``fused_mlp`` off or on."""
    import torch_spyre
    import torch_spyre.profiler
    from torch_spyre.compiler import optimizations

    torch.compiler.reset()
    t0 = time.perf_counter()
    with torch_spyre.timing_only(), torch.no_grad(), \
            contextlib.nullcontext() if on else optimizations.disabled("fused_mlp"):
        with torch.device("meta"):
            model = SwiGLU(hidden, inter).half()
        model = model.to_empty(device="spyre")
        x = torch.empty(1, tokens, hidden, dtype=torch.float16, device="spyre")
        compiled = torch.compile(model, dynamic=False)
        compiled(x)  # compiles, relayouts the weights once, prepares and times the programs
        with torch_spyre.profiler.profile() as prof:
            compiled(x)
    kernels = [r for r in prof.events() if r.kind == "kernel"]
    return {"kernels": len(kernels), "us": sum(k.duration for k in kernels) * 1e6,
            "names": [k.name for k in kernels], "host_s": round(time.perf_counter() - t0, 1)}


def row(shape: tuple[int, int, int]) -> dict:
    from torch_spyre.device import cards

    off, on = (measure(*shape, on=v) for v in (False, True))
    roof = op_roofline_s(*shape, cards.config()) * 1e6
    return {"shape": "x".join(map(str, shape)), "op_roofline_us": round(roof, 1),
            "off": {**off, "us": round(off["us"], 1), "of_op_roofline": round(roof / off["us"], 4)},
            "on": {**on, "us": round(on["us"], 1), "of_op_roofline": round(roof / on["us"], 4)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny MLP only (seconds)")
    args = ap.parse_args(argv)
    import torch_spyre  # noqa: F401
    from torch_spyre._torch.inductor import disable_fx_graph_cache

    disable_fx_graph_cache()
    rows = [row(s) for s in ([TINY] if args.tiny else [GRANITE, SMALL])]
    print("| SwiGLU MLP fp16 tokens x hidden x intermediate | kernels off | kernels on | off µs | on µs | "
          "op roofline µs | of op roofline off | on |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['off']['kernels']} | {r['on']['kernels']} | {r['off']['us']:,.1f} | "
              f"{r['on']['us']:,.1f} | {r['op_roofline_us']:,.1f} | {100 * r['off']['of_op_roofline']:.1f} % | "
              f"{100 * r['on']['of_op_roofline']:.1f} % |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LLM-sized fp16 GEMMs and decode GEMVs from the matmul generator, against the op roofline (issue 13).

    python benchmarks/gemm_roofline.py            # the table (markdown), then the same rows as JSON
    python benchmarks/gemm_roofline.py --check    # also run a smaller shared-operand GEMM on the card vs torch,
                                                  # and exit 1 when the GEMMs average under 85 %, a GEMM is
                                                  # under 75 % or a GEMV under 95 %

Simulated device time of the generated program on the default card (card/timing/, deterministic): the
programs are built and timed, never executed on the host (the --check shape is executed). op roofline =
max(2*M*N*K at the whole chip's peak, A and B read once and C written once at DRAM bandwidth) + fixed cost
(card/timing/roofline.py). For the GEMVs the streaming ceiling is that same roofline: they are bound by
streaming the weight from DRAM. "scheme" is how the operands travel (decisions.work_division).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.programs import run_on_card  # noqa: E402
from torch_spyre.card import Card, CardConfig, StickLayout  # noqa: E402
from torch_spyre.card.dlfloat16 import round_float32  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.compiler.access import TensorView  # noqa: E402
from torch_spyre.compiler.codegen.matmul import build_matmul, mm_spec  # noqa: E402

GEMMS = [(512, 4096, 12800), (1024, 4096, 4096), (1024, 4096, 14336), (1024, 14336, 4096), (4096, 4096, 4096),
         (2048, 4096, 4096)]
GEMVS = [(1, 4096, 4096), (1, 4096, 14336)]
TARGETS = {"gemm_average": 0.85, "gemm_each": 0.75, "gemv_each": 0.95}


def spec(M: int, K: int, N: int):
    def buf(name: str, shape: tuple[int, int]) -> TensorView:
        return TensorView.whole(name, StickLayout(shape, -1, "dlfloat16"))

    return mm_spec(buf("a", (M, K)), buf("b", (K, N)), buf("c", (M, N)), name=f"mm_{M}x{K}x{N}")


def measure(M: int, K: int, N: int, cfg: CardConfig) -> dict:
    t0 = time.perf_counter()
    prog, dec = build_matmul(spec(M, K, N), cfg)
    t = time_program(prog, cfg)
    s = dec.work_division["split"]
    return {"shape": f"{M}x{K}x{N}", "sim_us": round(t.total_s * 1e6, 1), "op_roofline_us": round(t.roofline_s * 1e6, 1),
            "of_op_roofline": round(t.roofline_fraction, 4), "tflops": round(2 * M * N * K / t.total_s / 1e12, 1),
            "bound": t.bottleneck, "split": f"m{s['M']} n{s['N_sticks']} k{s['K_split']}" + _leftover(prog),
            "scheme": dec.work_division["operand_sharing"]["scheme"].split(" (")[0],
            "dram_read_mb": round(t.bytes["dram_read"] / 1e6, 1), "ring_mb": round(t.bytes["ring"] / 1e6, 1),
            "host_s": round(time.perf_counter() - t0, 1)}


def _leftover(prog) -> str:
    """A note for the split column when the plan splits its leftover N sticks by K (Split.leftover_k)."""
    found = re.search(r"leftover sticks split by K over (\d+) cores", prog.metadata["split"])
    return f" + leftover sticks by K over {found.group(1)}" if found else ""


def check(cfg: CardConfig) -> float:
    """A GEMM small enough to execute, with A shared over the ring: max error relative to max |result|."""
    M, K, N = 256, 512, 1024
    prog, dec = build_matmul(spec(M, K, N), cfg)
    assert dec.work_division["operand_sharing"]["scheme"].startswith("A forwarded"), dec.work_division
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(M, K, generator=g) * 0.1).half(), (torch.randn(K, N, generator=g) * 0.1).half()
    outs, _ = run_on_card(Card(0, cfg), prog, {"a": a, "b": b})
    dl = lambda x: torch.from_numpy(round_float32(x.float().numpy()))  # noqa: E731
    want = dl(a) @ dl(b)
    return ((outs["c"].float() - want).abs().max() / want.abs().max()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="execute a 256x512x1024 shared-A GEMM on the card vs torch")
    args = ap.parse_args()
    cfg = CardConfig()
    print(f"card: {cfg.num_cores} cores x {cfg.corelets_in_use} corelets, chip fp16 peak "
          f"{cfg.chip_peak_fp16_flops / 1e12:.1f} TFLOP/s, DRAM read {cfg.dram_read_bandwidth / 1e9:.0f} GB/s\n")
    rows = []
    print("| M x K x N | simulated µs | op roofline µs | of op roofline | TFLOP/s | bound | split | scheme | "
          "DRAM read MB | ring MB |")
    print("|---|---:|---:|---:|---:|---|---|---|---:|---:|")
    for shape in GEMMS + GEMVS:
        r = measure(*shape, cfg)
        rows.append(r)
        print(f"| {r['shape']} | {r['sim_us']:,.1f} | {r['op_roofline_us']:,.1f} | {100 * r['of_op_roofline']:.1f} % | "
              f"{r['tflops']} | {r['bound']} | {r['split']} | {r['scheme']} | {r['dram_read_mb']} | {r['ring_mb']} |",
              flush=True)
    gemm = [r["of_op_roofline"] for r in rows[:len(GEMMS)]]
    gemv = [r["of_op_roofline"] for r in rows[len(GEMMS):]]
    summary = {"gemm_average": sum(gemm) / len(gemm), "gemm_min": min(gemm), "gemv_min": min(gemv),
               "targets": TARGETS}
    print(f"\nGEMMs: average {100 * summary['gemm_average']:.1f} % of the op roofline (target "
          f"{100 * TARGETS['gemm_average']:.0f} %), lowest {100 * summary['gemm_min']:.1f} % (target "
          f"{100 * TARGETS['gemm_each']:.0f} %); GEMVs: lowest {100 * summary['gemv_min']:.1f} % of the streaming "
          f"ceiling (target {100 * TARGETS['gemv_each']:.0f} %)")
    failed = []
    if args.check:
        summary["check_rel_err"] = check(cfg)
        print(f"check: 256x512x1024 with A shared over the ring, executed on the card: max error "
              f"{summary['check_rel_err']:.1e} of the largest output")
        if summary["gemm_average"] < TARGETS["gemm_average"]:
            failed.append(f"the GEMMs average {100 * summary['gemm_average']:.1f} % of the op roofline, under "
                          f"{100 * TARGETS['gemm_average']:.0f} %")
        if summary["gemm_min"] < TARGETS["gemm_each"]:
            failed.append(f"a GEMM at {100 * summary['gemm_min']:.1f} % of the op roofline, under "
                          f"{100 * TARGETS['gemm_each']:.0f} %")
        if summary["gemv_min"] < TARGETS["gemv_each"]:
            failed.append(f"a GEMV at {100 * summary['gemv_min']:.1f} % of the streaming ceiling, under "
                          f"{100 * TARGETS['gemv_each']:.0f} %")
        if summary["check_rel_err"] > 2e-3:
            failed.append(f"the executed GEMM is off torch by {summary['check_rel_err']:.1e} of its largest output")
    print(json.dumps({"rows": rows, "summary": summary}))
    if failed:
        sys.exit("--check failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()

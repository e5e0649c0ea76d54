"""The matmul-family generator on the simulated card: chosen work division and tiles, simulated time,
fraction of the op roofline, against the naive division (output rows only, no N split, no K-split).

    python benchmarks/matmul.py            # the table
    python benchmarks/matmul.py --check    # also run every chosen program on the card against torch

op roof = the op roofline (card/timing/roofline.py: max(flops at the whole chip's peak, each operand's
bytes once at DRAM bandwidth) + fixed cost) / simulated time; "prog bound" is the program's own bound (its
DRAM bytes, the cores it used), shown for comparison only.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.programs import build_matmul_1024, run_on_card  # noqa: E402
from torch_spyre.card import Card, CardConfig, StickLayout  # noqa: E402
from torch_spyre.card.dlfloat16 import round_float32  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.compiler.access import TensorView  # noqa: E402
from torch_spyre.compiler.codegen.matmul import (  # noqa: E402
    MatmulSpec,
    bmm_spec,
    build_matmul,
    generate_plan,
    linear_spec,
    mm_spec,
    naive_split,
    plan_for_split,
)

DL = "dlfloat16"


def buf(name: str, shape: tuple[int, ...], stick: int = -1) -> TensorView:
    return TensorView.whole(name, StickLayout(tuple(shape), stick, DL))


def mm(M: int, K: int, N: int) -> MatmulSpec:
    return mm_spec(buf("a", (M, K)), buf("b", (K, N)), buf("c", (M, N)), name=f"mm_{M}x{K}x{N}")


def linear(M: int, K: int, N: int, weight_stick: int = -1) -> MatmulSpec:
    """nn.Linear: weight [N, K] sticked on K (its default, the 'wrong' way) or on N (stick 0)."""
    return linear_spec(buf("x", (M, K)), buf("w", (N, K), weight_stick), buf("y", (M, N)), buf("bias", (N,)),
                       name=f"linear_{M}x{K}x{N}" + ("_wN" if weight_stick == 0 else ""))


def bmm(B: int, M: int, K: int, N: int) -> MatmulSpec:
    return bmm_spec(buf("a", (B, M, K)), buf("b", (B, K, N)), buf("c", (B, M, N)), name=f"bmm_{B}x{M}x{K}x{N}")


CASES: list[tuple[str, MatmulSpec]] = [
    ("MiniLM attn proj", mm(128, 384, 384)),
    ("MiniLM FFN up", mm(128, 384, 1536)),
    ("MiniLM FFN down", mm(128, 1536, 384)),
    ("MiniLM FFN up, linear W[N,K]", linear(128, 384, 1536)),
    ("  same, W sticked on N", linear(128, 384, 1536, weight_stick=0)),
    ("  + GELU fused", replace(linear(128, 384, 1536), activation="gelu", name="linear_gelu")),
    ("MiniLM FFN down + residual", replace(linear(128, 1536, 384), residual=buf("res", (128, 384)), name="linear_res")),
    ("1024^3", mm(1024, 1024, 1024)),
    ("2048x1024x2048", mm(2048, 1024, 2048)),
    ("long K", mm(64, 4096, 64)),
    ("odd", mm(100, 70, 130)),
    ("attention scores", bmm(12, 128, 64, 128)),
]


def flops(spec: MatmulSpec) -> int:
    b, M, N, K = spec.dims
    return 2 * b * M * N * K


def row(label: str, spec: MatmulSpec, cfg: CardConfig) -> dict:
    t0 = time.perf_counter()
    prog, dec = build_matmul(spec, cfg)
    build_s = time.perf_counter() - t0
    t = time_program(prog, cfg)
    naive = plan_for_split(spec, naive_split(spec, cfg), cfg)
    t_naive = time_program(generate_plan(spec, naive.split, naive.tiles, cfg), cfg)
    verified = time_program(build_matmul(spec, cfg, verify_top=4)[0], cfg)
    s = dec.work_division["split"]
    return {
        "case": label, "spec": spec, "prog": prog,
        "shape": "x".join(map(str, spec.dims[:2])) + f"x{spec.dims[3]}x{spec.dims[2]}",
        "split": f"b{s['batch']} m{s['M']} n{s['N_sticks']} k{s['K_split']}",
        "tiles": f"{dec.tiling['rows']}r {dec.tiling['N_tile_sticks']}n {dec.tiling['K_tile_sticks']}k"
                 + (" Ares" if dec.tiling["a_resident"] else ""),
        "us": t.total_s * 1e6, "est": dec.overlap["estimate"]["total_us"], "op": t.roofline_fraction,
        "prog": t.program_bound_fraction, "bound": t.bottleneck, "naive": str(naive.split),
        "naive_us": t_naive.total_s * 1e6, "build_s": build_s, "verified_us": verified.total_s * 1e6,
    }


def check(card: Card, spec: MatmulSpec, prog) -> float:
    """Max error of the card's result against torch on the DLFloat16 inputs, relative to the max |result|."""
    g = torch.Generator().manual_seed(0)
    inputs = {}
    for op in prog.operands:
        if op.access == "in":
            inputs[op.name] = (torch.randn(*op.host_shape, generator=g) * 0.1).half()
    outs, _ = run_on_card(card, prog, inputs)
    dl = {k: torch.from_numpy(round_float32(v.float().numpy())) for k, v in inputs.items()}
    if spec.kind == "linear":
        want = torch.nn.functional.linear(dl["x"], dl["w"], dl["bias"])
    else:
        want = dl["a"] @ dl["b"]
    if spec.activation:
        want = {"gelu": torch.nn.functional.gelu, "relu": torch.relu}[spec.activation](want)
    if spec.residual is not None:
        want = want + dl[spec.residual.name]
    got = outs[spec.out.name]
    return ((got - want).abs().max() / want.abs().max()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="run each chosen program on the card against torch")
    args = ap.parse_args()
    cfg = CardConfig()
    card = Card(0, cfg) if args.check else None
    print(f"card: {cfg.num_cores} cores x {cfg.corelets_in_use} corelet(s), {cfg.clock_hz / 1e9:.1f} GHz, "
          f"fp16 peak {cfg.peak_fp16_flops / 1e12:.1f} TFLOP/s, DRAM read {cfg.dram_read_bandwidth / 1e9:.0f} GB/s, "
          f"kernel fixed cost {cfg.kernel_fixed_cost_s * 1e6:.0f} us\n")
    head = (f"{'case':<30} {'B x M x K x N':<16} {'split':<15} {'tiles':<17} {'est us':>7} {'sim us':>8} "
            f"{'op roof':>7} {'prog bound':>10}  {'bound':<24} {'naive split':<15} {'naive us':>8} {'speedup':>7} "
            f"{'verified':>8} {'build s':>7}")
    if args.check:
        head += f" {'rel err':>8}"
    print(head)
    print("-" * len(head))
    for label, spec in CASES:
        r = row(label, spec, cfg)
        line = (f"{r['case']:<30} {r['shape']:<16} {r['split']:<15} {r['tiles']:<17} {r['est']:7.1f} {r['us']:8.1f} "
                f"{r['op']:7.0%} {r['prog']:10.0%}  {r['bound']:<24} {r['naive']:<15} {r['naive_us']:8.1f} "
                f"{r['naive_us'] / r['us']:6.2f}x {r['verified_us']:8.1f} {r['build_s']:7.2f}")
        if args.check:
            line += f" {check(card, spec, r['prog']):8.1e}"
        print(line, flush=True)
    hand = time_program(build_matmul_1024().program, cfg)
    print(f"\nfor reference, the hand-written 1024^3 example (benchmarks/programs.py, 4x8 grid, whole K per core): "
          f"{hand.total_s * 1e6:.1f} us, {hand.roofline_fraction:.0%} of the op roofline")
    print("tiles: rows per A tile, N and K tile in sticks of 64, Ares = A resident in scratchpad; "
          "op roof = op roofline / simulated time;\nverified = build_matmul(verify_top=4): the "
          "model's 4 cheapest plans timed on the card model, the fastest kept; build s = analytic build time")


if __name__ == "__main__":
    main()

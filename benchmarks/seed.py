"""The seed's table, reproduced (issue 13 §6): each optimization of the compiler timed off and on.

    python benchmarks/seed.py            # the table, markdown
    python benchmarks/seed.py --json     # the same rows as JSON
    python benchmarks/seed.py --tiny     # tiny shapes (seconds; what tests/benchmarks/test_seed.py runs)

Every figure is simulated device time (card/timing, deterministic), measured by generating the workload's
kernel with the optimization switched off and on (``torch_spyre.compiler.optimizations.disabled``, the same
switch as ``TORCH_SPYRE_DISABLE``), never remembered:

- the matmul rows build the matmul generator's program (``build_matmul``) and time it with the card's timing
  model (``time_program``, what a launch in timing-only mode advances the clock by); the corelets row does so
  on a copy of the card configuration with ``corelets_in_use`` 1 (``TORCH_SPYRE_CORELETS_IN_USE=1``);
- the scratchpad row compiles ``torch.softmax`` with ``torch.compile`` on the spyre device and runs it in
  timing-only mode under the profiler (programs generated and timed, not executed);
- the fused MLP row compiles a SwiGLU ``nn.Module`` MLP the same way (``benchmarks/fused_mlp.py``): off, its
  matmul and pointwise kernels; on, one kernel;
- the on-chip relayout row relayouts an fp16 tensor in place with the compiler's ``relayout_in_place``
  (``benchmarks/onchip_relayout.py``), at the size whose ring time is nearest the seed's 1.1 µs: off, through
  device memory; on, over the ring.

"change" is on against off (negative: on is faster); "seed" is the seed's published figure for the same
optimization (docs/compiler.md, "The optimizations, off and on").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_roofline import spec as gemm_spec  # noqa: E402
from torch_spyre.card import CardConfig  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.compiler import optimizations  # noqa: E402
from torch_spyre.compiler.codegen.matmul import build_matmul  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    """The workloads of each row: matmul shapes M x K x N (fp16), softmax rows x cols (fp16) and cores."""

    tiling: tuple[tuple[int, int, int], ...]
    sharing: tuple[tuple[int, int, int], ...]
    corelets: tuple[tuple[int, int, int], ...]
    softmax: tuple[tuple[int, int, int | None], ...]  # (rows, cols, cores; None: the core count's choice)
    relayout: tuple[int, int] | None  # fp16 rows x cols relayouted in place; None: ring time nearest 1.1 µs
    mlp: tuple[tuple[int, int, int], ...] = ()  # SwiGLU MLPs: tokens x hidden x intermediate (fp16)


FULL = Sizes(tiling=((256, 512, 1024), (1024, 1024, 1024), (512, 4096, 4096)),
             sharing=((1024, 1024, 1024), (512, 4096, 4096)),
             corelets=((1024, 1024, 1024), (512, 4096, 4096)),
             softmax=((512, 1024, 1), (512, 1024, None)), relayout=None,
             mlp=((512, 4096, 12800), (256, 1024, 2816)))  # Granite 3.3 8B's MLP, a smaller one
TINY = Sizes(tiling=((64, 128, 256),), sharing=((128, 256, 512),), corelets=((64, 128, 256),),
             softmax=((64, 128, 1),), relayout=(128, 512), mlp=((64, 128, 256),))

SEED = {
    "matmul_tiling": "kernel time -29 % to -69 %",
    "scratchpad_planning": "softmax 512x1024 fp16, one core: 32.51 -> 23.67 us (1.37x)",
    "fused_mlp": "core utilization ~2/3 -> 80 %, kernel time -17 %",
    "onchip_relayout": "device-memory round trip 80 us -> ring exchange 1.1 us (73x)",
    "corelets": "(no seed figure; IBM's stack drives one corelet per core)",
    "ring_sharing": "(no seed figure; Spyre's dataflow design)",
}


@dataclass
class Measurement:
    workload: str
    off_us: float
    on_us: float

    @property
    def change(self) -> float:
        """On against off: -0.3 is 30 % less time with the optimization on."""
        return self.on_us / self.off_us - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "change": round(self.change, 4), "off_over_on": round(self.off_us / self.on_us, 3)}


@dataclass
class Row:
    optimization: str
    switch: str  # how to switch it off
    seed: str
    measurements: list[Measurement] = field(default_factory=list)
    status: str = "built"
    how: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"optimization": self.optimization, "switch": self.switch, "status": self.status, "seed": self.seed,
                "how": self.how, "measurements": [m.to_dict() for m in self.measurements]}


# --- measuring ------------------------------------------------------------------------------------
def matmul_us(shape: tuple[int, int, int], config: CardConfig, off: tuple[str, ...] = ()) -> float:
    """Simulated µs of the matmul generator's fp16 program for M x K x N with ``off`` switched off."""
    with optimizations.disabled(*off):
        program, _ = build_matmul(gemm_spec(*shape), config)
    return time_program(program, config).total_s * 1e6


def _mm_name(shape: tuple[int, int, int]) -> str:
    return "mm fp16 " + "x".join(map(str, shape))


def matmul_switch_row(name: str, switch: str, shapes, config: CardConfig, how: str) -> Row:
    row = Row(name, switch, SEED[name], how=how)
    for shape in shapes:
        row.measurements.append(Measurement(_mm_name(shape), matmul_us(shape, config, (name,)),
                                            matmul_us(shape, config)))
    return row


def corelets_row(shapes, config: CardConfig) -> Row:
    one = config.model_copy(update={"corelets_in_use": 1})
    row = Row("corelets", "TORCH_SPYRE_CORELETS_IN_USE=1 (card configuration: corelets_in_use)", SEED["corelets"],
              how="matmul generator's program timed on the card model with corelets_in_use 1 (off) and 2 (on)")
    for shape in shapes:
        row.measurements.append(Measurement(_mm_name(shape), matmul_us(shape, one), matmul_us(shape, config)))
    return row


def softmax_us(rows: int, cols: int, cores: int | None, off: tuple[str, ...] = ()) -> float:
    """Simulated µs of ``torch.softmax(x, -1)`` over fp16 [rows, cols], compiled for the spyre device and run
    in timing-only mode (on ``cores`` cores when given) with ``off`` switched off."""
    import contextlib

    import torch

    import torch_spyre
    import torch_spyre.profiler
    from torch_spyre.compiler.core_count import forcing

    compiled = torch.compile(lambda x: torch.softmax(x, -1))
    with torch_spyre.timing_only(), optimizations.disabled(*off), \
            (forcing(cores) if cores else contextlib.nullcontext()):
        x = torch.empty(rows, cols, dtype=torch.float16, device="spyre")
        compiled(x)  # compiles, prepares and times the program
        with torch_spyre.profiler.profile() as prof:
            compiled(x)
    kernels = [e for e in prof.key_averages() if e.kind == "kernel"]
    return sum(e.device_time for e in kernels) * 1e6


def scratchpad_row(sizes) -> Row:
    row = Row("scratchpad_planning", "TORCH_SPYRE_DISABLE=scratchpad_planning", SEED["scratchpad_planning"],
              how="torch.compile(softmax) on spyre, timing-only run under the profiler; off: every pass of the "
                  "reduction loads its rows from device memory again")
    for rows, cols, cores in sizes:
        where = f"{cores} core" + ("s" if cores != 1 else "") if cores else "the core count's cores"
        row.measurements.append(Measurement(f"softmax fp16 {rows}x{cols}, {where}",
                                            softmax_us(rows, cols, cores, ("scratchpad_planning",)),
                                            softmax_us(rows, cols, cores)))
    return row


def mlp_row(shapes) -> Row:
    from benchmarks.fused_mlp import measure

    row = Row("fused_mlp", "TORCH_SPYRE_DISABLE=fused_mlp", SEED["fused_mlp"],
              how="torch.compile of a SwiGLU nn.Module MLP (no_grad) on spyre, timing-only run under the profiler; "
                  "off: the matmul kernels (SiLU in the gate's epilogue), the gate product's pointwise kernel, h "
                  "through device memory; on: one kernel with h in scratchpad")
    for shape in shapes:
        off, on = (measure(*shape, on=v) for v in (False, True))
        tokens, hidden, inter = shape
        row.measurements.append(Measurement(f"SwiGLU MLP fp16, {tokens} tokens, {hidden} -> {inter} -> {hidden} "
                                            f"({off['kernels']} -> {on['kernels']} kernels)", off["us"], on["us"]))
    return row


def relayout_row(shape: tuple[int, int] | None, config: CardConfig) -> Row:
    """The exchange the seed describes, at the size whose ring time is nearest its 1.1 µs: the compiler's
    in-place relayout (``relayout_in_place``) of an fp16 tensor from sticked on dim 1 to dim 0, off (scratch
    allocation and copy back through device memory) and on (stick blocks exchanged over the ring between the
    scratchpads), timing-only, the stream's records (``benchmarks/onchip_relayout.py``)."""
    from benchmarks.onchip_relayout import measure, ring_s, sized_to_published

    rows, cols = shape or sized_to_published(config)
    off, on = measure(rows, cols, on=False), measure(rows, cols, on=True)
    row = Row("onchip_relayout", "TORCH_SPYRE_DISABLE=onchip_relayout", SEED["onchip_relayout"],
              how="benchmarks/onchip_relayout.py: relayout_in_place of an fp16 tensor (what ensure_weight_layout "
                  "runs), timing-only; off: the relayout kernel into a scratch allocation and the copy back, on: "
                  "one kernel, its all-to-all over the ring; the ring time is the on kernel's span of ring sends")
    row.measurements.append(Measurement(
        f"in-place relayout fp16 {rows}x{cols} ({rows * cols * 2 // 1024} KiB), stick dim 1 -> 0, all-to-all among "
        f"the cores: ring {ring_s((rows, cols), config) * 1e6:.2f} µs of the on kernel", off["us"], on["us"]))
    return row


def table(sizes: Sizes = FULL, config: CardConfig | None = None) -> list[Row]:
    config = config or CardConfig()
    how = "matmul generator's program (build_matmul) timed on the card model (time_program)"
    return [
        matmul_switch_row("matmul_tiling", "TORCH_SPYRE_DISABLE=matmul_tiling", sizes.tiling, config,
                          how + "; off: the naive split (output rows only) and the first tiles that fit"),
        scratchpad_row(sizes.softmax),
        mlp_row(sizes.mlp),
        relayout_row(sizes.relayout, config),
        corelets_row(sizes.corelets, config),
        matmul_switch_row("ring_sharing", "TORCH_SPYRE_DISABLE=ring_sharing", sizes.sharing, config,
                          how + "; off: every core loads its own A from device memory"),
    ]


# --- printing -------------------------------------------------------------------------------------
def markdown(rows: list[Row]) -> str:
    lines = ["| optimization | workload | off µs | on µs | our change | seed | switch off with |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        if not r.measurements:
            lines.append(f"| {r.optimization} | {r.status} | — | — | — | {r.seed} | {_switch(r)} |")
            continue
        cells = lambda f: "<br>".join(f(m) for m in r.measurements)  # noqa: E731
        workload = cells(lambda m: m.workload) + ("" if r.status == "built" else f" ({r.status})")
        lines.append(f"| {r.optimization} | {workload} | {cells(lambda m: f'{m.off_us:,.2f}')} | "
                     f"{cells(lambda m: f'{m.on_us:,.2f}')} | "
                     f"{cells(lambda m: f'{100 * m.change:+.0f} % ({m.off_us / m.on_us:.2f}x)')} | "
                     f"{r.seed} | {_switch(r)} |")
    return "\n".join(lines)


def _switch(r: Row) -> str:
    return f"`{r.switch}`" if r.status == "built" else r.switch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of markdown")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke test of the table, seconds)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = table(TINY if args.tiny else FULL)
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows], "host_s": round(time.perf_counter() - t0, 1)}))
    else:
        print(markdown(rows))
        print(f"\n(simulated device time; {time.perf_counter() - t0:.0f} s of host time to measure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

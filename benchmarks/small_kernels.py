"""Small kernels on few cores: the core count ``compiler/core_count.py`` picks, against the same kernel
forced onto 1, 2, 4, 8, 16 and 32 cores, in simulated time (``card/timing``'s ``time_program``, kernel
fixed cost included) and in instructions (what the simulator interprets on the host).

    python benchmarks/small_kernels.py          # the table
    python benchmarks/small_kernels.py --quick  # the small kernels only
    python benchmarks/small_kernels.py --wide   # 69 pointwise kernels, the rule against 32 cores only

Every figure is simulated and deterministic. "rule / 32" is the rule's time over the time on all 32
cores (at most 1 means fewer cores cost nothing); "best" is the fastest forced count. A matmul forced
to n cores takes the cost model's cheapest plan on at most n.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch_spyre.card import CardConfig, StickLayout, load_config  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.compiler.access import TensorView  # noqa: E402
from torch_spyre.compiler.codegen import pointwise  # noqa: E402
from torch_spyre.compiler.codegen.attention import AttentionSpec, build_attention  # noqa: E402
from torch_spyre.compiler.codegen.gather import GatherSpec, build_gather  # noqa: E402
from torch_spyre.compiler.codegen.matmul import build_matmul, mm_spec  # noqa: E402
from torch_spyre.compiler.core_count import forcing  # noqa: E402
from torch_spyre.compiler.kernel_ir import BufferSpec, KernelSpec, NodeSpec, Op  # noqa: E402
from torch_spyre.program import Program  # noqa: E402

FORCED = (1, 2, 4, 8, 16, 32)
_DEVICE = {"float32": "float32", "float16": "dlfloat16"}


# --- kernels --------------------------------------------------------------------------------------
def _buffer(name: str, shape: list[int], role: str, dtype: str) -> BufferSpec:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return BufferSpec(name, dtype, list(shape), strides[::-1], 0, role)


def _places(spec: KernelSpec) -> dict[str, TensorView]:
    return {b.name: TensorView.whole(b.name, StickLayout(tuple(b.size), -1, _DEVICE[b.dtype])) for b in spec.buffers}


def elementwise(shape: tuple[int, ...], op: str = "add", dtype: str = "float32") -> Callable[[CardConfig], Program]:
    """out = a + b (``op`` "add"), or out = exp(a) ("exp"), over a row-major ``shape``."""
    index = " + ".join(f"{st}*x{d}" for d, st in enumerate(_buffer("", list(shape), "", dtype).stride))
    ops = [Op(0, "load", [], dtype, {"buffer": "a", "index": index})]
    if op == "add":
        ops += [Op(1, "load", [], dtype, {"buffer": "b", "index": index}), Op(2, "add", [0, 1], dtype)]
    else:
        ops += [Op(1, op, [0], dtype), Op(2, "identity", [1], dtype)]
    ops.append(Op(3, "store", [2], dtype, {"buffer": "out", "index": index}))
    ins = ["a", "b"] if op == "add" else ["a"]
    spec = KernelSpec(f"{op}_{'x'.join(map(str, shape))}_{dtype}", list(shape), [],
                      [NodeSpec("op0", list(shape), [], "full", ops)],
                      [_buffer(n, list(shape), "input", dtype) for n in ins] + [_buffer("out", list(shape), "output", dtype)])
    return lambda cfg: pointwise.generate(spec, _places(spec), cfg)


def row_sum(rows: int, cols: int, dtype: str = "float32") -> Callable[[CardConfig], Program]:
    ops = [Op(0, "load", [], dtype, {"buffer": "a", "index": f"{cols}*x0 + r0"}),
           Op(1, "reduction", [0], dtype, {"reduction": "sum"}),
           Op(2, "store", [1], dtype, {"buffer": "out", "index": "x0"})]
    spec = KernelSpec(f"sum_{rows}x{cols}", [rows], [cols], [NodeSpec("op0", [rows], [cols], "reduction", ops)],
                      [_buffer("a", [rows, cols], "input", dtype), _buffer("out", [rows], "output", dtype)])
    return lambda cfg: pointwise.generate(spec, _places(spec), cfg)


def matmul(M: int, K: int, N: int) -> Callable[[CardConfig], Program]:
    def view(name: str, shape: tuple[int, int]) -> TensorView:
        return TensorView.whole(name, StickLayout(shape, -1, "dlfloat16"))

    spec = mm_spec(view("a", (M, K)), view("b", (K, N)), view("c", (M, N)), name=f"mm_{M}x{K}x{N}")
    return lambda cfg: build_matmul(spec, cfg)[0]


def embedding(vocab: int, dim: int, tokens: int) -> Callable[[CardConfig], Program]:
    spec = GatherSpec.embedding(vocab, dim, (1, tokens), name=f"emb_{vocab}x{dim}_{tokens}")
    return lambda cfg: build_gather(spec, cfg)[0]


def attention(batch: int, heads: int, seq: int, head_dim: int) -> Callable[[CardConfig], Program]:
    spec = AttentionSpec.build(batch, heads, seq, head_dim, name=f"sdpa_b{batch}h{heads}l{seq}d{head_dim}")
    return lambda cfg: build_attention(spec, cfg)[0]


SMALL: dict[str, Callable[[CardConfig], Program]] = {
    "add 64x64 fp32": elementwise((64, 64)),
    "add 64x64 fp16": elementwise((64, 64), dtype="float16"),
    "relu-sized 1x1024 fp32 add": elementwise((1, 1024)),
    "add 96x200 fp32": elementwise((96, 200)),
    "add 128x128 fp32": elementwise((128, 128)),
    "exp 64x64 fp16": elementwise((64, 64), "exp", "float16"),
    "exp 128x384 fp16": elementwise((128, 384), "exp", "float16"),
    "row sum 64x300 fp32": row_sum(64, 300),
    "mm 64x64x64 fp16": matmul(64, 64, 64),
    "mm 128x128x128 fp16": matmul(128, 128, 128),
    "embedding 1000x64, 8 tokens": embedding(1000, 64, 8),
    "embedding 30522x384, 16 tokens": embedding(30522, 384, 16),
    "attention B1 H2 L32 D32": attention(1, 2, 32, 32),
}
LARGE: dict[str, Callable[[CardConfig], Program]] = {
    "add 256x256 fp32": elementwise((256, 256)),
    "add 512x512 fp16": elementwise((512, 512), dtype="float16"),
    "row sum 512x1024 fp32": row_sum(512, 1024),
    "mm 512x512x512 fp16": matmul(512, 512, 512),
    "embedding 30522x384, 128 tokens": embedding(30522, 384, 128),
    "attention MiniLM B1 H12 L128 D32": attention(1, 12, 128, 32),
}


def wide() -> dict[str, Callable[[CardConfig], Program]]:
    """Pointwise kernels of many small shapes: adds and exps in fp32 and fp16, and row sums."""
    shapes = [(1, 64), (1, 1024), (8, 64), (16, 128), (32, 64), (32, 256), (64, 64), (64, 128), (48, 96),
              (100, 100), (128, 64), (128, 128), (64, 512), (200, 96), (256, 128), (128, 384)]
    out = {f"{op} {r}x{c} {dt}": elementwise((r, c), op, dt)
           for dt in ("float32", "float16") for r, c in shapes for op in ("add", "exp")}
    out.update({f"sum {r}x{c} float32": row_sum(r, c) for r, c in [(8, 1024), (16, 768), (64, 300), (128, 384), (256, 64)]})
    return out


# --- measuring ------------------------------------------------------------------------------------
def live_cores(program: Program) -> int:
    return sum(1 for ins in program.cores.values() if ins)


def instructions(program: Program) -> int:
    return sum(len(ins) for ins in program.cores.values())


def sweep(build: Callable[[CardConfig], Program], config: CardConfig, counts=FORCED) -> dict:
    """The rule's program and the same kernel forced onto each of ``counts``: cores, instructions and
    simulated seconds of each."""
    rule = build(config)
    out = {"rule": (live_cores(rule), instructions(rule), time_program(rule, config).total_s),
           "work_cycles": rule.metadata["decisions"]["core_count"]["work_cycles"], "forced": {}}
    for n in counts:
        with forcing(n):
            p = build(config)
        out["forced"][n] = (live_cores(p), instructions(p), time_program(p, config).total_s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the small kernels only")
    ap.add_argument("--wide", action="store_true", help="many small pointwise kernels, against 32 cores only")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    config = load_config()
    if args.wide:
        return _wide(config)
    cases = dict(SMALL) if args.quick else {**SMALL, **LARGE}
    print("| kernel | work (cycles) | rule: cores | rule: µs | 32 cores: µs (cores used) | best forced: µs (cores) "
          "| rule / 32 | rule / best | instructions rule / 32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    not_slower = 0
    for name, build in cases.items():
        r = sweep(build, config)
        cores, instr, t = r["rule"]
        all_cores = r["forced"][max(FORCED)]
        best_n = min(r["forced"], key=lambda n: r["forced"][n][2])
        best = r["forced"][best_n]
        not_slower += t <= all_cores[2]
        print(f"| {name} | {r['work_cycles']:,} | {cores} | {t * 1e6:.3f} | {all_cores[2] * 1e6:.3f} ({all_cores[0]}) "
              f"| {best[2] * 1e6:.3f} ({best[0]}) | {t / all_cores[2]:.4f} | {t / best[2]:.4f} "
              f"| {instr} / {all_cores[1]} |", flush=True)
    print(f"\nthe rule's program is no slower than the 32-core one for {not_slower} of {len(cases)} kernels")
    return 0


def _wide(config: CardConfig) -> int:
    slower = []
    print("| kernel | work (cycles) | rule: cores | rule: µs | 32 cores: µs (cores used) | difference |")
    print("|---|---:|---:|---:|---:|---:|")
    cases = wide()
    for name, build in cases.items():
        r = sweep(build, config, counts=(32,))
        (cores, _, t), (c32, _, t32) = r["rule"], r["forced"][32]
        print(f"| {name} | {r['work_cycles']:,} | {cores} | {t * 1e6:.3f} | {t32 * 1e6:.3f} ({c32}) "
              f"| {(t - t32) * 1e9:+.1f} ns |", flush=True)
        if t > t32:
            slower.append((t - t32, name))
    worst = f", the most by {max(slower)[0] * 1e9:.1f} ns ({max(slower)[1]})" if slower else ""
    print(f"\n{len(slower)} of {len(cases)} kernels are slower on the rule's cores than on 32{worst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

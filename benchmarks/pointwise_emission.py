"""Host cost of the pointwise generator on a kernel that writes many small instructions (issue 9 §3).

    python benchmarks/pointwise_emission.py                      # this checkout, --rows 64
    python benchmarks/pointwise_emission.py --against /work/main # the same kernel on another checkout too
    python benchmarks/pointwise_emission.py --rows 128 --json

The kernel is the first one of pegasus_x's compile (``spyre_fused__to_copy_add_arange_constant_pad_nd``),
its pointwise node alone: sinusoidal positions added to an embedding padded from ``--data-rows`` rows
to ``--rows`` (block-local attention pads to its block). The positions are computed from the loop
indices used as data (``index_expr x1``, ``x2 - 32`` as floats). Until the index iota (docs/compiler.md,
"Index values used as data") the generator needed every index value it read as data to be uniform within
a box: every element was a box of its own and every value of the DAG one vector instruction per element
(50,638 instructions at 128 rows). Now the positions are views of the core's iota over whole boxes and
the padding computes nothing, so the program hardly grows with ``--rows``; what is measured is the host
time of the generator and the instructions it wrote.

Rows: host CPU seconds (``time.process_time``, best of ``--repeat``) of the generator's own work
(``PointwiseGenerator.generate``: analysis, emission, scratchpad plan, one program), the instructions it
wrote and microseconds per instruction; then of the module's ``generate``, which also builds the kernel
spread over every core and times both on the card's timing model to keep the faster (``card/timing``'s
host cost is in that figure, not in the first); and digests of both programs' JSON (``Program.to_json``):
two checkouts that print the same digests wrote the same programs. ``--against DIR`` runs the same kernel in
a subprocess with ``PYTHONPATH=DIR``, in the same run, so the two figures see the same machine load.
Host time depends on this machine and its load: compare ratios measured in one run, never assert on
them in tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_DEVICE = {"float32": "float32", "float16": "dlfloat16"}


def sinusoid_pad_spec(batch: int, rows: int, data_rows: int, width: int = 64):
    """out[b, i, j] = (emb[b, i, j] * 8 + pos(i, j)) for i < data_rows, else 0; pos(i, j) is
    sin(i * exp(-c j)) on the first half of j and cos(i * exp(-c (j - half))) on the second; and
    out16 = fp16(out * w[j] + b[j])."""
    from torch_spyre.compiler.kernel_ir import BufferSpec, KernelSpec, NodeSpec, Op

    half, c = width // 2, -0.2971077539347156
    ops: list[Op] = []

    def op(name, *args, dtype="float32", **attrs):
        ops.append(Op(len(ops), name, list(args), dtype, attrs))
        return len(ops) - 1

    in_data = op("lt", op("index_expr", dtype="int64", index="x1"), op("constant", dtype="int64", value=data_rows),
                 dtype="bool")
    emb = op("load", buffer="emb", index=f"{data_rows * width}*x0 + x2 + {width}*x1", guards=[in_data])
    scaled = op("mul", emb, op("constant", value=8.0))
    second = op("ge", op("index_expr", dtype="int64", index="x2"), op("constant", dtype="int64", value=half),
                dtype="bool")
    first = op("lt", op("index_expr", dtype="int64", index="x2"), op("constant", dtype="int64", value=half),
               dtype="bool")
    row = op("index_expr", index="x1")
    cos = op("cos", op("mul", row, op("exp", op("mul", op("index_expr", index=f"x2 - {half}"), op("constant", value=c)))))
    sin = op("sin", op("mul", row, op("exp", op("mul", op("index_expr", index="x2"), op("constant", value=c)))))
    zero = op("constant", value=0.0)
    pos = op("where", second, op("where", second, cos, zero), op("where", first, op("where", first, sin, zero), zero))
    val = op("where", in_data, op("where", in_data, op("add", scaled, pos), zero), zero)
    op("store", val, buffer="out", index=f"{rows * width}*x0 + {width}*x1 + x2")
    # the next node's affine step (a layer norm's weight and bias), over every row, padding included
    affine = op("add", op("mul", val, op("load", buffer="w", index="x2")), op("load", buffer="b", index="x2"))
    op("store", op("to_dtype", affine, dtype="float16"), dtype="float16", buffer="out16",
       index=f"{rows * width}*x0 + {width}*x1 + x2")
    sizes = [batch, rows, width]
    node = NodeSpec("op0", sizes, [], "full", ops)
    buffers = [BufferSpec("emb", "float32", [batch, data_rows, width], [data_rows * width, width, 1], 0, "input"),
               BufferSpec("w", "float32", [width], [1], 0, "input"), BufferSpec("b", "float32", [width], [1], 0, "input"),
               BufferSpec("out", "float32", sizes, [rows * width, width, 1], 0, "output"),
               BufferSpec("out16", "float16", sizes, [rows * width, width, 1], 0, "output")]
    return KernelSpec("pegasus_x_sinusoid_pad", sizes, [], [node], buffers)


def _places(spec):
    from torch_spyre.card import StickLayout
    from torch_spyre.compiler.access import TensorView

    return {b.name: TensorView.whole(b.name, StickLayout(tuple(b.size), len(b.size) - 1, _DEVICE[b.dtype]), 0)
            for b in spec.buffers}


def measure(batch: int, rows: int, data_rows: int, repeat: int) -> dict:
    from torch_spyre.card import load_config
    from torch_spyre.compiler.codegen.pointwise import PointwiseGenerator, generate

    spec = sinusoid_pad_spec(batch, rows, data_rows)
    config = load_config()

    def best_of(fn):
        best, out = None, None
        for _ in range(repeat):
            t0 = time.process_time()
            out = fn()
            dt = time.process_time() - t0
            best = dt if best is None else min(best, dt)
        return best, out

    own, program = best_of(lambda: PointwiseGenerator(spec, _places(spec), config).generate())
    whole, chosen = best_of(lambda: generate(spec, _places(spec), config))
    n = sum(len(v) for v in program.cores.values())
    return {"rows": rows, "generator_s": round(own, 3), "generate_s": round(whole, 3), "instructions": n,
            "us_per_instruction": round(own / n * 1e6, 2),
            "digest": hashlib.sha256(program.to_json().encode()).hexdigest()[:16],
            "chosen_digest": hashlib.sha256(chosen.to_json().encode()).hexdigest()[:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--data-rows", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--against", help="another checkout: the same kernel measured with PYTHONPATH=DIR")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.data_rows > a.rows:
        ap.error("--data-rows must be at most --rows")
    rows = []
    for label, path in [("this checkout", str(ROOT))] + ([("against", a.against)] if a.against else []):
        if a.against and not Path(path, "torch_spyre").is_dir():
            ap.error(f"--against {path}: no torch_spyre package there")
        code = (f"import json, sys; sys.path.insert(0, {path!r}); sys.path.insert(1, {str(ROOT / 'benchmarks')!r}); "
                f"import pointwise_emission as m; print(json.dumps(m.measure({a.batch}, {a.rows}, {a.data_rows}, {a.repeat})))")
        env = {**os.environ, "PYTHONPATH": path}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        rows.append({"checkout": label, "path": path, **json.loads(out.stdout.strip().splitlines()[-1])})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("| checkout | rows | generator s | instructions | µs / instruction | generate s | program digest | chosen digest |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['checkout']} ({r['path']}) | {r['rows']} | {r['generator_s']} | {r['instructions']} | "
              f"{r['us_per_instruction']} | {r['generate_s']} | {r['digest']} | {r['chosen_digest']} |")
    if len(rows) == 2:
        same = all(rows[0][k] == rows[1][k] for k in ("digest", "chosen_digest"))
        print(f"\n{'same programs' if same else 'DIFFERENT programs'}; host time ratio (against / this checkout): "
              f"generator {rows[1]['generator_s'] / rows[0]['generator_s']:.2f}, "
              f"generate {rows[1]['generate_s'] / rows[0]['generate_s']:.2f}")


if __name__ == "__main__":
    main()

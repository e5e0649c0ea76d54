"""Simulated time of the attention (and embedding) programs on the card, against the roofline.

    /work/venv/bin/python benchmarks/attention.py            # table of simulated times
    /work/venv/bin/python benchmarks/attention.py --check    # also run each program on the card vs torch

Time is the card's (card/timing/, deterministic): the kernel's fixed cost plus its instructions. The
roofline is the op roofline (card/timing/roofline.py): max(the op's flops at the whole chip's peak, each
input read and each output written once at DRAM bandwidth) plus the fixed cost, so the fraction says how
close the program is to what the chip allows for the op.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.programs import run_on_card  # noqa: E402
from torch_spyre.card import Card, load_config  # noqa: E402
from torch_spyre.card.layout import StickLayout  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.card.validate import validate  # noqa: E402
from torch_spyre.compiler.codegen.attention import AttentionSpec, build_attention  # noqa: E402
from torch_spyre.compiler.access import TensorView  # noqa: E402
from torch_spyre.compiler.codegen.gather import GatherSpec, build_gather  # noqa: E402


def minilm(batch: int) -> AttentionSpec:
    """all-MiniLM-L6 self-attention: 12 heads of 32, sequence 128, q/k/v as separate [B, H, L, D] buffers."""
    return AttentionSpec.build(batch, 12, 128, 32, name=f"minilm_b{batch}")


def minilm_fused_qkv(batch: int, torch_style_out: bool = False) -> AttentionSpec:
    """The same, reading q, k, v in place from the fused projection [B, L, 3 * 384] (no transposes); the
    output either [B, H, L, D] or, as torch's CPU attention returns it, a view of [B, L, 384]."""
    B, L, H, D = batch, 128, 12, 32
    lay = StickLayout((B, L, 3 * H * D), 2, "dlfloat16")
    strides = (L * 3 * H * D, D, 3 * H * D, 1)
    q, k, v = (TensorView("qkv", lay, (B, H, L, D), strides, part * H * D) for part in range(3))
    out = TensorView.contiguous("out", (B, H, L, D), torch.float16)
    if torch_style_out:
        out = TensorView("out", StickLayout((B, L, H * D), 2, "dlfloat16"), (B, H, L, D), (L * H * D, D, H * D, 1))
    return AttentionSpec(q, k, v, out, name=f"minilm_qkv_b{batch}")


def llama(causal: bool) -> AttentionSpec:
    """Llama-ish prefill: 32 query heads, 8 KV heads (GQA), sequence 1024, head_dim 64."""
    return AttentionSpec.build(1, 32, 1024, 64, kv_heads=8, is_causal=causal, name=f"llama_{'causal' if causal else 'full'}")


ATTENTION_CASES: dict[str, Callable[[], AttentionSpec]] = {
    "MiniLM B=1 H=12 L=128 D=32": lambda: minilm(1),
    "MiniLM B=32 H=12 L=128 D=32": lambda: minilm(32),
    "MiniLM B=32, q/k/v views of fused qkv": lambda: minilm_fused_qkv(32),
    "MiniLM B=32, fused qkv in, [B, L, 384] out": lambda: minilm_fused_qkv(32, torch_style_out=True),
    "Llama H=32 Hkv=8 L=1024 D=64 causal": lambda: llama(True),
    "Llama H=32 Hkv=8 L=1024 D=64 full": lambda: llama(False),
    "Llama decode: 1 query, 4096 keys, B=1": lambda: AttentionSpec.build(1, 32, 1, 64, kv_heads=8, seq_k=4096,
                                                                        name="llama_decode"),
}

GATHER_CASES: dict[str, Callable[[], GatherSpec]] = {
    "embedding 30522x384, B=1 x 128 tokens": lambda: GatherSpec.embedding(30522, 384, (1, 128), name="emb_b1"),
    "embedding 30522x384, B=32 x 128 tokens": lambda: GatherSpec.embedding(30522, 384, (32, 128), name="emb_b32"),
}


def _attention_inputs(spec: AttentionSpec) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {t.name: torch.randn(t.layout.host_shape, generator=g).half() for t in (spec.query, spec.key, spec.value)}


def _check_attention(card: Card, spec: AttentionSpec, program: Any) -> float:
    inp = _attention_inputs(spec)
    out, _ = run_on_card(card, program, inp)

    def view(t: TensorView) -> torch.Tensor:
        return torch.as_strided(inp[t.name].float(), t.shape, t.strides, t.storage_offset)

    ref = F.scaled_dot_product_attention(view(spec.query), view(spec.key), view(spec.value),
                                         is_causal=spec.is_causal, enable_gqa=spec.enable_gqa)
    got = torch.as_strided(out[spec.out.name], spec.out.shape, spec.out.strides, spec.out.storage_offset)
    return (got - ref).abs().max().item()


def _check_gather(card: Card, spec: GatherSpec, program: Any) -> float:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(spec.source.shape, generator=g).half()
    idx = torch.randint(0, spec.source.shape[0], spec.index.shape, generator=g)
    out, _ = run_on_card(card, program, {spec.source.name: w, spec.index.name: idx})
    return (out[spec.out.name] - F.embedding(idx, w).float()).abs().max().item()


def _row(name: str, program: Any, decisions: Any, build_s: float, config: Any, err: float | None) -> dict[str, Any]:
    t = time_program(program, config)
    til = decisions.tiling
    if decisions.kind == "attention":
        tiling = (f"q{til['block_q']} k{til['block_k']} h{til['heads_per_tile']} b{til['batches_per_tile']}"
                  + (f" lanes{til['lane_heads']}" if til["lane_heads"] > 1 else "")
                  + (" deferred-stores" if til["defer_stores"] else ""))
    else:
        tiling = f"{til['positions_per_chunk']} idx x {til['gathers_per_chunk']} gathers"
    return {
        "case": name, "tiling": tiling, "cores": len(program.cores), "sim_us": t.total_s * 1e6,
        "roofline_us": t.roofline_s * 1e6, "fraction": t.roofline_fraction, "bound": t.bottleneck,
        "tflops": t.pe_flops / t.total_s / 1e12, "dram_mb": (t.bytes["dram_read"] + t.bytes["dram_write"]) / 1e6,
        "build_s": build_s, "err": err,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="run each program on the card and compare with torch")
    args = ap.parse_args(argv)
    config = load_config()
    card = Card(0, config) if args.check else None
    rows = []
    for builder, cases, check in ((build_attention, ATTENTION_CASES, _check_attention),
                                  (build_gather, GATHER_CASES, _check_gather)):
        for name, make in cases.items():
            spec = make()
            t0 = time.perf_counter()
            program, decisions = builder(spec, config)
            build_s = time.perf_counter() - t0
            validate(program, config)
            err = check(card, spec, program) if card is not None else None
            rows.append(_row(name, program, decisions, build_s, config, err))

    head = (f"| case | tiling | cores | simulated µs | roofline µs | of roofline | bound | PE TFLOP/s | DRAM MB "
            f"| build s |{' max abs err |' if args.check else ''}")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        line = (f"| {r['case']} | {r['tiling']} | {r['cores']} | {r['sim_us']:.1f} | {r['roofline_us']:.1f} | "
                f"{100 * r['fraction']:.1f} % | {r['bound']} | {r['tflops']:.2f} | {r['dram_mb']:.1f} | {r['build_s']:.2f} |")
        if args.check:
            line += f" {r['err']:.4f} |"
        print(line)
    print(f"\ncard: {config.num_cores} cores at {config.clock_hz / 1e9:.2f} GHz, {config.corelets_in_use} corelet(s) "
          f"in use ({config.peak_fp16_flops / 1e12:.1f} TFLOP/s fp16 peak), DRAM read "
          f"{config.dram_read_bandwidth / 1e9:.0f} GB/s, kernel fixed cost {config.kernel_fixed_cost_s * 1e6:.0f} µs")


if __name__ == "__main__":
    main()

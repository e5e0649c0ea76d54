"""The SDPA program generator: programs run on the simulated card and match torch within DLFloat16
tolerances; causal/padding masks, GQA, odd lengths, views; decisions, timing sanity and bad specs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not a package

from benchmarks.programs import run_on_card  # noqa: E402
from torch_spyre.card import Card, load_config  # noqa: E402
from torch_spyre.card.layout import StickLayout  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.card.validate import validate  # noqa: E402
from torch_spyre.compiler.codegen.attention import AttentionSpec, build_attention  # noqa: E402
from torch_spyre.compiler.access import CodegenError, TensorView  # noqa: E402
from torch_spyre.compiler.decisions import KernelDecisions  # noqa: E402
from torch_spyre.program import MatMul, Program  # noqa: E402

# DLFloat16 keeps 9 fraction bits (relative 2^-10) and P is rounded to it for the PE arrays.
DL_TOL = dict(atol=1.5e-2, rtol=1.5e-2)
F32_TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def config():
    return load_config(environ={})


@pytest.fixture(scope="module")
def card(config):
    return Card(0, config)


def _inputs(spec: AttentionSpec, seed: int = 0, mask_fill: str = "random") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dt = torch.float32 if spec.query.dtype == "float32" else torch.float16
    inp = {t.name: torch.randn(t.layout.host_shape, generator=g).to(dt) for t in (spec.query, spec.key, spec.value)}
    m = spec.attn_mask
    if m is not None:
        keep = torch.rand(m.layout.host_shape, generator=g) > 0.3
        if mask_fill == "padding":  # keys past a per-batch length are masked
            lengths = torch.randint(1, m.shape[-1] + 1, (m.shape[0],), generator=g)
            keep = (torch.arange(m.shape[-1]) < lengths[:, None]).reshape(m.layout.host_shape)
        if m.dtype == "bool":
            inp[m.name] = keep
        else:  # Hugging Face style additive mask: finfo.min where masked, small values elsewhere
            fdt = torch.float32 if m.dtype == "float32" else torch.float16
            inp[m.name] = torch.where(keep, torch.randn(keep.shape, generator=g) * 0.5,
                                      torch.tensor(torch.finfo(fdt).min)).to(fdt)
    return inp


def _reference(spec: AttentionSpec, inp: dict[str, torch.Tensor]) -> torch.Tensor:
    q, k, v = (inp[t.name].float() for t in (spec.query, spec.key, spec.value))
    mask = inp.get(spec.attn_mask.name) if spec.attn_mask is not None else None
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=spec.is_causal, scale=spec.scale,
                                          enable_gqa=spec.enable_gqa)


def _check(card, config, spec: AttentionSpec, mask_fill: str = "random", seed: int = 0) -> tuple[Program, KernelDecisions]:
    program, decisions = build_attention(spec, config)
    inp = _inputs(spec, seed, mask_fill)
    out, _ = run_on_card(card, program, inp)  # validates, then executes with every runtime check
    tol = F32_TOL if spec.query.dtype == "float32" else DL_TOL
    torch.testing.assert_close(out[spec.out.name], _reference(spec, inp), **tol)
    return program, decisions


# ---------------------------------------------------------------------------------------------
# Numerics against torch
# ---------------------------------------------------------------------------------------------
CASES = {
    # name: (batch, heads, seq_q, head_dim, kwargs)
    "full_odd_len_d32": (1, 2, 100, 32, {}),
    "causal_batch2_odd": (2, 3, 130, 64, dict(is_causal=True)),
    "causal_lq_lt_lk": (1, 2, 50, 64, dict(seq_k=90, is_causal=True)),
    "causal_lq_gt_lk": (1, 2, 90, 32, dict(seq_k=50, is_causal=True)),
    "gqa_causal": (2, 8, 65, 64, dict(kv_heads=2, is_causal=True)),
    "padding_mask_bool": (2, 4, 70, 64, dict(kv_heads=2, seq_k=150, mask_shape=(2, 1, 1, 150))),
    "additive_mask_fp16": (1, 4, 70, 32, dict(kv_heads=1, mask_shape=(70, 70), mask_dtype=torch.float16)),
    "per_head_bool_mask": (1, 4, 40, 64, dict(kv_heads=2, mask_shape=(1, 4, 40, 40))),
    "custom_scale_dv": (1, 2, 90, 48, dict(value_dim=40, scale=0.3)),
    "mask_and_causal": (2, 2, 80, 32, dict(is_causal=True, mask_shape=(2, 1, 1, 80))),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("tiling", ["small_blocks", "chosen"])
def test_matches_torch(card, config, name, tiling):
    B, H, L, D, kw = CASES[name]
    # Small blocks force several query and key blocks (and partial last blocks) at these lengths.
    force = dict(block_q=32, block_k=64) if tiling == "small_blocks" else {}
    spec = AttentionSpec.build(B, H, L, D, **kw, **force)
    _check(card, config, spec, mask_fill="padding" if "padding" in name else "random")


@pytest.mark.parametrize("heads_per_tile,batches_per_tile", [(1, 1), (2, 1), (4, 2)])
def test_gqa_and_batch_stacking(card, config, heads_per_tile, batches_per_tile):
    spec = AttentionSpec.build(2, 8, 45, 64, kv_heads=2, is_causal=True, block_q=32, block_k=64,
                               heads_per_tile=heads_per_tile, batches_per_tile=batches_per_tile)
    _, dec = _check(card, config, spec)
    assert dec.tiling["heads_per_tile"] == heads_per_tile
    assert dec.tiling["tile_rows"] == 32 * heads_per_tile * batches_per_tile


def test_float32(card, config):
    spec = AttentionSpec.build(1, 2, 90, 48, dtype=torch.float32, is_causal=True, block_q=32, block_k=64)
    _check(card, config, spec)
    spec = AttentionSpec.build(1, 2, 60, 32, dtype=torch.float32, mask_shape=(1, 2, 60, 60), mask_dtype=torch.float32)
    _check(card, config, spec)


def test_rows_that_see_no_key_give_zero(card, config):
    spec = AttentionSpec.build(1, 2, 40, 64, mask_shape=(40, 40), block_k=64)
    program, _ = build_attention(spec, config)
    inp = _inputs(spec)
    inp["mask"][3] = False
    out, _ = run_on_card(card, program, inp)
    ref = _reference(spec, inp)
    assert torch.all(ref[:, :, 3] == 0)  # torch's convention
    torch.testing.assert_close(out["out"], ref, **DL_TOL)


def test_rows_masked_by_finite_minimum_average_v_like_torch(card, config):
    """Hugging Face masks with finfo.min (finite): a row masked everywhere gets uniform weights in torch."""
    spec = AttentionSpec.build(1, 2, 40, 32, dtype=torch.float32, mask_shape=(40, 70), seq_k=70,
                               mask_dtype=torch.float32, block_k=64)
    program, _ = build_attention(spec, config)
    inp = _inputs(spec)
    inp["mask"][5] = torch.finfo(torch.float32).min
    out, _ = run_on_card(card, program, inp)
    torch.testing.assert_close(out["out"], _reference(spec, inp), **F32_TOL)


def test_mask_view_starting_mid_stick(card, config):
    """A padding mask that is a slice [100:250] of a wider bool buffer: key blocks start at lane 100 of
    the mask's 128-lane sticks and span two sticks."""
    base = AttentionSpec.build(2, 2, 30, 64, seq_k=150, block_k=64)
    lay = StickLayout((2, 1, 1, 300), -1, "bool")
    mask = TensorView("mask", lay, (2, 1, 1, 150), (300, 300, 300, 1), 100)
    spec = AttentionSpec(base.query, base.key, base.value, base.out, mask, block_k=64)
    program, _ = build_attention(spec, config)
    inp = _inputs(base)
    full = torch.rand(2, 1, 1, 300, generator=torch.Generator().manual_seed(7)) > 0.4
    inp["mask"] = full
    out, _ = run_on_card(card, program, inp)
    ref = F.scaled_dot_product_attention(inp["q"].float(), inp["k"].float(), inp["v"].float(),
                                         attn_mask=full[..., 100:250])
    torch.testing.assert_close(out["out"], ref, **DL_TOL)


def _fused_qkv(B: int, L: int, H: int, D: int, **kw) -> AttentionSpec:
    """q, k, v as views [B, H, L, D] of one projection [B, L, 3 * H * D] (what view + transpose of a fused
    qkv linear gives): heads of 32 sit two to a stick, at lanes 0 and 32."""
    lay = StickLayout((B, L, 3 * H * D), 2, "dlfloat16")
    strides = (L * 3 * H * D, D, 3 * H * D, 1)
    q, k, v = (TensorView("qkv", lay, (B, H, L, D), strides, part * H * D) for part in range(3))
    return AttentionSpec(q, k, v, TensorView.contiguous("out", (B, H, L, D), torch.float16), **kw)


@pytest.mark.parametrize("lane_heads", [1, 2])
@pytest.mark.parametrize("masking", ["causal", "per_head_mask"])
def test_fused_qkv_views(card, config, lane_heads, masking):
    """Read in place (no relayout). Heads at different lanes are never stacked as rows; with lane_heads=2
    the two heads of a stick share one tile, so each stick of q, k and v is loaded once."""
    B, L, H, D = 2, 50, 4, 32
    mask = None
    if masking == "per_head_mask":
        mask = TensorView.contiguous("mask", (B, H, L, L), torch.bool)
    spec = _fused_qkv(B, L, H, D, attn_mask=mask, is_causal=masking == "causal", lane_heads_per_tile=lane_heads,
                      batches_per_tile=2, block_k=64)
    program, dec = build_attention(spec, config)
    assert dec.tiling["heads_per_tile"] == 1 and dec.tiling["lane_heads"] == lane_heads
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(B, L, 3 * H * D, generator=g).half()
    inp = {"qkv": qkv}
    keep = None
    if mask is not None:
        keep = torch.rand(B, H, L, L, generator=g) > 0.3
        inp["mask"] = keep
    got, _ = run_on_card(card, program, inp)
    qh, kh, vh = qkv.float().reshape(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
    ref = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep, is_causal=masking == "causal")
    torch.testing.assert_close(got["out"], ref, **DL_TOL)


@pytest.mark.parametrize("B,H,L", [(2, 4, 50), (1, 12, 128)])
def test_fused_qkv_in_and_torch_style_out(card, config, B, H, L):
    """q/k/v views of the fused projection and the output as a [B, H, L, 32] view of a [B, L, H * 32]
    buffer (the layout torch's CPU flash attention returns): two heads share each output stick, so the
    pair is computed in one tile and stored together."""
    D = 32
    out = TensorView("out", StickLayout((B, L, H * D), 2, "dlfloat16"), (B, H, L, D), (L * H * D, D, H * D, 1))
    base = _fused_qkv(B, L, H, D, is_causal=True)
    spec = AttentionSpec(base.query, base.key, base.value, out, is_causal=True)
    program, dec = build_attention(spec, config)
    assert dec.tiling["lane_heads"] == 2
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(B, L, 3 * H * D, generator=g).half()
    got, _ = run_on_card(card, program, {"qkv": qkv})
    qh, kh, vh = qkv.float().reshape(B, L, 3, H, D).permute(2, 0, 3, 1, 4)
    ref = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)  # [B, H, L, D]
    torch.testing.assert_close(got["out"], ref.transpose(1, 2).reshape(B, L, H * D), **DL_TOL)


def test_side_by_side_heads_halve_dram_traffic(config):
    """At the same query block, two heads side by side in a stick read K and V once for both. (Left free,
    the estimate pairs lane heads with 64-row query blocks on two corelets: more reads, less time.)"""
    _, dec = build_attention(_fused_qkv(4, 128, 12, 32), config)
    assert dec.tiling["lane_heads"] == 2  # chosen by the estimate
    one, _ = build_attention(_fused_qkv(4, 128, 12, 32, lane_heads_per_tile=1, block_q=128), config)
    two, _ = build_attention(_fused_qkv(4, 128, 12, 32, lane_heads_per_tile=2, block_q=128), config)
    read_one, read_two = time_program(one, config).bytes["dram_read"], time_program(two, config).bytes["dram_read"]
    assert read_two < 0.6 * read_one


# ---------------------------------------------------------------------------------------------
# Programs and decisions
# ---------------------------------------------------------------------------------------------
def test_program_validates_serializes_and_records_decisions(config):
    spec = AttentionSpec.build(2, 8, 300, 64, kv_heads=2, is_causal=True, mask_shape=(2, 1, 1, 300))
    program, dec = build_attention(spec, config)
    validate(program, config)
    again = Program.from_json(program.to_json())
    assert again.cores == program.cores
    assert KernelDecisions.from_dict(program.metadata["decisions"]) == dec
    assert dec.kind == "attention"
    assert dec.scratchpad["peak_bytes"] <= config.scratchpad_plannable_bytes
    assert dec.work_division["cores"] == len(program.cores) <= config.num_cores
    # 300 positions in blocks of 64: a 5 x 5 grid of (query block, key block) pairs per tile group; the 10
    # above the diagonal are skipped, the 15 others streamed, the 5 on the diagonal need the causal bias.
    n = -(-300 // dec.tiling["block_q"])
    assert dec.tiling["block_q"] == dec.tiling["block_k"] == 64 and n == 5
    groups, rest = divmod(dec.tiling["kv_blocks_streamed"], n * (n + 1) // 2)
    assert rest == 0 and groups >= 1
    assert dec.tiling["causal_blocks_skipped"] == groups * n * (n - 1) // 2
    assert dec.tiling["causal_bias_blocks"] == groups * n
    assert dec.alternatives and all("est_us" in a for a in dec.alternatives)
    assert "kernel" in dec.format() and "considered" in dec.format()


@pytest.mark.parametrize("defer", [True, False])
def test_deferred_stores_fence_then_store(card, config, defer):
    """Held outputs (one tile per item) are stored after a fence, once every load of the core is done."""
    spec = AttentionSpec.build(2, 4, 70, 32, is_causal=True, block_q=32, block_k=64, defer_stores=defer)
    program, dec = _check(card, config, spec)
    assert dec.tiling["defer_stores"] is defer
    for core, instrs in program.cores.items():
        ops = [i.OP for i in instrs]
        if defer:
            fence = ops.index("barrier")
            assert set(ops[fence + 1:]) == {"dma_store"} and "dma_store" not in ops[:fence]
        else:
            assert "barrier" not in ops


def test_dram_bound_kernels_defer_stores_compute_bound_do_not(config):
    _, minilm = build_attention(AttentionSpec.build(32, 12, 128, 32), config)
    _, llama = build_attention(AttentionSpec.build(1, 32, 1024, 64, kv_heads=8), config)
    assert minilm.tiling["defer_stores"] and not llama.tiling["defer_stores"]


def test_causal_skips_blocks_above_the_diagonal(config):
    def matmuls(causal: bool) -> int:
        spec = AttentionSpec.build(1, 2, 512, 64, is_causal=causal, block_q=64, block_k=64)
        program, _ = build_attention(spec, config)
        return sum(isinstance(i, MatMul) for _, _, i in program.instructions())

    # 8 x 8 blocks per head; causal streams only the 36 on or below the diagonal.
    assert matmuls(False) == 2 * 64 * 2
    assert matmuls(True) == 2 * 36 * 2


# ---------------------------------------------------------------------------------------------
# Simulated time
# ---------------------------------------------------------------------------------------------
def test_timing_is_deterministic_and_causal_is_cheaper_at_long_lengths(config):
    full, _ = build_attention(AttentionSpec.build(1, 32, 1024, 64, kv_heads=8), config)
    causal, _ = build_attention(AttentionSpec.build(1, 32, 1024, 64, kv_heads=8, is_causal=True), config)
    t_full, t_causal = time_program(full, config), time_program(causal, config)
    assert time_program(causal, config).total_s == t_causal.total_s
    # Half the blocks are skipped; the diagonal blocks' bias, fills and imbalance keep it above half.
    assert t_causal.total_s < 0.8 * t_full.total_s
    assert t_causal.pe_flops < 0.6 * t_full.pe_flops
    assert 0 < t_full.roofline_fraction <= 1


def test_longer_sequences_cost_more(config):
    times = [time_program(build_attention(AttentionSpec.build(1, 4, n, 64, is_causal=True), config)[0], config).total_s
             for n in (256, 512, 1024)]
    assert times[0] < times[1] < times[2]


# ---------------------------------------------------------------------------------------------
# Bad specs
# ---------------------------------------------------------------------------------------------
def _spec_with(**replace) -> AttentionSpec:
    base = AttentionSpec.build(1, 4, 64, 64)
    fields = dict(query=base.query, key=base.key, value=base.value, out=base.out, attn_mask=None)
    fields.update(replace)
    return AttentionSpec(**fields)


@pytest.mark.parametrize("spec,message", [
    (lambda: _spec_with(key=TensorView.contiguous("k", (1, 4, 64, 32), torch.float16)), "shapes do not agree"),
    (lambda: _spec_with(value=TensorView.contiguous("v", (1, 4, 60, 64), torch.float16)), "shapes do not agree"),
    (lambda: _spec_with(out=TensorView.contiguous("out", (1, 4, 64, 32), torch.float16)), "out %out has shape"),
    (lambda: AttentionSpec.build(1, 6, 64, 64, kv_heads=4), "multiple of key/value heads"),
    (lambda: AttentionSpec.build(1, 8, 64, 64, kv_heads=2, enable_gqa=False), "enable_gqa=True"),
    (lambda: AttentionSpec.build(1, 4, 64, 64, dtype=torch.int32), "float16/bfloat16"),
    (lambda: AttentionSpec.build(1, 4, 64, 64, dtype=torch.float64), "unsupported dtype"),
    (lambda: AttentionSpec.build(1, 4, 64, 64, mask_shape=(3, 64)), "does not broadcast"),
    (lambda: AttentionSpec.build(1, 4, 64, 64, mask_shape=(64, 64), mask_dtype=torch.int32), "bool or float"),
    (lambda: _spec_with(query=TensorView.contiguous("q", (4, 64, 64), torch.float16)), "must be 4-d"),
    (lambda: _spec_with(query=TensorView("q", StickLayout((1, 4, 64, 64), 2, "dlfloat16"), (1, 4, 64, 64))),
     "relayout"),
])
def test_bad_specs_raise_clear_errors(config, spec, message):
    with pytest.raises(CodegenError, match=message):
        build_attention(spec(), config)


@pytest.mark.parametrize("q_fused", [False, True])
@pytest.mark.parametrize("B,H,L,D", [(2, 4, 50, 32), (1, 4, 16, 16)])
def test_packed_output_with_qkv_heads_in_sticks_of_their_own(card, config, q_fused, B, H, L, D):
    """The output packs heads of one stick ([B, L, H * D] underneath) while K and V (and Q, unless it is a
    view of a fused projection) hold each head in sticks of its own, as GPT-2's 16-wide heads after its
    KV cache: those roles are loaded member by member, the output's sticks still stored whole."""
    out = TensorView("out", StickLayout((B, L, H * D), 2, "dlfloat16"), (B, H, L, D), (L * H * D, D, H * D, 1))
    if q_fused:  # q a view of a [B, L, H * D] projection (heads side by side), k and v buffers of their own
        q = TensorView("q", StickLayout((B, L, H * D), 2, "dlfloat16"), (B, H, L, D), (L * H * D, D, H * D, 1))
    else:
        q = TensorView.contiguous("q", (B, H, L, D), torch.float16)
    k, v = (TensorView.contiguous(n, (B, H, L, D), torch.float16) for n in "kv")
    spec = AttentionSpec(q, k, v, out, is_causal=True)
    program, dec = build_attention(spec, config)
    validate(program, config)
    assert dec.tiling["lane_heads"] == 64 // D
    assert dec.tiling["loaded_apart"] == (["key", "value"] if q_fused else ["query", "key", "value"])
    g = torch.Generator().manual_seed(3)
    inp = {"q": torch.randn(q.layout.host_shape, generator=g).half(),
           "k": torch.randn(B, H, L, D, generator=g).half(), "v": torch.randn(B, H, L, D, generator=g).half()}
    got, _ = run_on_card(card, program, inp)
    qh = inp["q"].float().reshape(B, L, H, D).transpose(1, 2) if q_fused else inp["q"].float()
    ref = F.scaled_dot_product_attention(qh, inp["k"].float(), inp["v"].float(), is_causal=True)
    torch.testing.assert_close(got["out"], ref.transpose(1, 2).reshape(B, L, H * D), **DL_TOL)


def test_output_view_sharing_sticks_unpackable_is_refused(config):
    """Heads sharing output sticks at lanes that are not Dv apart (a row of 3 heads of 32 starting mid
    stick) cannot be stored whole by any tile: refused with a hint."""
    B, L, H, D = 1, 64, 4, 32
    out = TensorView("out", StickLayout((B, L, H * D + D), 2, "dlfloat16"), (B, H, L, D),
                     (L * (H * D + D), D, H * D + D, 1), D)
    base = AttentionSpec.build(B, H, L, D)
    with pytest.raises(CodegenError, match=r"share their sticks with other heads.*\(relayout\)"):
        build_attention(AttentionSpec(base.query, base.key, base.value, out), config)


def test_wrapper_generator_interface(card, config):
    """What compiler/wrapper.py calls: generate(KernelSpec, {name: TensorView}, config) -> Program."""
    from torch_spyre.compiler.codegen.attention import GENERATOR, generate
    from torch_spyre.compiler.kernel_ir import BufferSpec, KernelSpec

    spec = AttentionSpec.build(1, 4, 50, 64, kv_heads=2, is_causal=True, mask_shape=(1, 1, 1, 50))
    args = {"q": spec.query, "k": spec.key, "v": spec.value, "out": spec.out, "mask": spec.attn_mask}
    buffers = [BufferSpec(n, "float16" if n != "mask" else "bool", list(t.shape), list(t.strides), 0,
                          "output" if n == "out" else "input") for n, t in args.items()]
    kspec = KernelSpec("sdpa_0", [], [], [], buffers, ["aten._scaled_dot_product_flash_attention_for_cpu"],
                       generator=GENERATOR, params=dict(query="q", key="k", value="v", out="out", attn_mask="mask",
                                                        is_causal=True, enable_gqa=True))
    program = generate(kspec, {n: TensorView.whole(n, t.layout) for n, t in args.items()}, config)
    assert program.name == "sdpa_0" and program.metadata["decisions"]["kind"] == "attention"
    inp = _inputs(spec, mask_fill="padding")
    out, _ = run_on_card(card, program, inp)
    torch.testing.assert_close(out["out"], _reference(spec, inp), **DL_TOL)

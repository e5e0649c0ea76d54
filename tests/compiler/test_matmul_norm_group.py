"""The LayerNorm matmul epilogue and the matmul group generator, on the card against torch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torch_spyre.card import Card
from torch_spyre.card.validate import validate
from torch_spyre.compiler.codegen.matmul import MatmulSpecError, build_matmul, linear_spec
from torch_spyre.compiler.codegen.matmul.group import build_matmul_group, member_specs
from torch_spyre.program import Barrier, Reduce

from .test_codegen_matmul import CFG, assert_matches, buf, dl, randn, run
from benchmarks.programs import run_on_card


@pytest.fixture(scope="module")
def card() -> Card:
    return Card(0, CFG)


def _layer_norm(y, w, b, eps):
    return torch.nn.functional.layer_norm(y, y.shape[-1:], w, b, eps)


@pytest.mark.parametrize("M,K,N,affine", [(128, 384, 384, True), (200, 1536, 130, True), (32, 64, 96, False)])
def test_layer_norm_epilogue_matches_torch(card, M, K, N, affine):
    """out = LayerNorm(x @ W^T + b + residual), whole rows per core (a K-split for K = 1536)."""
    g = torch.Generator().manual_seed(M + K + N)
    x, w, bias, res = randn(g, M, K), randn(g, N, K, scale=0.05), randn(g, N), randn(g, M, N)
    nw, nb = randn(g, N), randn(g, N)
    spec = replace(linear_spec(buf("x", (M, K)), buf("w", (N, K)), buf("y", (M, N)), buf("bias", (N,))),
                   residual=buf("res", (M, N)), norm_eps=1e-12,
                   norm_weight=buf("nw", (N,)) if affine else None, norm_bias=buf("nb", (N,)) if affine else None)
    inputs = {"x": x, "w": w, "bias": bias, "res": res} | ({"nw": nw, "nb": nb} if affine else {})
    got, (prog, dec) = run(card, spec, inputs)
    y = torch.nn.functional.linear(dl(x), dl(w), dl(bias)) + dl(res)
    want = _layer_norm(y, dl(nw) if affine else None, dl(nb) if affine else None, 1e-12)
    assert_matches(got, want)
    assert dec.work_division["split"]["N_sticks"] == 1  # whole rows per core
    assert any(isinstance(i, Reduce) for _, _, i in prog.instructions())


def test_layer_norm_epilogue_refuses_a_bad_weight():
    spec = replace(linear_spec(buf("x", (32, 64)), buf("w", (96, 64)), buf("y", (32, 96))), norm_eps=1e-5,
                   norm_weight=buf("nw", (64,)))
    with pytest.raises(MatmulSpecError, match=r"norm_weight %nw must be \[N\] = \[96\]"):
        build_matmul(spec, CFG)


@pytest.mark.parametrize("batched", [False, True])
def test_matmul_group_matches_torch(card, batched):
    """Three projections of one input (Q, K, V) in one program, each writing its columns of one output."""
    g = torch.Generator().manual_seed(3)
    B, S, K, N = 2, 64, 384, 384
    rows = (B, S) if batched else (B * S,)
    x = randn(g, *rows, K)
    ws = [randn(g, K, N, scale=0.05) for _ in range(3)]
    bs = [randn(g, N) for _ in range(3)]
    out = buf("out", (*rows, 3 * N))
    members = [(buf(f"b{i}", (K, N)), buf(f"bias{i}", (N,)), i * N) for i in range(3)]
    specs = member_specs(buf("a", (*rows, K)), out, members, "qkv")
    prog, dec = build_matmul_group(specs, CFG, "qkv")
    validate(prog, CFG)
    inputs = {"a": x} | {f"b{i}": ws[i] for i in range(3)} | {f"bias{i}": bs[i] for i in range(3)}
    outs, _ = run_on_card(card, prog, inputs)
    want = torch.cat([dl(x) @ dl(ws[i]) + dl(bs[i]) for i in range(3)], dim=-1)
    assert_matches(outs["out"], want)
    assert dec.kind == "matmul_group" and len(dec.work_division["members"]) == 3
    barriers = {i.tag for _, _, i in prog.instructions() if isinstance(i, Barrier)}
    assert len(barriers) == 2  # one between each two members


def test_matmul_group_refuses_columns_off_a_stick():
    members = [(buf("b0", (64, 96)), None, 0), (buf("b1", (64, 64)), None, 96)]
    with pytest.raises(Exception, match="stick boundary"):
        member_specs(buf("a", (32, 64)), buf("out", (32, 160)), members, "g")

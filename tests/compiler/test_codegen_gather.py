"""The gather program generator: embedding / index_select / expanded-index gather run on the simulated
card and match torch; out-of-range indices stop the program with a clear error; work division,
decisions, timing sanity and bad specs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not a package

from benchmarks.programs import run_on_card  # noqa: E402
from torch_spyre.card import Card, load_config  # noqa: E402
from torch_spyre.card.execute import ExecutionError  # noqa: E402
from torch_spyre.card.layout import StickLayout  # noqa: E402
from torch_spyre.card.timing import time_program  # noqa: E402
from torch_spyre.card.validate import validate  # noqa: E402
from torch_spyre.compiler.access import CodegenError, TensorView, stick_patterns  # noqa: E402
from torch_spyre.compiler.codegen.gather import GatherSpec, build_gather, explain_gather_error  # noqa: E402
from torch_spyre.compiler.decisions import KernelDecisions  # noqa: E402
from torch_spyre.program import DmaGather, Program  # noqa: E402

DL_TOL = dict(atol=0, rtol=2 ** -9)  # a gather only rounds fp16 to DLFloat16 once


@pytest.fixture(scope="module")
def config():
    return load_config(environ={})


@pytest.fixture(scope="module")
def card(config):
    return Card(0, config)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _run(card, config, spec: GatherSpec, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Program, KernelDecisions]:
    program, decisions = build_gather(spec, config)
    out, _ = run_on_card(card, program, inputs)
    return out[spec.out.name], program, decisions


# ---------------------------------------------------------------------------------------------
# Results against torch
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num,dim,index_shape,index_dtype,dtype", [
    (1000, 384, (2, 37), torch.int64, torch.float16),  # MiniLM-like: 6 sticks per row
    (50, 32, (5,), torch.int32, torch.float16),  # half a stick per row (padding lanes)
    (300, 130, (3, 4, 50), torch.int64, torch.float16),  # 3-d indices, a partial last stick
    (10, 64, (), torch.int64, torch.float16),  # one 0-d index
    (64, 48, (40,), torch.int64, torch.float32),
])
def test_embedding_matches_torch(card, config, num, dim, index_shape, index_dtype, dtype):
    g = _gen()
    weight = torch.randn(num, dim, generator=g).to(dtype)
    idx = torch.randint(0, num, index_shape, generator=g).to(index_dtype)
    spec = GatherSpec.embedding(num, dim, index_shape, dtype=dtype, index_dtype=index_dtype)
    got, _, _ = _run(card, config, spec, {"weight": weight, "indices": idx})
    torch.testing.assert_close(got, F.embedding(idx, weight).float(), **DL_TOL)


def test_embedding_with_repeated_and_boundary_indices(card, config):
    weight = torch.randn(30, 64, generator=_gen()).half()
    idx = torch.tensor([0, 29, 29, 0, 5, 5, 5, 29])
    got, _, _ = _run(card, config, GatherSpec.embedding(30, 64, (8,)), {"weight": weight, "indices": idx})
    torch.testing.assert_close(got, F.embedding(idx, weight).float(), **DL_TOL)


@pytest.mark.parametrize("shape,dim", [((7, 20, 100), 0), ((7, 20, 100), 1), ((50, 64), 0), ((3, 5, 6, 32), 2)])
def test_index_select_matches_torch(card, config, shape, dim):
    g = _gen(1)
    x = torch.randn(shape, generator=g).half()
    idx = torch.randint(0, shape[dim], (9,), generator=g)
    got, _, _ = _run(card, config, GatherSpec.index_select(shape, dim, 9), {"source": x, "indices": idx})
    torch.testing.assert_close(got, x.index_select(dim, idx).float(), **DL_TOL)


def test_gather_with_an_expanded_index_is_an_index_select(card, config):
    g = _gen(2)
    x = torch.randn(40, 6, 64, generator=g)
    small = torch.randint(0, 40, (11, 1, 1), generator=g)
    index = small.expand(11, 5, 64)  # also narrower than x along dim 1
    spec = GatherSpec("gather", TensorView.contiguous("x", (40, 6, 64), torch.float32),
                      TensorView("i", StickLayout((11, 1, 1), -1, "int64"), (11, 5, 64), (1, 0, 0)),
                      TensorView.contiguous("out", (11, 5, 64), torch.float32), 0)
    got, _, _ = _run(card, config, spec, {"x": x, "i": small})
    torch.testing.assert_close(got, torch.gather(x, 0, index))


def test_index_view_with_offset_and_strides(card, config):
    """Indices read through a view: every other column of a [4, 40] buffer, from column 1."""
    g = _gen(3)
    weight = torch.randn(100, 64, generator=g).half()
    base = torch.randint(0, 100, (4, 40), generator=g)
    view = TensorView("idx", StickLayout((4, 40), -1, "int64"), (4, 20), (40, 1), 1)  # columns 1..20
    spec = GatherSpec("embedding", TensorView.contiguous("weight", (100, 64), torch.float16), view,
                      TensorView.contiguous("out", (4, 20, 64), torch.float16))
    got, _, _ = _run(card, config, spec, {"weight": weight, "idx": base})
    torch.testing.assert_close(got, F.embedding(base[:, 1:21], weight).float(), **DL_TOL)


@pytest.mark.parametrize("shape,cols,dtype,index_dtype", [
    ((5, 100), 3, torch.float16, torch.int64),
    ((4, 7, 130), 9, torch.float32, torch.int32),  # 3-d, rows spanning three sticks
    ((64, 3000), 1, torch.float16, torch.int64),  # picking one logit per row
    ((3, 40), 300, torch.float16, torch.int64),  # more indices than columns, repeated
    ((9, 70), 33, torch.int32, torch.int64),  # integer data: selected exactly
])
def test_gather_along_the_stick_dim_matches_torch(card, config, shape, cols, dtype, index_dtype):
    g = _gen(6)
    x = (torch.randn(shape, generator=g) * 100).to(dtype)
    ishape = shape[:-1] + (cols,)
    idx = torch.randint(0, shape[-1], ishape, generator=g).to(index_dtype)
    spec = GatherSpec("gather", TensorView.contiguous("x", shape, dtype), TensorView.contiguous("i", ishape, index_dtype),
                      TensorView.contiguous("o", ishape, dtype), -1)
    got, program, dec = _run(card, config, spec, {"x": x, "i": idx})
    assert dec.tiling["mode"].startswith("element gather")
    expected = torch.gather(x, -1, idx.long())
    torch.testing.assert_close(got.to(expected.dtype) if not expected.is_floating_point() else got,
                               expected if not expected.is_floating_point() else expected.float(), **DL_TOL)


def test_index_select_along_the_stick_dim(card, config):
    g = _gen(7)
    x = torch.randn(6, 5, 100, generator=g).half()
    idx = torch.randint(0, 100, (17,), generator=g)
    got, _, _ = _run(card, config, GatherSpec.index_select((6, 5, 100), -1, 17), {"source": x, "indices": idx})
    torch.testing.assert_close(got, x.index_select(-1, idx).float(), **DL_TOL)


@pytest.mark.parametrize("bad", [100, -3])
def test_element_gather_index_out_of_range(card, config, bad):
    spec = GatherSpec("gather", TensorView.contiguous("x", (4, 100), torch.float16),
                      TensorView.contiguous("i", (4, 5), torch.int64), TensorView.contiguous("o", (4, 5), torch.float16), 1)
    program, _ = build_gather(spec, config)
    idx = torch.zeros(4, 5, dtype=torch.int64)
    idx[2, 3] = bad
    with pytest.raises(ExecutionError, match=r"outside \[0, 100\)") as err:
        run_on_card(card, program, {"x": torch.randn(4, 100).half(), "i": idx})
    assert "index tensor %i" in explain_gather_error(program, err.value)


# ---------------------------------------------------------------------------------------------
# Out-of-range indices
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [100, 1000, -1])
def test_out_of_range_index_stops_with_a_clear_error(card, config, bad):
    spec = GatherSpec.embedding(100, 64, (40,))
    program, _ = build_gather(spec, config)
    idx = torch.arange(40)
    idx[17] = bad
    with pytest.raises(ExecutionError, match=r"gather index -?\d+ .* outside \[0, 100\)") as err:
        run_on_card(card, program, {"weight": torch.randn(100, 64).half(), "indices": idx})
    assert "%weight" in str(err.value)  # the card names the instruction, and with it the source
    assert "the index tensor is %indices" in str(err.value)  # and the index tensor, from the metadata
    explained = explain_gather_error(program, err.value)
    assert "index tensor %indices" in explained and "[0, 100)" in explained and "%weight" in explained


# ---------------------------------------------------------------------------------------------
# Programs, work division, decisions
# ---------------------------------------------------------------------------------------------
def test_large_embedding_uses_every_core_in_whole_sticks(config):
    spec = GatherSpec.embedding(30522, 384, (32, 128))
    program, dec = build_gather(spec, config)
    validate(program, config)
    assert len(program.cores) == config.num_cores
    assert dec.work_division["positions_per_core"] == [128, 128]
    assert dec.tiling["gathers_per_chunk"] == 6  # one per stick of a 384-wide fp16 row
    assert dec.scratchpad["peak_bytes"] <= config.scratchpad_plannable_bytes
    gathers = [i for _, _, i in program.instructions() if isinstance(i, DmaGather)]
    assert all(g.num_rows == 30522 and g.row_sticks == 1 for g in gathers)
    assert sum(g.index.numel for g in gathers) == 32 * 128 * 6
    assert Program.from_json(program.to_json()).cores == program.cores
    assert KernelDecisions.from_dict(program.metadata["decisions"]) == dec
    assert program.metadata["gather"]["index_operand"] == "indices"


def test_chunks_alternate_buffers_when_forced_small(card, config):
    g = _gen(4)
    weight = torch.randn(200, 128, generator=g).half()
    idx = torch.randint(0, 200, (300,), generator=g)
    spec = GatherSpec.embedding(200, 128, (300,), chunk=16)
    got, program, dec = _run(card, config, spec, {"weight": weight, "indices": idx})
    torch.testing.assert_close(got, F.embedding(idx, weight).float(), **DL_TOL)
    assert dec.work_division["chunks"] == -(-300 // 16)


def test_time_grows_with_the_number_of_indices(config):
    times = [time_program(build_gather(GatherSpec.embedding(30522, 384, (n,)), config)[0], config).total_s
             for n in (256, 2048, 16384)]
    assert times[0] < times[1] < times[2]
    assert time_program(build_gather(GatherSpec.embedding(30522, 384, (2048,)), config)[0], config).total_s == times[1]


def test_stick_patterns_cover_each_stick_once():
    dev = np.array([[0, 5, 10], [1, 6, 11], [7, 8, 9], [40, 20, 3]])
    covered = []
    for d, s, pat in stick_patterns(dev):
        grid = np.indices(pat.shape).reshape(len(pat.shape), -1).T
        covered += [(d + int(grid_i @ np.array(pat.dram_strides)) // 128, s + int(grid_i @ np.array(pat.sp_strides)) // 128)
                    for grid_i in grid]
    assert sorted(covered, key=lambda x: x[1]) == [(int(v), i) for i, v in enumerate(dev.reshape(-1))]


# ---------------------------------------------------------------------------------------------
# Bad specs
# ---------------------------------------------------------------------------------------------
def test_source_view_merging_dims_needs_a_relayout(config):
    """A [3, 5, 64] table viewed as [15, 64]: in the stick layout rows 4 and 5 are not one stride apart."""
    src = TensorView("w", StickLayout((3, 5, 64), -1, "dlfloat16"), (15, 64), (64, 1))
    spec = GatherSpec("embedding", src, TensorView.contiguous("i", (4,), torch.int64),
                      TensorView.contiguous("o", (4, 64), torch.float16))
    with pytest.raises(CodegenError, match="not a fixed set of sticks .* relayout"):
        build_gather(spec, config)


def test_index_view_merging_dims_is_refused(config):
    """A [2, 12] index viewed as [24]: position 12 is in the second row's sticks, not at lane 12 of the
    first row's; read as one stride per dim, a chunk of more than 12 positions would pick wrong rows."""
    idx = TensorView("i", StickLayout((2, 12), -1, "int64"), (24,), (1,))
    spec = GatherSpec("index_select", TensorView.contiguous("w", (100, 64), torch.float16), idx,
                      TensorView.contiguous("o", (24, 64), torch.float16))
    with pytest.raises(CodegenError, match="merges or splits dims of its allocation \\[2, 12\\]"):
        build_gather(spec, config)


@pytest.mark.parametrize("make,message", [
    (lambda: GatherSpec.embedding(10, 64, (4,), index_dtype=torch.float32), "unsupported dtype|int64 or int32"),
    (lambda: GatherSpec("embedding", TensorView.contiguous("w", (10, 64), torch.float16),
                        TensorView.contiguous("i", (4,), torch.int64),
                        TensorView.contiguous("o", (4, 32), torch.float16)), "expected \\[4, 64\\]"),
    (lambda: GatherSpec("gather", TensorView.contiguous("x", (10, 64), torch.float16),
                        TensorView.contiguous("i", (4, 64), torch.int64),
                        TensorView.contiguous("o", (4, 64), torch.float16), 0), "varies along dim"),
    (lambda: GatherSpec("scatter", TensorView.contiguous("x", (10, 64), torch.float16),
                        TensorView.contiguous("i", (4,), torch.int64),
                        TensorView.contiguous("o", (4, 64), torch.float16)), "unknown gather kind"),
    (lambda: GatherSpec("index_select", TensorView.contiguous("x", (10, 64), torch.float16),
                        TensorView.contiguous("i", (2, 2), torch.int64),
                        TensorView.contiguous("o", (4, 64), torch.float16)), "must be 1-d"),
])
def test_bad_specs_raise_clear_errors(config, make, message):
    with pytest.raises(CodegenError, match=message):
        build_gather(make(), config)


def test_wrapper_generator_interface(card, config):
    """What compiler/wrapper.py calls: generate(KernelSpec, {name: TensorView}, config) -> Program."""
    from torch_spyre.compiler.codegen.gather import GENERATOR, generate
    from torch_spyre.compiler.kernel_ir import BufferSpec, KernelSpec

    spec = GatherSpec.embedding(100, 64, (3, 7))
    args = {"weight": spec.source, "indices": spec.index, "out": spec.out}
    buffers = [BufferSpec(n, "int64" if n == "indices" else "float16", list(t.shape), list(t.strides), 0,
                          "output" if n == "out" else "input") for n, t in args.items()]
    kspec = KernelSpec("embedding_0", [], [], [], buffers, ["aten.embedding.default"], generator=GENERATOR,
                       params=dict(kind="embedding", source="weight", index="indices", out="out", dim=0))
    program = generate(kspec, {n: TensorView.whole(n, t.layout) for n, t in args.items()}, config)
    assert program.metadata["decisions"]["kind"] == "gather"
    g = _gen(5)
    weight, idx = torch.randn(100, 64, generator=g).half(), torch.randint(0, 100, (3, 7), generator=g)
    out, _ = run_on_card(card, program, {"weight": weight, "indices": idx})
    torch.testing.assert_close(out["out"], F.embedding(idx, weight).float(), **DL_TOL)

"""More ops lowered into Spyre programs (issue §2): torch.gather (and what uses it: cross_entropy /
nll_loss, take_along_dim, Bert's default token_type_ids), argmax/argmin/max.dim/min.dim, and cumsum.
Each compiled result is compared with torch on the CPU (fp32 and fp16 at DLFloat16 tolerances) with no
host computation inside the compiled graph; bad inputs get clear errors.

``python -m tests.compiler.test_lowerings_more`` prints the simulated time of the new kernels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torch_spyre.card import dlfloat16
from torch_spyre.card.execute.state import ExecutionError

from .spyre_compile_helpers import TOL, check, fresh, run_compiled, specs_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not a package


def rnd(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def ints(high, *shape, seed=1):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def dl_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the card holds it: fp16 data is DLFloat16 (9 fraction bits) on the card, so an argmax
    over fp16 is compared with torch's over the DLFloat16-rounded values (rounding can tie neighbours)."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return x
    return torch.from_numpy(dlfloat16.round_float32(x.float().numpy()))


DTYPES = [torch.float32, torch.float16]


# ---------------------------------------------------------------------------------------------
# torch.gather
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("src,idx", [((8, 100), (8, 5)), ((3, 7, 130), (3, 7, 9)), ((5, 70), (3, 10)),
                                     ((2, 64), (2, 64)), ((40, 33), (40, 1))])
def test_gather_along_the_stick_dim(dtype, src, idx):
    check(lambda x, i: torch.gather(x, -1, i) * 2, rnd(*src, dtype=dtype), ints(src[-1], *idx))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_along_another_dim(dtype):
    # an index varying along the other dims: source and index moved so that the dim is last
    check(lambda x, i: torch.gather(x, 0, i) + 1, rnd(50, 70, dtype=dtype), ints(50, 6, 70))
    check(lambda x, i: torch.gather(x, 1, i), rnd(4, 33, 10, dtype=dtype), ints(33, 4, 5, 10))
    # an expanded index (constant along the other dims): a row gather, no copies
    check(lambda x, i: torch.gather(x, 0, i.expand(6, 70)) + 1, rnd(50, 70, dtype=dtype), ints(50, 6, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_from_views(dtype):
    x = rnd(20, 100, dtype=dtype)
    check(lambda x, i: torch.gather(x[:, 3:50], 1, i), x, ints(47, 6, 4))  # rows start mid-stick: read in place
    check(lambda x, i: torch.gather(x[:, 5:69], 0, i.expand(3, 64)), x, ints(20, 3, 1))  # copied first
    check(lambda x, i: torch.gather(x, 0, i), x, ints(20, 3, 50))  # index smaller than the source
    check(lambda x, i: torch.take_along_dim(x, i, 1), x, ints(100, 1, 3))  # index broadcast over rows


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_along_the_stick_dim_picks_elements(dtype):
    """index_select / x[idx] / take along the last (sticked) dim: single elements inside sticks, which a row
    gather cannot move; they become the gather generator's element path (an expanded index)."""
    x = rnd(6, 100, dtype=dtype)
    check(lambda x, i: torch.index_select(x, 1, i) + 1, x, ints(100, 7))
    check(lambda x, i: torch.index_select(x, -1, i), x, ints(100, 3).to(torch.int32))
    check(lambda x, i: x.flatten()[i] * 2, x, ints(600, 9))  # a 1-d source
    check(lambda x, i: x[:, :, i], rnd(2, 3, 40, dtype=dtype), torch.tensor([39, 0, 5, 5]))
    check(lambda x, i: torch.take(x, i), x, ints(600, 2, 5))


def test_gather_of_integers_is_exact():
    check(lambda x, i: torch.gather(x, 1, i), torch.randint(-1000, 1000, (3, 200)), ints(200, 3, 17))
    check(lambda x, i: torch.gather(x > 0, 1, i), rnd(6, 100), ints(100, 6, 4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_take_along_dim(dtype):
    x = rnd(6, 130, dtype=dtype)
    check(lambda x, i: torch.take_along_dim(x, i, 1), x, ints(130, 6, 1))
    check(lambda x, i: torch.take_along_dim(x, i, -1), x, ints(130, 6, 4))
    check(lambda x: torch.take_along_dim(x, x.argmax(-1, keepdim=True), -1), x)  # the row maxima


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,classes", [(16, 100), (37, 1000)])
def test_cross_entropy(dtype, n, classes):
    x, t = rnd(n, classes, dtype=dtype), ints(classes, n)
    tol = dict(atol=3e-2, rtol=2e-2)
    check(lambda x, t: F.cross_entropy(x.float(), t), x, t, tol=tol)
    t[:5] = 3
    check(lambda x, t: F.cross_entropy(x.float(), t, ignore_index=3), x, t, tol=tol)
    check(lambda x, t: F.nll_loss(F.log_softmax(x.float(), -1), t, reduction="sum") / n, x, t, tol=tol)


@pytest.mark.slow
@pytest.mark.models
def test_bert_default_token_type_ids():
    """Bert without token_type_ids gathers its zero buffer along the stick dim (int64)."""
    import torch_spyre
    from torch_spyre.compiler import wrapper

    from tests.zoo import tiny

    torch.manual_seed(0)
    cfg, cls = tiny("bert")
    model = cls(cfg).eval()
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        ref = model(ids).last_hidden_state
        dev = model.half().to("spyre")
        fresh()
        f = torch.compile(dev)
        f(ids.to("spyre"))
        wrapper.reset_host_fallback_stats()
        torch_spyre.reset_fallback_stats()
        got = f(ids.to("spyre")).last_hidden_state.cpu().float()
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
    assert wrapper.host_fallback_stats() == {} and dict(torch_spyre.fallback_stats()) == {}


def test_gather_index_out_of_range_stops_the_program():
    from torch_spyre.card.execute import ExecutionError

    i = ints(100, 8, 5)
    i[2, 3] = 100
    with pytest.raises(ExecutionError, match=r"gather index 100 .* outside \[0, 100\).*the index tensor is %index"):
        run_compiled(lambda x, i: torch.gather(x, 1, i), rnd(8, 100), i)
    i = torch.full((3, 1), 9)
    with pytest.raises(ExecutionError, match=r"gather index 9 .* outside \[0, 8\).*valid rows of %source along dim 0"):
        run_compiled(lambda x, i: torch.gather(x, 0, i.expand(3, 70)), rnd(8, 70), i)


def test_gather_with_packed_rows_out_of_range_is_explained():
    """The generator on its own: an [N, 1] index and output (their layout drops the size-1 dim, so rows
    share sticks) and the card's error turned into one naming the index tensor and its range."""
    from benchmarks.programs import run_on_card
    from torch_spyre.card import Card, load_config
    from torch_spyre.card.execute import ExecutionError
    from torch_spyre.card.layout import StickLayout
    from torch_spyre.compiler.access import TensorView
    from torch_spyre.compiler.codegen.gather import GatherSpec, build_gather, explain_gather_error

    config = load_config(environ={})
    n = 150
    packed = lambda name, dt: TensorView(name, StickLayout((n,), 0, dt), (n, 1), (1, 1))  # noqa: E731
    spec = GatherSpec("gather", TensorView.contiguous("x", (n, 77), torch.float32), packed("i", "int64"),
                      packed("o", "float32"), 1)
    program, dec = build_gather(spec, config)
    x, i = rnd(n, 77), ints(77, n, 1)
    out, _ = run_on_card(Card(0, config), program, {"x": x, "i": i.reshape(n)})
    torch.testing.assert_close(out["o"].reshape(n, 1), torch.gather(x, 1, i))
    assert dec.work_division["chunks"] == 5  # 32-element output sticks: chunks of whole sticks
    i[140] = 77
    with pytest.raises(ExecutionError, match=r"outside \[0, 77\)") as err:
        run_on_card(Card(0, config), program, {"x": x, "i": i.reshape(n)})
    assert "index tensor %i holds a value outside [0, 77), the valid rows of %x along dim 1" in \
        explain_gather_error(program, err.value)


def test_gather_form_without_lowering_falls_back_to_the_eager_op():
    """A 0-d gather keeps Inductor's lowering (an index read from memory in a pointwise kernel, which the
    card cannot run): the compile does not fail, the op runs eagerly, counted and warned about."""
    import warnings

    import torch_spyre
    from torch_spyre.compiler import wrapper

    fresh()
    wrapper.reset_compile_fallback_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(lambda x, i: torch.gather(x, 0, i) * 2)(torch.tensor(3.0).to("spyre"),
                                                                   torch.tensor(0).to("spyre"))
    assert got.cpu().item() == 6.0
    assert torch_spyre.fallback_stats().compile_fallbacks == {"aten.gather.default": 1}
    assert any("aten.gather.default" in str(w.message) and "index read from memory" in str(w.message)
               for w in caught)


# ---------------------------------------------------------------------------------------------
# argmax / argmin / max.dim / min.dim
# ---------------------------------------------------------------------------------------------
def check_exact(fn, x):
    """Compiled on spyre vs torch on the DLFloat16-rounded input: indices equal exactly."""
    got = run_compiled(fn, x)
    ref = fn(dl_round(x).float())
    gots, refs = (got, ref) if isinstance(got, (tuple, list)) else ((got,), (ref,))
    for g, r in zip(gots, refs):
        if r.is_floating_point():
            torch.testing.assert_close(g.float(), r, **TOL[x.dtype])
        else:
            assert torch.equal(g, r), (g, r)
    from torch_spyre.compiler import wrapper

    assert wrapper.host_fallback_stats() == {}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((8, 100), -1), ((5, 130), 1), ((70, 33), 0), ((3, 100, 7), 1),
                                       ((13, 33), None), ((512, 3000), -1)])
def test_argmax_argmin(dtype, shape, dim):
    check_exact(lambda x: (torch.argmax(x, dim), torch.argmin(x, dim)), rnd(*shape, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_min_with_dim(dtype):
    x = rnd(6, 77, dtype=dtype)
    check_exact(lambda x: tuple(torch.max(x, -1)), x)
    check_exact(lambda x: tuple(torch.min(x, 1, keepdim=True)), x)


def test_ties_give_the_first_index():
    x = torch.randint(0, 3, (8, 70)).float()
    check_exact(lambda x: (x.argmax(-1), x.argmin(-1), x.argmax(0)), x)


def test_nan_gives_the_first_nan_as_torch_does():
    x = rnd(4, 100)
    x[1, 37] = x[1, 80] = x[2, 5] = float("nan")
    check_exact(lambda x: (x.argmax(-1), x.argmin(-1)), x)


def test_argmax_of_integers():
    x = torch.randint(-50, 50, (6, 90))
    check(lambda x: (x.argmax(-1), x.argmin(0), x.int().argmax(-1)), x)


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_decoding_argmax(batch):
    """logits.argmax(-1) over a Llama vocabulary: one kernel (two passes of a persistent reduction)."""
    check_exact(lambda x: x.argmax(-1), rnd(batch, 32000, dtype=torch.float16))


@pytest.mark.slow
def test_argmax_over_rows_longer_than_the_scratchpad():
    # 600k fp32 per row (2.4 MB) cannot stay on chip: both passes stream the row in chunks
    check_exact(lambda x: (x.argmax(-1), x.argmin(-1)), rnd(2, 600000))


# ---------------------------------------------------------------------------------------------
# cumsum (a log-step scan of pointwise kernels)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((8, 100), -1), ((37, 70), 0), ((3, 65, 7), 1), ((2, 1), -1)])
def test_cumsum(dtype, shape, dim):
    check(lambda x: torch.cumsum(x, dim) * 2, rnd(*shape, dtype=dtype))


def test_cumsum_of_integers_is_int64_and_exact():
    check(lambda x: torch.cumsum(x, 1), torch.randint(-5, 5, (4, 130)))
    check(lambda x: torch.cumsum(x, 0, dtype=torch.float32), torch.randint(-5, 5, (33, 3)))
    # Hugging Face's position ids from an attention mask
    m = torch.ones(2, 40, dtype=torch.long)
    m[1, 30:] = 0
    check(lambda m: (torch.cumsum(m, -1) - 1) * m, m)


def test_integer_division_towards_zero():
    """``div(rounding_mode="trunc")`` on integers (Inductor's truncdiv; JetMoE's expert batch index failed to
    compile without it): negative dividends and divisors round towards zero, unlike floor division."""
    a = torch.arange(-20, 20).reshape(4, 10)
    check(lambda a: a.div(3, rounding_mode="trunc"), a)
    b = torch.tensor([3, -3, 7, -2, 5, -5, 1, -1, 4, 6]).expand(4, 10).contiguous()
    got = check(lambda a, b: torch.div(a, b, rounding_mode="trunc") + 1, a, b)
    assert got.dtype == torch.int64 and int(got[0, 0]) == -20 // 3 + 2  # -6 + 1, where floor gives -7 + 1


def test_cumsum_of_a_long_row_keeps_fp32_accuracy():
    x = rnd(2, 5000)
    check(lambda x: torch.cumsum(x, -1), x, tol=dict(atol=2e-3, rtol=1e-4))


@pytest.mark.slow
def test_cumsum_of_a_large_tensor():
    # past 256k elements each step sums 4 views instead of 8
    check(lambda x: torch.cumsum(x, -1), rnd(70, 4000), tol=dict(atol=2e-3, rtol=1e-4))


# ---------------------------------------------------------------------------------------------
# Simulated times of the new kernels
# ---------------------------------------------------------------------------------------------
def simulated_kernels(fn, *args) -> list[tuple[str, float]]:
    """(kernel, simulated µs) of one call of the compiled ``fn`` (after a first call that compiles)."""
    import torch_spyre.profiler

    dev = [a.to("spyre") for a in args]
    fresh()
    f = torch.compile(fn)
    f(*dev)
    with torch_spyre.profiler.profile() as prof:
        f(*dev)
    return [(e.key, e.device_time * 1e6) for e in prof.key_averages() if e.kind == "kernel"]


TIMED = {
    "greedy argmax fp16 [1, 32000]": (lambda x: x.argmax(-1), rnd(1, 32000, dtype=torch.float16)),
    "greedy argmax fp16 [8, 32000]": (lambda x: x.argmax(-1), rnd(8, 32000, dtype=torch.float16)),
    "argmax fp32 [2, 600000] (chunked)": (lambda x: x.argmax(-1), rnd(2, 600000)),
    "max.dim fp16 [1024, 768]": (lambda x: torch.max(x, -1), rnd(1024, 768, dtype=torch.float16)),
    "gather stick dim fp16 [64, 32000] -> [64, 1]": (lambda x, i: torch.gather(x, -1, i),
                                                   rnd(64, 32000, dtype=torch.float16), ints(32000, 64, 1)),
    "gather dim 0 (moved) fp16 [512, 768] -> [64, 768]": (lambda x, i: torch.gather(x, 0, i),
                                                         rnd(512, 768, dtype=torch.float16), ints(512, 64, 768)),
    "cumsum fp32 [64, 128]": (lambda x: torch.cumsum(x, -1), rnd(64, 128)),
    "cumsum fp16 [8, 4096]": (lambda x: torch.cumsum(x, -1), rnd(8, 4096, dtype=torch.float16)),
    "cumsum fp32 [256, 4096]": (lambda x: torch.cumsum(x, -1), rnd(256, 4096)),
    "cross_entropy fp16 logits [64, 32000]": (lambda x, t: F.cross_entropy(x.float(), t),
                                             rnd(64, 32000, dtype=torch.float16), ints(32000, 64)),
}


if __name__ == "__main__":
    for name, (fn, *args) in TIMED.items():
        kernels = simulated_kernels(fn, *args)
        total = sum(us for _, us in kernels)
        print(f"{name}: {total:.1f} µs in {len(kernels)} kernel(s): "
              + ", ".join(f"{k} {us:.1f}" for k, us in kernels))


# ---------------------------------------------------------------------------------------------
# uint8 data
# ---------------------------------------------------------------------------------------------
def test_byte_results_and_inputs():
    """A uint8 result or input of a pointwise kernel (``.byte()``): its scratchpad buffer is sized as data,
    not as a mask pattern (it raised KeyError 'pattern')."""
    x = torch.from_numpy(dlfloat16.round_float32((rnd(4, 70) * 40).numpy())).half()  # the card's values
    check(lambda x: x.abs().byte(), x)
    check(lambda x: x.abs().byte() + 1, x)
    check(lambda b: b.float() * 0.5 + b, torch.randint(0, 256, (3, 200), dtype=torch.uint8,
                                                        generator=torch.Generator().manual_seed(0)))
def test_float64_constants_are_computed_in_fp32():
    """``x * np.sqrt(d)`` (CTRL's embedding scale) and a 0-d float64 tensor give Inductor float64 constants;
    they used to fail the compile (the card has no float64 unit) and now compute in fp32."""
    import numpy as np

    check(lambda a: a * np.sqrt(64) + torch.tensor(0.5, dtype=torch.float64), torch.randn(4, 64))


def test_float64_math_still_fails_with_a_clear_error():
    """Only constants are narrowed: a computation asked for in float64 is still refused, not silently fp32."""
    fresh()
    with pytest.raises(Exception, match="computes in float64, which the Spyre card cannot compute in"):
        torch.compile(lambda a: (a.double() * 2).float())(torch.randn(4, 64).to("spyre"))


def test_gather_index_that_merges_dims_of_a_host_result():
    """A MoE router's ``topk`` indices [16, 2] flattened to [32] index the expert weights
    (transformers' batched_mm experts): the view is contiguous on the host but merges dims of its buffer,
    so the gather gets a copy (it used to reach code generation as the view and fail)."""

    def route(w, logits):
        vals, idx = torch.topk(logits, 2, dim=-1)
        return w[idx.reshape(-1)] * vals.reshape(-1, 1)

    w, logits = torch.randn(8, 64), torch.randn(16, 8)
    torch.testing.assert_close(run_compiled(route, w, logits), route(w, logits), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_with_several_index_tensors(dtype):
    """``x[i, j]`` on adjacent dims is one gather of the merged dims by ``i * size + j`` (CLIP's pooling
    ``h[arange(B), ids.argmax(-1)]`` failed to compile: the pair became indirect indexing in a pointwise
    kernel). The merged view of an input is copied first (its rows are not a fixed set of sticks)."""
    check(lambda h, ids: h[torch.arange(h.shape[0], device=h.device), ids.argmax(-1)] + 1,
          rnd(2, 8, 64, dtype=dtype), ints(100, 2, 8))
    check(lambda h, i, j: h[:, i, j], rnd(3, 4, 5, 64, dtype=dtype), torch.tensor([0, 3, -1]),  # negative: from the end
          torch.tensor([[1], [4]]))  # broadcast to [2, 3]


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_counts_negative_indices_from_the_end(dtype):
    """``x[idx]`` takes -1 as the last row (Falcon's compiled forward stopped on "gather index -2 ... outside
    [0, 6)"); index_select and embedding do not, and still stop on them."""
    check(lambda x, i: x[i] * 2, rnd(6, 64, dtype=dtype), torch.tensor([-2, 0, 5, -6]))
    check(lambda x, i: x[:, i], rnd(3, 6, 64, dtype=dtype), torch.tensor([[-1, 2], [0, -3]]))


@pytest.mark.parametrize("dynamic", [False, True])
def test_index_select_of_a_kv_cache_half_is_one_gather(dynamic):
    """The serving paged attention's ``kv_cache[1].index_select(0, blocks)``: one row gather reading the cache
    where it lies. Inductor decomposes index_select into ``x[idx]``, which wraps negative indices; index_select
    takes none, so it gets no wrap kernel. With symbolic sizes (a served model's KV cache) the source used to
    be copied whole every call (sizes checked with int()), 4 MB a layer a decode step for the tiny Llama."""
    kv, blocks = rnd(2, 8, 4, 2, 16), torch.tensor([3, 0, 7])
    fn = lambda kv, i: kv[1].index_select(0, i) * 2  # noqa: E731
    names = [s.name for s in specs_of(fn, kv, blocks, dynamic=dynamic)]
    assert len(names) == 2 and "index_select" in names[0] and "mul" in names[1], names
    torch.testing.assert_close(run_compiled(fn, kv, blocks, dynamic=dynamic), fn(kv, blocks))


def test_compiled_index_select_stops_on_a_negative_index():
    """torch's index_select refuses negative indices; compiled on the card it stops with the gather's error."""
    with pytest.raises(ExecutionError, match=r"gather index -1 at position 0 is outside \[0, 8\)"):
        run_compiled(lambda x, i: x.index_select(0, i) * 2, rnd(8, 64), torch.tensor([-1, 2]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matrix_vector_products(dtype):
    """N == 1 (transformers' batched_mm MoE experts: ``bmm(weight, x.unsqueeze(-1))``): a multiply and a sum
    on the vector unit; the matmul generator cannot write an output whose last dim has one element."""
    w, x = torch.randn(32, 128, 64, dtype=dtype), torch.randn(32, 64, dtype=dtype)
    check(lambda w, x: torch.bmm(w, x.unsqueeze(-1)).squeeze(-1), w, x)
    check(lambda a, v: a @ v, torch.randn(96, 64, dtype=dtype), torch.randn(64, 1, dtype=dtype))

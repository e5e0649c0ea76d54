"""Dynamic shapes: symbolic KernelSpecs specialized per call, a bounded cache of programs per kernel.

A varying sequence length must neither break nor recompile without bound: Dynamo compiles at most two
graphs (the first, static; then one symbolic), and each kernel keeps at most
``TORCH_SPYRE_SHAPE_CACHE_SIZE`` prepared programs.
"""

from __future__ import annotations

import copy

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_spyre
from torch_spyre.compiler import wrapper
from torch_spyre.compiler.kernel_ir import DynamicShapeError, RecordingHandler

from .spyre_compile_helpers import TOL, fresh, specs_of

LENGTHS = [16, 24, 32, 40, 48]


def start() -> None:
    """A clean slate: no compiled graphs, zero counters (Dynamo's and the wrapper's)."""
    fresh()
    torch._dynamo.utils.counters.clear()
    wrapper.reset_shape_cache_stats()


def graphs_compiled() -> int:
    """Graphs Dynamo handed to the backend since :func:`start` (one per compile, recompiles included)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def assert_on_card() -> None:
    assert wrapper.host_fallback_stats() == {}, wrapper.host_fallback_stats()
    assert dict(torch_spyre.fallback_stats()) == {}, dict(torch_spyre.fallback_stats())


def run_lengths(compiled, ref_fn, make_input, lengths, tol):
    """Call ``compiled`` on spyre inputs of every length and compare with ``ref_fn`` on the CPU (fp32)."""
    for n in lengths:
        x = make_input(n)
        got = compiled(x.to("spyre")).cpu()
        ref = ref_fn(x.float())
        assert got.shape == ref.shape, (n, got.shape, ref.shape)
        torch.testing.assert_close(got.float(), ref, **tol, msg=lambda m, n=n: f"length {n}: {m}")


def softmax(x):
    return torch.softmax(x * 2, -1)


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:]) * 0.5 + 1


# --- automatic dynamic (plain torch.compile) -------------------------------------------------------
@pytest.mark.parametrize("fn", [softmax, layer_norm], ids=["softmax", "layer_norm"])
def test_default_compile_over_varying_lengths(fn):
    """Dynamo's automatic dynamic shapes: a static graph for the first length, one symbolic graph for
    all the others; every length matches the CPU and runs on the card."""
    torch.manual_seed(0)
    start()
    with torch.no_grad():
        run_lengths(torch.compile(fn), fn, lambda n: torch.randn(4, n).half(), LENGTHS, TOL[torch.float16])
    assert graphs_compiled() == 2
    assert_on_card()
    stats = wrapper.shape_cache_stats()
    # One symbolic kernel specialized for each length after the first.
    assert stats["specializations"] == len(LENGTHS) - 1, stats


@pytest.mark.slow
def test_default_compile_mlp_over_varying_lengths():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).half().eval()
    ref = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
    ref.load_state_dict({k: v.float() for k, v in mlp.state_dict().items()})
    start()
    with torch.no_grad():
        compiled = torch.compile(mlp.to("spyre"))
        run_lengths(compiled, ref, lambda n: torch.randn(2, n, 64).half(), LENGTHS, TOL[torch.float16])
    assert graphs_compiled() == 2
    assert_on_card()
    assert wrapper.shape_cache_stats()["specializations"] >= len(LENGTHS) - 1


@pytest.mark.slow
def test_training_step_over_varying_lengths():
    """Forward and AOT autograd's backward graph are both symbolic after the first length (the zoo's
    MLP training step, test_compile_zoo.py::test_mlp_forward_backward, over three batch lengths)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    dev = copy.deepcopy(ref).half().to("spyre")

    def loss_fn(m, x, y):
        return ((m(x) - y) ** 2).mean()

    start()
    compiled = torch.compile(loss_fn)
    for n in (16, 24, 40):
        x, y = torch.randn(n, 64), torch.randn(n, 32)
        for p in [*dev.parameters(), *ref.parameters()]:
            p.grad = None
        compiled(dev, x.half().to("spyre"), y.half().to("spyre")).backward()
        loss_fn(ref, x, y).backward()
        for (name, p), q in zip(dev.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu().float(), q.grad, atol=2e-3, rtol=5e-2, msg=f"length {n}, {name}")
    assert graphs_compiled() == 2
    assert wrapper.host_fallback_stats() == {}


# --- dynamic=True and mark_dynamic: one graph ------------------------------------------------------
def test_dynamic_true_compiles_one_graph_for_every_shape():
    torch.manual_seed(0)
    start()
    compiled = torch.compile(softmax, dynamic=True)
    for rows, n in [(4, 16), (3, 40), (8, 24), (5, 72)]:
        x = torch.randn(rows, n)
        torch.testing.assert_close(compiled(x.to("spyre")).cpu(), softmax(x), **TOL[torch.float32])
    assert graphs_compiled() == 1
    assert_on_card()


def test_mark_dynamic_compiles_one_graph():
    torch.manual_seed(0)
    start()
    compiled = torch.compile(layer_norm)
    for n in LENGTHS[:3]:
        x = torch.randn(4, n).half()
        dev = x.to("spyre")
        torch._dynamo.mark_dynamic(dev, 1)
        torch.testing.assert_close(compiled(dev).cpu().float(), layer_norm(x.float()), **TOL[torch.float16])
    assert graphs_compiled() == 1
    assert_on_card()


def test_symbolic_int_argument():
    """An int argument under dynamic=True is a shape symbol too (``x * n`` reads it as a scalar)."""
    start()
    compiled = torch.compile(lambda x, n: x * n + 1, dynamic=True)
    x = torch.randn(4, 32)
    for n in (3, 5, 7):
        torch.testing.assert_close(compiled(x.to("spyre"), n).cpu(), x * n + 1, **TOL[torch.float32])
    assert graphs_compiled() == 1
    assert_on_card()


@pytest.mark.slow
@pytest.mark.models
def test_tiny_bert_one_graph_three_sequence_lengths():
    from tests.zoo import tiny

    torch.manual_seed(0)
    cfg, cls = tiny("bert")
    model = cls(cfg).eval()
    start()
    with torch.no_grad():
        compiled = torch.compile(copy.deepcopy(model).half().to("spyre"))
        for n in (16, 24, 40):
            ids = torch.randint(0, 256, (2, n))
            # Bert's default token_type_ids are a gather along a stick dim: pass them, as tokenizers do.
            types = torch.zeros(2, n, dtype=torch.long)
            mask = torch.ones(2, n, dtype=torch.long)
            mask[1, n - 5:] = 0  # the second sentence is padded
            ref = model(ids, token_type_ids=types, attention_mask=mask).last_hidden_state
            on_card = [t.to("spyre") for t in (ids, types, mask)]
            for t in on_card:
                torch._dynamo.mark_dynamic(t, 1)
            got = compiled(on_card[0], token_type_ids=on_card[1], attention_mask=on_card[2]).last_hidden_state
            got = got.cpu().float()
            torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
    assert graphs_compiled() == 1
    assert_on_card()


def test_symbolic_transposed_operand_is_read_in_place():
    """``_walks_buffer_dims`` proves a symbolic permute walks its buffer's dims (sizevars), so the bmm
    reads k^T as a view: no copy kernel, as with static shapes."""
    torch.manual_seed(0)

    def scores(q, k):
        return torch.bmm(q, k.transpose(1, 2))

    q, k = torch.randn(2, 24, 64).half(), torch.randn(2, 24, 64).half()
    specs = specs_of(scores, q, k, dynamic=True)
    assert [s.generator for s in specs] == ["matmul"], [s.name for s in specs]
    assert specs[0].symbols
    compiled = torch.compile(scores, dynamic=True)
    for n in (24, 40):
        q, k = torch.randn(2, n, 64).half(), torch.randn(2, n, 64).half()
        got = compiled(q.to("spyre"), k.to("spyre")).cpu().float()
        torch.testing.assert_close(got, scores(q.float(), k.float()), **TOL[torch.float16])
    assert_on_card()


def test_symbolic_index_arithmetic():
    """Index expressions over shape symbols (a modulo by the symbolic width) are specialized per call."""

    def permute_columns(x):
        r = torch.arange(x.shape[0], device=x.device)
        c = torch.arange(x.shape[1], device=x.device)
        return x[r[:, None], ((c * 3) % x.shape[1])[None, :]] + 1

    start()
    compiled = torch.compile(permute_columns, dynamic=True)
    for shape in [(8, 32), (6, 40), (5, 64)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x.to("spyre")).cpu(), permute_columns(x), **TOL[torch.float32])
    assert graphs_compiled() == 1
    assert_on_card()


def test_indirect_index_range_is_deferred():
    """An indirect index into a symbolic size keeps the size as an expression until specialization."""
    from torch.utils._sympy.symbol import SymT, make_symbol

    from torch_spyre.compiler.kernel_ir import KernelSpec, NodeSpec

    s0 = make_symbol(SymT.SIZE, 0, integer=True, positive=True)
    h = RecordingHandler({"x0"})
    i = h.index_expr(sympy.Symbol("x0", integer=True), torch.int64)
    h.indirect_indexing(i, 2 * s0)
    assert h.ops[-1].attrs["size"] == "2*s0" and h.symbols == {"s0"}
    spec = KernelSpec("k", ["s0"], [], [NodeSpec("op0", ["s0"], [], "full", h.ops)], [], symbols=["s0"])
    assert spec.specialize({"s0": 5}).nodes[0].ops[-1].attrs["size"] == 10


# --- the bound -------------------------------------------------------------------------------------
def test_shape_cache_is_bounded_and_counted(monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_SHAPE_CACHE_SIZE", "2")
    torch.manual_seed(0)
    start()
    compiled = torch.compile(softmax, dynamic=True)
    xs = {n: torch.randn(4, n) for n in (16, 24, 32, 40)}
    for n, x in xs.items():
        torch.testing.assert_close(compiled(x.to("spyre")).cpu(), softmax(x), **TOL[torch.float32])
    stats = wrapper.shape_cache_stats()
    # One kernel (softmax is one fused reduction), four shapes, two kept: two evicted.
    counted = {k: stats[k] for k in ("specializations", "programs", "evictions", "hits")}
    assert counted == {"specializations": 4, "programs": 4, "evictions": 2, "hits": 0}, stats
    x40 = xs[40].to("spyre")
    compiled(x40)  # still cached
    assert wrapper.shape_cache_stats()["hits"] == 1
    torch.testing.assert_close(compiled(xs[16].to("spyre")).cpu(), softmax(xs[16]), **TOL[torch.float32])
    stats = wrapper.shape_cache_stats()
    assert stats["programs"] == 5 and stats["evictions"] == 3, stats  # 16 was evicted: generated again
    assert graphs_compiled() == 1


def test_shape_cache_size_must_be_a_positive_number(monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_SHAPE_CACHE_SIZE", "0")
    with pytest.raises(ValueError, match="TORCH_SPYRE_SHAPE_CACHE_SIZE='0': expected a whole number >= 1"):
        wrapper.shape_cache_size()
    monkeypatch.setenv("TORCH_SPYRE_SHAPE_CACHE_SIZE", "many")
    with pytest.raises(ValueError, match="expected a whole number"):
        wrapper.shape_cache_size()
    monkeypatch.setenv("TORCH_SPYRE_SHAPE_CACHE_SIZE", "8")
    assert wrapper.shape_cache_size() == 8


def test_shape_cache_env_var_is_a_known_setting(recwarn):
    from torch_spyre.card import config

    config._warn_unknown_env({"TORCH_SPYRE_SHAPE_CACHE_SIZE": "4", "TORCH_SPYRE_SHAPE_CACHE_SIZ": "4"})
    messages = [str(w.message) for w in recwarn]
    assert messages == ["TORCH_SPYRE_SHAPE_CACHE_SIZ is not a torch_spyre setting and is ignored; did you mean "
                        "TORCH_SPYRE_SHAPE_CACHE_SIZE?"], messages


# --- the generated wrapper -------------------------------------------------------------------------
def test_wrapper_passes_symbols_and_comments_symbolic_layouts():
    from torch._inductor.utils import run_and_get_code

    start()
    x = torch.randn(4, 24).to("spyre")
    _, (code, *_) = run_and_get_code(torch.compile(softmax, dynamic=True), x)
    run = next(line.strip() for line in code.splitlines() if ".run(" in line and "spyre_" in line)
    symbols = [a.split("=")[0] for a in run[run.index("(") + 1:-1].split(", ") if a.split("=")[0].startswith("s")]
    assert symbols and all(f"{s}={s}" in run for s in symbols), run
    alloc = next(line for line in code.splitlines() if "empty_spyre(" in line)
    assert "sticked on dim" in alloc and "device bytes depend on" in alloc, alloc
    assert "symbolic in" in code  # the kernel's header comment names its symbols


def test_buffer_reuse_needs_the_same_symbolic_view():
    """Reusing a buffer of another stick layout is wrong: with symbols, only the same view is the same
    layout for every value of them."""
    s = sympy.Symbol("s0", integer=True, positive=True)

    class Buf:
        def __init__(self, size, stride, dtype=torch.float16):
            self.size, self.stride, self.dtype = size, stride, dtype

        def get_size(self):
            return self.size

        def get_stride(self):
            return self.stride

        def get_dtype(self):
            return self.dtype

    rows = Buf([s, 64], [64, 1])
    assert wrapper._same_stick_layout(rows, Buf([s, 64], [64, 1]))
    assert not wrapper._same_stick_layout(rows, Buf([64, s], [s, 1]))  # same bytes, sticked on the other dim
    assert not wrapper._same_stick_layout(rows, Buf([s, 64], [64, 1], torch.float32))
    # Static: layouts compared as such (a transposed view of the same dense shape is the same layout).
    assert wrapper._same_stick_layout(Buf([8, 64], [64, 1]), Buf([64, 8], [1, 64]))
    assert not wrapper._same_stick_layout(Buf([8, 64], [64, 1]), Buf([64, 8], [8, 1]))


# --- what is refused, and how ------------------------------------------------------------------------
def test_a_symbol_that_is_not_a_shape_is_refused_clearly():
    """Index expressions may use shape symbols (s<n>, u<n>); anything else (a symbolic float, an unknown
    variable) cannot be bound at run time."""
    from torch.utils._sympy.symbol import SymT, make_symbol

    h = RecordingHandler({"x0"})
    x0 = sympy.Symbol("x0", integer=True)
    h.index_expr(x0 * make_symbol(SymT.SIZE, 3, integer=True), torch.int64)
    assert h.symbols == {"s3"}
    with pytest.raises(DynamicShapeError, match=r"uses the symbol zf0, which is not a shape symbol .* dynamic=False"):
        h.index_expr(x0 + make_symbol(SymT.FLOAT, 0), torch.float32)


def test_kernel_called_without_its_symbols_says_what_to_pass():
    start()
    seen = []
    orig = wrapper.SpyreKernel.__init__

    def spy(self, spec):
        seen.append(self)
        orig(self, spec)

    wrapper.SpyreKernel.__init__ = spy
    try:
        x = torch.randn(4, 24).to("spyre")
        torch.compile(softmax, dynamic=True)(x)
    finally:
        wrapper.SpyreKernel.__init__ = orig
    (kernel,) = seen
    assert kernel.spec.symbols
    buffers = {b.name: x if b.role == "input" else torch.empty_like(x) for b in kernel.spec.buffers}
    with pytest.raises(TypeError, match=f"called without .*pass their values .*{kernel.spec.symbols[0]}="):
        kernel.run(**buffers)
    with pytest.raises(DynamicShapeError, match="needs the values of shape symbols"):
        kernel.spec.specialize({})


def test_a_symbol_no_input_binds_is_refused_at_compile_time():
    """The wrapper can only pass symbols its ``call`` has: those of the graph inputs' sizes and strides
    (and SymInt inputs); unbacked u<n> are bound where they are computed."""
    from types import SimpleNamespace

    from torch._inductor.virtualized import V

    from torch_spyre.compiler.kernel_ir import KernelSpec

    from torch._inductor.ir import OpaqueObjectState, TorchBindObject

    s0, s1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    x = SimpleNamespace(maybe_get_size=lambda: [s0, 64], maybe_get_stride=lambda: [64, 1])
    # Inputs that are not tensors have no size (their get_size() raises NotImplementedError): skipped.
    opaque = OpaqueObjectState(name="arg2_1", value=object())
    script = TorchBindObject(name="arg3_1", value=None)
    graph = SimpleNamespace(graph_inputs={"arg0_1": s1, "arg1_1": x, "arg2_1": opaque, "arg3_1": script})
    spec = KernelSpec("spyre_k_0", ["s0"], [], [], [], symbols=["s0", "s1", "u0"])
    with V.set_graph_handler(graph):
        wrapper._check_symbols_bound(spec)  # s0 from x's size, s1 a SymInt input, u0 unbacked
        with pytest.raises(DynamicShapeError, match=r"needs shape symbols \['s2'\], which no graph input's size binds"):
            wrapper._check_symbols_bound(KernelSpec("spyre_k_1", ["s2"], [], [], [], symbols=["s2"]))


def test_layout_comment_of_symbolic_allocations():
    """The comment names the sticked dim (the unit-stride one, whatever the symbols' values) and the
    host shape in symbols; its byte size is left to the symbols."""
    from types import SimpleNamespace

    from torch._inductor.virtualized import V

    s = sympy.Symbol("s27", integer=True, positive=True)
    sizevars = SimpleNamespace(optimization_hint=lambda e: int(sympy.sympify(e).subs(s, 24)))
    with V.set_graph_handler(SimpleNamespace(sizevars=sizevars)):
        rows = wrapper._layout_comment((4, s), (s, 1), torch.float16)
        assert rows == "  # host [4, s27] sticked on dim 1, device bytes depend on s27"
        assert wrapper._layout_comment((s, 4), (1, s), torch.float16) == rows  # the transposed view of it
        # Strides that skip elements: the flat layout of the 7*s27 elements they reach.
        assert wrapper._layout_comment((4, s), (2 * s, 1), torch.float16) == (
            "  # host [7*s27] sticked on dim 0, device bytes depend on s27")
    assert wrapper._layout_comment((8, 64), (64, 1), torch.float16) == (
        "  # host [8, 64] sticked on dim 1, 1024 device bytes")

"""compiler/eager.py: eager ops on spyre as cached single-op programs; host fallbacks warn once and count."""

from __future__ import annotations

import pathlib
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_spyre
from torch_spyre.compiler import eager, eager_sweep, wrapper

from .spyre_compile_helpers import TOL, eager_compile_mode

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "eager-ops.md"


@pytest.fixture(autouse=True)
def compile_mode(monkeypatch):
    eager_compile_mode(monkeypatch)
    yield


def s(x: torch.Tensor) -> torch.Tensor:
    return x.to("spyre")


def _x(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_programs_only(stats):
    assert stats.compiled, "nothing ran as a program"
    assert dict(stats) == {} and stats.host == {}, f"host fallbacks: {stats.host}"
    assert wrapper.host_fallback_stats() == {}


# Common eager ops: (function, CPU inputs, tolerance dtype). fp32 matmuls round their operands to
# DLFloat16 on the card (the PE arrays multiply 16-bit floats): fp16 tolerances.
H = torch.float16
CASES = {
    "add": (lambda a, b: a + b, (_x(8, 64), _x(8, 64, seed=1)), torch.float32),
    "mul_broadcast": (lambda a, b: a * b, (_x(8, 64), _x(64, seed=1)), torch.float32),
    "div": (lambda a, b: a / b, (_x(8, 64), _x(8, 64, seed=1).abs() + 1), torch.float32),
    "exp": (torch.exp, (_x(8, 64),), torch.float32),
    "tanh": (torch.tanh, (_x(8, 64),), torch.float32),
    "gelu": (F.gelu, (_x(8, 64),), torch.float32),
    "silu": (F.silu, (_x(8, 64),), torch.float32),
    "sum": (lambda a: a.sum(-1), (_x(8, 64),), torch.float32),
    "mean": (lambda a: a.mean(0), (_x(8, 64),), torch.float32),
    "amax": (lambda a: a.amax(-1), (_x(8, 64),), torch.float32),
    "softmax": (lambda a: a.softmax(-1), (_x(8, 64),), torch.float32),
    "log_softmax": (lambda a: a.log_softmax(-1), (_x(8, 64),), torch.float32),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (64,), w, b), (_x(8, 64), _x(64, seed=1), _x(64, seed=2)),
                   torch.float32),
    "matmul": (torch.matmul, (_x(16, 64, dtype=H), _x(64, 32, dtype=H, seed=1)), H),
    "mm_fp32": (torch.mm, (_x(16, 64), _x(64, 32, seed=1)), H),
    "bmm": (torch.bmm, (_x(2, 16, 64, dtype=H), _x(2, 64, 32, dtype=H, seed=1)), H),
    "linear": (F.linear, (_x(16, 64, dtype=H), _x(32, 64, dtype=H, seed=1), _x(32, dtype=H, seed=2)), H),
    "embedding": (F.embedding, (torch.tensor([[0, 3, 5], [31, 2, 2]]), _x(32, 64)), torch.float32),
    "where": (lambda c, a, b: torch.where(c > 0, a, b), (_x(8, 64), _x(8, 64, seed=1), _x(8, 64, seed=2)),
              torch.float32),
    "cat": (lambda a, b: torch.cat([a, b], 0), (_x(8, 64), _x(4, 64, seed=1)), torch.float32),
    "transpose_contiguous": (lambda a: (a.t().contiguous() * 2), (_x(64, 64),), torch.float32),
}
FAST = ("add", "softmax", "matmul")


def _check_case(name):
    fn, inputs, tol = CASES[name]
    out = fn(*[s(x) for x in inputs])
    torch.testing.assert_close(out.cpu().float(), fn(*inputs).float(), **TOL[tol])
    assert_programs_only(torch_spyre.fallback_stats())


@pytest.mark.parametrize("name", FAST)
def test_common_ops_run_as_programs_and_match_cpu(name):
    _check_case(name)


@pytest.mark.parametrize("name", [n for n in CASES if n not in FAST])
def test_more_common_ops_run_as_programs_and_match_cpu(name):
    _check_case(name)


def test_second_call_with_the_same_signature_does_not_recompile():
    a, b = s(_x(8, 64)), s(_x(8, 64, seed=1))
    torch.sigmoid(a)  # compiles
    before = eager.cache_stats()
    prepared = []
    orig = wrapper.SpyreKernel._prepare
    wrapper.SpyreKernel._prepare = lambda self, *args: prepared.append(self.name) or orig(self, *args)
    try:
        out = torch.sigmoid(b)
    finally:
        wrapper.SpyreKernel._prepare = orig
    after = eager.cache_stats()
    assert after["compiles"] == before["compiles"] and after["hits"] == before["hits"] + 1
    assert prepared == []  # the program was generated and prepared once, for the first call
    assert torch_spyre.fallback_stats().compiled == {"sigmoid.out": 2}
    torch.testing.assert_close(out.cpu(), torch.sigmoid(b.cpu()))


def test_a_new_signature_compiles_again():
    torch.sigmoid(s(_x(8, 64)))
    n = eager.cache_stats()["compiles"]
    torch.sigmoid(s(_x(8, 128)))  # another shape
    torch.sigmoid(s(_x(8, 64, dtype=torch.float16)))  # another dtype
    torch.sigmoid(torch_spyre.to_spyre(_x(8, 64), stick_dim=0))  # another stick layout
    assert eager.cache_stats()["compiles"] == n + 3


def test_cache_is_a_bounded_lru():
    eager.reset_cache(size=2)
    try:
        for n in (64, 128, 192):
            torch.neg(s(_x(4, n)))
        stats = eager.cache_stats()
        assert stats["entries"] == 2 and stats["evictions"] == 1 and stats["size"] == 2
        torch.neg(s(_x(4, 192)))  # most recent: still cached
        assert eager.cache_stats()["hits"] == 1
    finally:
        eager.reset_cache()


def test_in_place_and_out_variants_write_the_real_outputs():
    a, b = _x(8, 64), _x(8, 64, seed=1)
    x = s(a)
    r = x.mul_(s(b))
    assert r is x
    torch.testing.assert_close(x.cpu(), a * b)
    out = s(torch.zeros(8, 64))
    r = torch.add(s(a), s(b), alpha=2, out=out)
    assert r is out
    torch.testing.assert_close(out.cpu(), a + 2 * b)
    view = s(torch.zeros(8, 128))[:, 64:]  # an out= view into a larger storage
    torch.exp(s(a), out=view)
    torch.testing.assert_close(view.cpu(), a.exp(), **TOL[torch.float32])
    assert view._base is not None and view.cpu().shape == (8, 64)
    assert_programs_only(torch_spyre.fallback_stats())


def _kernels(fn):
    import torch_spyre.profiler

    with torch.no_grad(), torch_spyre.profiler.profile() as prof:
        result = fn()
    torch.spyre.synchronize()
    return result, [r.name for r in prof.events() if r.kind == "kernel"]


def test_an_eager_fp32_linear_writes_its_out_directly_without_a_copy_kernel():
    """nn.Linear reaches addmm.out with a write-only out=: the matmul kernel writes it; before, a copy
    program followed (4 launches: the two DLFloat16 splits, the matmul, the copy). The weight's split
    runs once (compiler/weight_parts.py): a cached call is A's split and the matmul."""
    lin = torch.nn.Linear(64, 96)
    x = _x(4, 8, 64)
    on_spyre = torch.nn.Linear(64, 96).to("spyre")
    on_spyre.load_state_dict(lin.state_dict())
    _kernels(lambda: on_spyre(s(x)))  # compile
    y, names = _kernels(lambda: on_spyre(s(x)))
    assert len(names) == 2 and names[-1].startswith("spyre_addmm") and not any("copy" in n for n in names), names
    torch.testing.assert_close(y.cpu(), lin(x), **TOL[torch.float32])
    assert_programs_only(torch_spyre.fallback_stats())


def test_an_out_the_matmul_reads_or_of_other_strides_is_still_copied_into():
    """The direct write needs an out= nothing else reads, of the kernel's own strides: otherwise the copy
    kernel stays, and the results are the CPU's."""
    a, b, c = _x(8, 64), _x(64, 64, seed=1), _x(8, 64, seed=2)
    read = s(c.clone())
    (r, names) = _kernels(lambda: torch.addmm(read, s(a), s(b), out=read))  # out= is also the bias
    # B's split; A's split, the matmul, a copy kernel last (one program input for the bias and out=: before,
    # the synthetic base aot_autograd built for the two added a fifth kernel).
    assert r is read and names[-2].startswith("spyre_addmm") and len(names) == 4, names
    torch.testing.assert_close(read.cpu(), torch.addmm(c, a, b), **TOL[torch.float32])
    view = s(torch.zeros(8, 128))[:, 64:]  # strides (128, 1), not the kernel's (64, 1)
    _, names = _kernels(lambda: torch.mm(s(a), s(b), out=view))
    assert names[-2].startswith("spyre_mm") and len(names) == 4, names
    torch.testing.assert_close(view.cpu(), a @ b, **TOL[torch.float32])
    assert_programs_only(torch_spyre.fallback_stats())


def test_out_of_another_shape_is_resized_as_on_the_cpu():
    a = _x(8, 64)
    empty = s(torch.empty(0))
    torch.tanh(s(a), out=empty)  # no elements: resized without a warning
    assert empty.shape == (8, 64)
    wrong = s(torch.zeros(3))
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.tanh(s(a), out=wrong)
    torch.testing.assert_close(wrong.cpu(), a.tanh(), **TOL[torch.float32])
    assert_programs_only(torch_spyre.fallback_stats())


def test_the_resize_warning_names_the_op_once(capfd):
    """The program path warns as the host path does (tests/device/test_eager.py), once: the fake run that
    finds the out's new shape gets an out of no elements, so torch's C++ warning is not printed too."""
    src, idx = _x(16, 64), torch.tensor([5, 0, 9])
    out = s(torch.zeros(7))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.index_select(s(src), 0, s(idx), out=out)
    (msg,) = [str(w.message) for w in caught if "was resized" in str(w.message)]
    assert "had shape [7], which does not match the required output shape [3, 64]" in msg
    assert msg.endswith("(aten::index_select.out, argument 'out', a spyre:0 tensor)")
    assert "was resized" not in capfd.readouterr().err
    torch.testing.assert_close(out.cpu(), src[idx])
    assert_programs_only(torch_spyre.fallback_stats())


def test_python_numbers_and_cpu_scalars_are_constants_of_the_program():
    i = torch.tensor([5, 7, -3], dtype=torch.int32)
    r = s(i) % 4  # remainder.Tensor with a wrapped number 4
    assert r.dtype == torch.int32 and torch.equal(r.cpu(), i % 4)
    x = _x(4, 64)
    torch.testing.assert_close((s(x) * torch.tensor(2.5)).cpu(), x * 2.5)
    n = eager.cache_stats()["compiles"]
    torch.testing.assert_close((s(x) * torch.tensor(3.0)).cpu(), x * 3.0)  # another value: another program
    assert eager.cache_stats()["compiles"] == n + 1
    assert_programs_only(torch_spyre.fallback_stats())


def test_an_op_without_a_lowering_warns_once_and_counts_as_host():
    a = _x(8, 64)
    with pytest.warns(UserWarning, match=r"aten::topk.values runs on the host \(CPU\), not as a Spyre program"):
        out = torch.topk(s(a), 3).values
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out2 = torch.topk(s(a), 3).values  # no second warning, no second compile attempt
    torch.testing.assert_close(out.cpu(), a.topk(3).values)
    torch.testing.assert_close(out2.cpu(), a.topk(3).values)
    stats = torch_spyre.fallback_stats()
    assert stats.host == {"topk.values": 2} and stats == {"topk.values": 2} and stats.compiled == {}
    assert eager.cache_stats()["failures"] >= 1


def test_ops_kept_on_the_host_by_design():
    x = s(_x(8, 64))
    with pytest.warns(UserWarning, match="random op"):
        torch.rand_like(x)
    assert x.sum().item() == pytest.approx(_x(8, 64).sum().item(), rel=1e-5, abs=1e-4)  # no warning for .item()
    stats = torch_spyre.fallback_stats()
    assert stats.host == {"_local_scalar_dense": 1, "uniform_": 1}
    assert stats.compiled == {"sum.IntList_out": 1}
    reasons = eager.host_reasons()
    assert reasons["uniform_"].startswith("random op")
    assert reasons["_local_scalar_dense"] == "reads one value to the host"


def test_host_mode_sends_everything_to_the_host_without_warnings(monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "host")
    a = _x(8, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = torch.cumsum(torch.exp(s(a)), -1)
    torch.testing.assert_close(out.cpu(), a.exp().cumsum(-1))
    stats = torch_spyre.fallback_stats()
    assert stats.compiled == {} and stats.host == {"cumsum.out": 1, "exp.out": 1}


def test_bad_mode_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "gpu")
    with pytest.raises(ValueError, match="TORCH_SPYRE_EAGER='gpu' is not one of compile, host"):
        eager.mode()


def test_programs_take_simulated_time_on_the_card():
    """The events around two programs are apart by exactly the programs' simulated times (each launch
    costs its prepared ProgramTiming.total_s; one stream, no idle gap)."""
    import torch_spyre.profiler

    x = s(_x(64, 64))
    torch.exp(x) * 2  # compile both programs
    stream = torch.spyre.current_stream()
    start = torch.spyre.Event(enable_timing=True)
    end = torch.spyre.Event(enable_timing=True)
    with torch_spyre.profiler.profile() as prof:
        start.record(stream)
        torch.exp(x) * 2
        end.record(stream)
    end.synchronize()
    recs = prof.events()
    assert [(r.kind, r.name.startswith("spyre_")) for r in recs] == [("kernel", True), ("kernel", True)]
    for r in recs:
        assert r.duration == pytest.approx(r.details["timing"].total_s, rel=1e-12)
    assert recs[0].start == pytest.approx(start.time, abs=1e-15) and recs[1].end == pytest.approx(end.time, abs=1e-15)
    assert recs[1].start == pytest.approx(recs[0].end, abs=1e-15)
    total_ms = sum(r.details["timing"].total_s for r in recs) * 1e3
    assert total_ms > 0
    assert start.elapsed_time(end) == pytest.approx(total_ms, rel=1e-9)


def test_programs_run_on_the_current_stream_as_kernels():
    from torch_spyre.runtime import stream as rt

    x = s(_x(8, 64))
    x * 2  # compile
    got = []
    rt.add_listener(got.append)
    try:
        s2 = torch.spyre.Stream()
        with torch.spyre.stream(s2):
            x * 2
    finally:
        rt.remove_listener(got.append)
    assert [(r.kind, r.stream_id) for r in got] == [("kernel", s2.stream_id)]


def test_autograd_backward_ops_run_as_programs_too():
    x, w = _x(16, 64, dtype=H), _x(32, 64, dtype=H, seed=1)
    xd, wd = s(x).requires_grad_(), s(w).requires_grad_()
    loss = torch.tanh(F.linear(xd, wd)).sum()
    loss.backward()
    xc, wc = x.float().requires_grad_(), w.float().requires_grad_()
    torch.tanh(F.linear(xc, wc)).sum().backward()
    torch.testing.assert_close(xd.grad.cpu().float(), xc.grad, atol=0.1, rtol=0.05)
    torch.testing.assert_close(wd.grad.cpu().float(), wc.grad, atol=0.1, rtol=0.05)
    stats = torch_spyre.fallback_stats()
    assert "mm.out" in stats.compiled and "tanh_backward.grad_input" in stats.compiled
    assert stats.host == {}, stats.host


@pytest.mark.slow
@pytest.mark.parametrize("opt", [torch.optim.SGD, torch.optim.AdamW])
def test_training_steps_match_cpu(opt):
    """Forward, backward and (foreach) optimizer steps of a small MLP: every op runs as a program (the
    loss's ``nll_loss_forward`` too: its index read is the gather generator's)."""
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 8))
    dev = copy.deepcopy(model).to("spyre")
    x, t = _x(16, 64), torch.arange(16) % 8
    for m, xx, tt in ((model, x, t), (dev, s(x), s(t))):
        o = opt(m.parameters(), lr=1e-2)
        for _ in range(2):
            o.zero_grad()
            F.cross_entropy(m(xx), tt).backward()
            o.step()
    for a, b in zip(dev.parameters(), model.parameters()):
        diff = (a.detach().cpu() - b.detach()).abs()
        if opt is torch.optim.SGD:
            assert diff.max() < 2e-3
        else:
            # Adam normalizes each update: a gradient near 0 whose sign the DLFloat16-rounded matmul
            # operands flip moves that weight by up to 2 lr per step.
            assert diff.max() <= 2 * 1e-2 * 2 and diff.mean() < 1e-4
    stats = torch_spyre.fallback_stats()
    assert stats.host == {}, stats.host
    assert "nll_loss_forward.output" in stats.compiled and sum(stats.compiled.values()) > 30


# ---------------------------------------------------------------------------------------------
# docs/eager-ops.md against the code
# ---------------------------------------------------------------------------------------------
DOC_SAMPLE = ("add", "softmax", "topk", "rand_like", "item")


def test_supported_ops_doc_matches_the_code_on_a_sample():
    documented = eager_sweep.parse(DOC.read_text())
    assert set(documented) == set(eager_sweep.CASES)
    for name in DOC_SAMPLE:
        r = eager_sweep.run_case(name)
        assert documented[name] == {"program": sorted(r["program"]), "host": sorted(r["host"])}, name


@pytest.mark.slow
def test_supported_ops_doc_cases_are_the_sweep():
    assert DOC.read_text().startswith(eager_sweep.render(eager_sweep.sweep()) + "\n## OpInfo sweep")


def _without_host_reasons(section: str) -> list[str]:
    """The section with each table row's last column (why an op ran on the host) dropped: that text is
    Inductor's own error wording, which depends on what ran earlier in the process (e.g. its
    make_fallback assertion fires only the first time). Which ops run as programs, the counts, the
    mismatches and the raising samples are all still compared."""
    return [line.rsplit("|", 2)[0] if line.startswith("| `") else line for line in section.splitlines()]


@pytest.mark.slow
def test_supported_ops_doc_opinfo_section_is_the_sweep():  # about a minute and a half
    text = DOC.read_text()
    documented = text[text.index("## OpInfo sweep"):]
    swept = eager_sweep.render_opinfo(eager_sweep.opinfo_sweep())
    assert _without_host_reasons(documented) == _without_host_reasons(swept)


def test_compile_is_the_default_mode(monkeypatch):
    monkeypatch.delenv("TORCH_SPYRE_EAGER", raising=False)
    assert eager.mode() == "compile"
    x = _x(4, 64)
    torch.testing.assert_close((s(x) * 2 + 1).cpu(), x * 2 + 1)
    assert_programs_only(torch_spyre.fallback_stats())


@pytest.mark.parametrize("mode", ["compile", "host"])
def test_mixed_dtype_matmul_is_refused_as_on_the_cpu(mode, monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    a, b = _x(3, 64, dtype=torch.float16), _x(64, 8)
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
        a @ b
    with pytest.raises(RuntimeError, match=r"aten::mm.* expects operands of one dtype, got self: float16, "
                                            r"mat2: float32; convert one"):
        s(a) @ s(b)
    assert torch_spyre.fallback_stats().compiled == {}  # refused before anything ran


@pytest.mark.parametrize("mode", ["compile", "host"])
def test_eager_sdpa_with_a_bool_mask_runs_as_flash_attention(mode, monkeypatch):
    """Eager SDPA reaches the device's AutogradPrivateUse1 kernel: one spyre::flash_attention, so a bool
    mask never becomes fp16 -inf scores (the NaN/Inf code in DLFloat16)."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", mode)
    q, k, v = (_x(2, 4, 16, 32, dtype=torch.float16, seed=i) for i in range(3))
    mask = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[..., 0] = True  # every query sees a key
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    out = F.scaled_dot_product_attention(s(q), s(k), s(v), attn_mask=s(mask))
    assert not out.cpu().isnan().any()
    torch.testing.assert_close(out.cpu().float(), ref, **TOL[torch.float16])
    stats = torch_spyre.fallback_stats()
    ran = stats.compiled if mode == "compile" else stats.host
    assert ran == {"spyre::flash_attention": 1}, (stats.compiled, stats.host)


def test_eager_sdpa_needing_gradients_keeps_the_decomposition():
    q, k, v = (_x(1, 2, 8, 16, seed=i) for i in range(3))
    qs = s(q).requires_grad_()
    F.scaled_dot_product_attention(qs, s(k), s(v), is_causal=True).sum().backward()
    qc = q.clone().requires_grad_()
    F.scaled_dot_product_attention(qc, k, v, is_causal=True).sum().backward()
    torch.testing.assert_close(qs.grad.cpu(), qc.grad, **TOL[torch.float16])  # fp32 matmuls round to 16 bits
    assert "spyre::flash_attention" not in torch_spyre.fallback_stats().compiled


def _zero_and_index_out(src, idx):
    z = s(torch.ones(6, 64))
    z.zero_()
    out = s(torch.empty(3, 64))
    torch.ops.aten.index.Tensor_out(s(src), [s(idx)], out=out)
    return z, out


def test_ops_torch_runs_under_no_dispatch_go_to_the_host_and_compile_later():
    """Torch's tracers compute on real tensors under ``no_dispatch()`` (fake tensors' constant propagation
    and fallback kernels, Inductor's constant inlining): no one-op graph can be traced there (making a
    fake tensor fails an assertion). Such a call runs on the host without a warning, and its signature is
    not remembered as a host op: the same call outside compiles (it stayed on the host, warning about
    the AssertionError)."""
    from torch.utils._mode_utils import no_dispatch

    eager.reset_cache()
    src, idx = _x(16, 64), torch.tensor([5, 0, 9])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with no_dispatch():
            z, out = _zero_and_index_out(src, idx)
    assert torch.equal(z.cpu(), torch.zeros(6, 64)) and torch.equal(out.cpu(), src[idx])
    stats = torch_spyre.fallback_stats()
    assert stats.host.keys() >= {"zero_", "index.Tensor_out"} and not stats.compiled
    assert eager.host_reasons()["index.Tensor_out"] == eager.UNDER_NO_DISPATCH
    assert eager.cache_stats()["failures"] == 0

    torch_spyre.reset_fallback_stats()
    z, out = _zero_and_index_out(src, idx)
    assert torch.equal(z.cpu(), torch.zeros(6, 64)) and torch.equal(out.cpu(), src[idx])
    stats = torch_spyre.fallback_stats()
    assert stats.compiled.keys() >= {"zero_", "index.Tensor_out"}
    assert_programs_only(stats)


def test_eager_ops_while_torch_compile_compiles_run_on_the_host_without_warnings(tmp_path, monkeypatch):
    """Inductor prints a graph's spyre tensor constants into its repro string while it compiles the graph
    (eager ops on real tensors); a one-op graph cannot be compiled from in there (with the FX graph cache
    on, torch's default, Inductor's per-compile Triton bundler asserts). Those ops run on the host quietly
    and nothing is remembered against them."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # a cache miss: the graph is compiled
    def f(x):
        t = torch.tensor([1.0, 2.0, 3.0, 5.0], device="spyre")  # a constant of the graph (printed)
        return x + t.mul_(2)

    torch._dynamo.reset()
    eager.reset_cache()
    x = torch.arange(4.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch._inductor.config.patch(fx_graph_cache=True):
            out = torch.compile(f)(s(x))
    torch.testing.assert_close(out.cpu(), x + torch.tensor([2.0, 4.0, 6.0, 10.0]))
    assert not [str(w.message) for w in caught if "AssertionError" in str(w.message)]
    assert not [r for r in eager.host_reasons().values() if "AssertionError" in r]
    assert eager.DURING_GRAPH_COMPILE in eager.host_reasons().values()

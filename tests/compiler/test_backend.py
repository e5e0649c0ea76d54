"""backend.py + wrapper.py + debug.py: registration, the generated wrapper, prepare-once, fallbacks, debug files."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import torch_spyre
from torch_spyre.compiler import backend, optimizations, wrapper

from .spyre_compile_helpers import TOL, fresh


def test_registration_is_idempotent_and_complete():
    backend.register()
    backend.register()
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import (
        get_device_op_overrides,
        get_scheduling_for_device,
        get_wrapper_codegen_for_device,
    )

    assert get_scheduling_for_device("spyre").__name__ == "SpyreScheduling"
    assert get_wrapper_codegen_for_device("spyre").__name__ == "SpyreWrapperCodegen"
    assert "torch.spyre.synchronize()" == get_device_op_overrides("spyre").synchronize()
    props = get_interface_for_device("spyre").get_device_properties()
    assert props.multi_processor_count == 32 and props.num_cores == 32
    assert backend.inductor_attr("Scheduling") is get_scheduling_for_device("spyre")
    assert backend.inductor_attr("CppWrapperCodegen") is None


def test_generated_wrapper_is_readable():
    from torch._inductor.utils import run_and_get_code

    fresh()
    a, b = torch.randn(32, 64).to("spyre"), torch.randn(64).to("spyre")
    out, (code,) = run_and_get_code(torch.compile(lambda x, y: torch.sigmoid(x) * y), a, b)
    assert "from torch_spyre.compiler.wrapper import SpyreKernel, empty_spyre" in code
    assert "= SpyreKernel.load(" in code and "# kernel spyre_" in code
    assert "empty_spyre((32, 64), (64, 1), torch.float32, 0)  # host [32, 64] sticked on dim 1" in code
    assert ".run(arg0_1=arg0_1, arg1_1=arg1_1, buf0=buf0)" in code
    torch.testing.assert_close(out.cpu(), torch.sigmoid(a.cpu()) * b.cpu())


def test_programs_are_prepared_once_and_launched_per_call():
    fresh()
    captured = []
    orig = wrapper.SpyreKernel._prepare

    def spy(self, places, card, key):
        captured.append(self.name)
        return orig(self, places, card, key)

    wrapper.SpyreKernel._prepare = spy
    try:
        f = torch.compile(lambda x: x * 3 - 1)
        x = torch.randn(64, 64).to("spyre")
        for _ in range(3):
            y = f(x)
    finally:
        wrapper.SpyreKernel._prepare = orig
    assert len(captured) == 1
    torch.testing.assert_close(y.cpu(), x.cpu() * 3 - 1)


def test_host_fallbacks_in_compiled_graphs_are_counted():
    fresh()
    f = torch.compile(lambda x: torch.sort(x, -1).values * 2)
    x = torch.randn(8, 16).to("spyre")
    torch.testing.assert_close(f(x).cpu(), torch.sort(x.cpu(), -1).values * 2)
    stats = wrapper.host_fallback_stats()
    assert stats and any("sort" in k for k in stats), stats


def test_an_op_without_lowering_runs_as_the_eager_op():
    """Bit operations on integers: the vector unit has logical operations only. The compile does not fail
    (compiler/fallback.py, more in test_compile_fallback.py): the op runs eagerly and is counted."""
    import warnings

    fresh()
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(lambda a: ((a * 8).int() & 3) + 1)(x.to("spyre"))
    assert torch.equal(got.cpu(), ((x * 8).int() & 3) + 1)
    assert list(torch_spyre.fallback_stats().compile_fallbacks) == ["aten.bitwise_and.Scalar"]
    assert any("bitwise" in str(w.message) and "no lowering for the card" in str(w.message) for w in caught)


def test_debug_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    fresh()
    x = torch.randn(16, 128).to("spyre")
    torch.compile(lambda a: torch.softmax(a, -1))(x)
    files = sorted(os.listdir(tmp_path))
    stems = {f.split(".")[0] for f in files}
    assert len(stems) == 1
    stem = stems.pop()
    for suffix in (".program.txt", ".program.json", ".decisions.txt", ".spec.txt"):
        assert stem + suffix in files
    text = (tmp_path / f"{stem}.decisions.txt").read_text()
    assert "(reduction)" in text and "work division" in text and "scratchpad" in text
    assert "aten.amax" in text and "test_backend.py" in text  # provenance: op and source line
    from torch_spyre.program import Program

    assert Program.load(str(tmp_path / f"{stem}.program.json")).name == stem


def test_fx_graph_cache_key_carries_the_compiler_fingerprint():
    from torch._inductor.codegen.common import get_custom_backend_pass_for_device

    p = get_custom_backend_pass_for_device("spyre")
    assert p is not None and p.uuid() == backend.compiler_fingerprint()
    sources, rest = p.uuid().split("-card-")
    card, off = rest.split("-off-")
    assert len(sources) == 64 and len(card) == 16 and off == optimizations.fingerprint()


def test_the_cache_key_changes_with_the_card_configuration(monkeypatch):
    from torch_spyre.device import cards

    before = backend.compiler_fingerprint()
    monkeypatch.setattr(cards, "_config", cards.config().model_copy(update={"num_cores": 16}))
    assert backend.compiler_fingerprint() != before
    monkeypatch.undo()
    assert backend.compiler_fingerprint() == before


def test_lazy_registration_through_the_device_module(run_python=None):
    """A fresh process compiles without registering anything by hand: Inductor's lazy PrivateUse1
    lookup reaches torch.spyre.Scheduling, which registers the backend."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent('''
        import torch
        torch._inductor.config.fx_graph_cache = False
        x = torch.randn(8, 32).to("spyre")
        y = torch.compile(lambda a: torch.softmax(a, -1))(x)
        assert torch.allclose(y.cpu(), torch.softmax(x.cpu(), -1), atol=1e-5)
        print("ok")
    ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_fx_graph_cache_hit_in_a_second_process(tmp_path):
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent('''
        import torch, torch_spyre
        from torch_spyre.compiler import backend
        backend.register()
        from torch._dynamo.utils import counters
        x = torch.randn(16, 48).to("spyre")
        y = torch.compile(lambda a: torch.tanh(a) * 3 + a.sum(-1, keepdim=True))(x)
        ref = torch.tanh(x.cpu()) * 3 + x.cpu().sum(-1, keepdim=True)
        assert torch.allclose(y.cpu(), ref, atol=1e-4), (y.cpu() - ref).abs().max()
        print("hits", counters["inductor"]["fxgraph_cache_hit"])
    ''')
    env = {**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    # the same card twice, then a card of 16 cores: a wrapper compiled for one card is not another's
    envs = [env, env, {**env, "TORCH_SPYRE_NUM_CORES": "16"}]
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)
            for e in envs]
    outs = [r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-1500:] for r in runs]
    assert outs == ["hits 0", "hits 1", "hits 0"], outs


def test_dynamo_never_traces_the_device_kernels():
    """backward() inside a compiled function graph-breaks; autograd then enters the device's Python
    kernels while Dynamo's frame hook is active. Dynamo must skip them, not try to trace numpy/ctypes."""
    import warnings

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref.load_state_dict(model.state_dict())
    model = model.to("spyre")
    x = torch.randn(8, 16)

    def step(m, inp):
        loss = m(inp).square().mean()
        loss.backward()
        return loss

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(step)(model, x.to("spyre"))
    ref_loss = step(ref, x)
    traced_ours = [str(w.message) for w in caught if "Dynamo does not know how to trace" in str(w.message)]
    assert not traced_ours, traced_ours[:1]
    torch.testing.assert_close(model[0].weight.grad.cpu(), ref[0].weight.grad, atol=1e-3, rtol=1e-2)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-3)


class LayerName:
    """An opaque value type as vLLM 0.32 registers one (``vllm/utils/torch_utils.py``): with ``hoist=True``
    torch.compile lifts it to a graph input (one graph for every layer) instead of baking it in."""

    def __init__(self, value: str):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, LayerName) and self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def __fx_repr__(self):
        return f"LayerName({self.value!r})", {"LayerName": LayerName}


_LAYER_SCALES = {"layers.0": 2.0, "layers.1": 3.0}
_scale_by_layer = None


def _layer_op():
    """``spyretest::scale_by_layer(Tensor x, LayerName name)``: a custom op taking the opaque name, as
    vLLM's attention ops take theirs (defined once per process)."""
    global _scale_by_layer
    if _scale_by_layer is None:
        from torch._library.opaque_object import register_opaque_type

        register_opaque_type(LayerName, typ="value", hoist=True)

        @torch.library.custom_op("spyretest::scale_by_layer", mutates_args=())
        def scale_by_layer(x: torch.Tensor, name: LayerName) -> torch.Tensor:
            return x * _LAYER_SCALES[name.value]

        @scale_by_layer.register_fake
        def _(x, name):
            return torch.empty_like(x)

        _scale_by_layer = scale_by_layer
    return _scale_by_layer


def test_a_graph_with_an_opaque_input_compiles():
    """A graph input that is not a tensor (vLLM's opaque layer names) has no size: the wrapper's check
    of the shape symbols its kernels need skips it (it raised NotImplementedError from get_size())."""
    op = _layer_op()

    def f(x, name):
        return op(x + 1, name) * 2

    fresh()
    x = torch.arange(8.0).reshape(2, 4)
    compiled = torch.compile(f, fullgraph=True)
    for name, scale in _LAYER_SCALES.items():
        out = compiled(x.to("spyre"), LayerName(name))
        assert out.device.type == "spyre"
        torch.testing.assert_close(out.cpu(), (x + 1) * scale * 2)


@pytest.mark.parametrize("benchmark", [False, True], ids=["combo", "combo_benchmarked"])
def test_combo_kernels_setting_leaves_spyre_kernels_alone(benchmark):
    """vLLM sets ``combo_kernels=True`` (and ``benchmark_combo_kernel``) for every non-CPU platform.
    Combo kernels are Triton-only: grouping spyre nodes made the scheduler assert at codegen (or, when
    benchmarked, import triton and call the scheduling's benchmark_fused_nodes). Spyre nodes stay out of
    the grouping, so each is its own kernel, as without the setting."""
    def f(a, b):
        return (a.sin() + 1) * 2, b.cos().sum(0), (a @ b.T).relu()

    a, b = torch.randn(8, 64, dtype=torch.float16), torch.randn(8, 64, dtype=torch.float16)
    fresh()
    with torch._inductor.config.patch(combo_kernels=True, benchmark_combo_kernel=benchmark):
        out = torch.compile(f)(a.to("spyre"), b.to("spyre"))
    for o, r in zip(out, f(a.float(), b.float())):
        torch.testing.assert_close(o.cpu().float(), r, **TOL[torch.float16])


@pytest.mark.slow
def test_inductor_traces_its_patterns_without_card_work():
    """Inductor traces its replacement patterns once per process and device, at the first compile that misses
    its FX graph cache; for a spyre graph that was card work (device copies, 0.52 ms of a served request's
    TTFT) that a warm cache skipped, so simulated time depended on the host's disk cache. It is traced on the
    CPU now: asking for a spyre graph's patterns queues nothing on the card. In a fresh process: the tracing
    is cached per process and device (``init_once_fakemode``), so after any earlier compile in this one the
    check would pass without the patch."""
    code = """
import torch, torch_spyre
from torch._inductor.fx_passes import joint_graph
from torch_spyre.compiler import backend
from torch_spyre.runtime import stream
backend.register()
work = []
stream.add_listener(work.append)
joint_graph.lazy_init(torch.device("spyre", 0))
stream.remove_listener(work.append)
print("card work records:", len(work))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "card work records: 0" in done.stdout, done.stdout

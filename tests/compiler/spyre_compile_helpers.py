"""Shared helpers for the compiler tests: compile on spyre, compare with the CPU, count fallbacks."""

from __future__ import annotations

import torch

import torch_spyre
from torch_spyre.compiler import backend, wrapper
from torch_spyre.compiler.kernel_ir import KernelSpec

backend.register()
# Tests exercise the code generation every time (the FX graph cache works for spyre, see
# test_backend.py::test_fx_graph_cache_hit_in_a_second_process).
torch._inductor.config.fx_graph_cache = False

# DLFloat16 keeps 9 fraction bits (fp16 keeps 10): results differ from fp32 by a few 2^-10 relative.
TOL = {torch.float16: dict(atol=3e-2, rtol=2e-2), torch.float32: dict(atol=1e-4, rtol=1e-4),
       torch.bfloat16: dict(atol=5e-2, rtol=3e-2)}


def eager_compile_mode(monkeypatch, fresh_cache: bool = False) -> None:
    """Eager ops as compiled programs (``TORCH_SPYRE_EAGER=compile``), the fallback counters and warnings
    reset; with ``fresh_cache`` also the eager program cache and the shape cache's counters (so that a test
    can count compiles and hits)."""
    from torch_spyre.compiler import eager, kernel_runtime

    monkeypatch.setenv("TORCH_SPYRE_EAGER", "compile")
    torch_spyre.reset_fallback_stats()
    wrapper.reset_host_fallback_stats()
    eager.reset_warnings()
    if fresh_cache:
        eager.reset_cache()
        kernel_runtime.reset_shape_cache_stats()


def fresh():
    torch._dynamo.reset()
    wrapper.reset_host_fallback_stats()
    wrapper.reset_compile_fallback_warnings()
    torch_spyre.reset_fallback_stats()


def specs_of(fn, *args, dynamic=False):
    """Compile ``fn`` on spyre and capture the KernelSpecs the wrapper defined."""
    seen: list[KernelSpec] = []
    orig = wrapper.SpyreKernel.__init__

    def spy(self, spec):
        seen.append(spec)
        orig(self, spec)

    fresh()
    wrapper.SpyreKernel.__init__ = spy
    try:
        torch.compile(fn, dynamic=dynamic)(*[a.to("spyre") for a in args])
    finally:
        wrapper.SpyreKernel.__init__ = orig
    return seen


def run_compiled(fn, *args, dynamic=False):
    """fn compiled (default backend) on spyre copies of ``args``; returns the results on the CPU."""
    fresh()
    dev = [a.to("spyre") if isinstance(a, torch.Tensor) else a for a in args]
    compiled = torch.compile(fn, dynamic=dynamic)
    # The first call compiles (constant folding may run eager device ops), prepares the programs and
    # runs them on the checked executor, which proves them; the second runs them on the fast executor.
    first = _as_tuple(compiled(*dev))
    first = [o.cpu() if isinstance(o, torch.Tensor) else o for o in first]
    wrapper.reset_host_fallback_stats()
    torch_spyre.reset_fallback_stats()
    out = compiled(*dev)  # what is checked: a call of the compiled graph
    outs = _as_tuple(out)
    for o in outs:
        assert o.device.type == "spyre", f"compiled result on {o.device}"
    cpu = [o.cpu() for o in outs]
    for k, (a, b) in enumerate(zip(first, cpu)):
        assert same_bits(a, b), f"output {k}: the fast executor's bits differ from the checked executor's"
    return type(out)(cpu) if isinstance(out, (tuple, list)) else cpu[0]


def profiled_kernels(fn, args, off: tuple[str, ...] = (), no_grad: bool = False):
    """(kernel records of the second call, result on the CPU) of ``fn`` compiled on spyre copies of ``args``
    with the optimizations ``off`` switched off (under ``torch.no_grad`` when asked)."""
    import contextlib

    import torch_spyre.profiler
    from torch_spyre.compiler import optimizations

    fresh()
    dev = [a.to("spyre") for a in args]
    with torch.no_grad() if no_grad else contextlib.nullcontext(), optimizations.disabled(*off):
        compiled = torch.compile(fn)
        compiled(*dev)
        with torch_spyre.profiler.profile() as prof:
            out = compiled(*dev)
    return [r for r in prof.events() if r.kind == "kernel"], out.cpu()


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def check(fn, *args, tol=None, ref_dtype=torch.float32):
    """Compiled spyre result vs CPU eager in fp32 (within DLFloat16 tolerances), no host fallback."""
    got = run_compiled(fn, *args)
    ref_args = [a.to(ref_dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    ref = fn(*ref_args)
    gots = got if isinstance(got, (tuple, list)) else (got,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    in_dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    for g, r in zip(gots, refs):
        # The loosest tolerance among the inputs' and the output's dtypes (fp16 inputs live as DLFloat16).
        cands = [TOL[d] for d in in_dtypes + [g.dtype] if d in TOL]
        t = tol or (max(cands, key=lambda c: c["atol"]) if cands else dict(atol=0, rtol=0))
        torch.testing.assert_close(g.to(r.dtype) if r.is_floating_point() else g, r, **t, check_dtype=False)
    assert wrapper.host_fallback_stats() == {}, wrapper.host_fallback_stats()
    assert dict(torch_spyre.fallback_stats()) == {}, dict(torch_spyre.fallback_stats())
    # Nor an op run eagerly because the compiler refused it (compiler/fallback.py), on the card or not.
    assert torch_spyre.fallback_stats().compile_fallbacks == {}, torch_spyre.fallback_stats().compile_fallbacks
    return got


MINILM_SENTENCES = ["The cat sits on the mat.", "A dog plays in the garden.", "Spyre is an AI accelerator."]


def minilm_cosines(dtype: torch.dtype, seq_len: int = 32) -> torch.Tensor:
    """Per-sentence cosine between the real all-MiniLM-L6-v2's sentence embeddings compiled on spyre in
    ``dtype`` and on the CPU in fp32 (loaded, tokenized and pooled exactly as ``spyre run`` does)."""
    from torch_spyre.jobs import embed

    tokenizer, cpu_model = embed.load_minilm(torch.float32)
    enc = embed.tokenize(tokenizer, MINILM_SENTENCES, seq_len)
    with torch.no_grad():
        ref = embed.sentence_embedder(cpu_model)(enc)
        dev = embed.load_minilm(dtype)[1].to("spyre")
        fresh()
        got = torch.compile(embed.sentence_embedder(dev))({k: v.to("spyre") for k, v in enc.items()})
    return (got.cpu().float() * ref).sum(-1)


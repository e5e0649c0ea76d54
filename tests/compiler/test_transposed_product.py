"""A matmul read transposed by attention is computed as the transposed product (``transposed_product.py``):
no transposing copy kernel between the two, the choice priced by the card's timing model and recorded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_spyre.compiler import optimizations
from torch_spyre.runtime import stream

from .spyre_compile_helpers import fresh


def _attention_with_kt(x, wq, wkt, wv):
    q = x @ wq
    kt = wkt @ x.t()  # [D, S]: the matmul writes it sticked on S; attention reads K's rows sticked on D
    v = x @ wv
    return F.scaled_dot_product_attention(q[None, None], kt.t()[None, None], v[None, None])[0, 0]


def _inputs(S=256, H=128, D=64):
    torch.manual_seed(3)
    return [(torch.randn(*s) / 4).half() for s in ((S, H), (H, D), (D, H), (H, D))]


def _run(xs, on: bool):
    """(result on the host, the kernels' work records of one steady call) with the optimization on or off."""
    fresh()
    records = []
    with optimizations.disabled(*(() if on else ("transposed_product",))):
        fn = torch.compile(_attention_with_kt, dynamic=False)
        fn(*xs)
        stream.add_listener(records.append)
        try:
            out = fn(*xs).cpu()
        finally:
            stream.remove_listener(records.append)
    return out, [r for r in records if r.kind == "kernel"]


@pytest.mark.parametrize("check", ["0", "1"])
def test_attentions_transposed_key_is_written_by_its_matmul_in_the_layout_attention_reads(tmp_path, monkeypatch, check):
    """On: one kernel fewer (K joins the projections' group), less simulated time, the same values bit for bit
    (each element is the same products summed in the same order), the fast and the checked executor."""
    monkeypatch.setenv("TORCH_SPYRE_CHECK", check)
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    xs = [x.to("spyre") for x in _inputs()]
    on, on_kernels = _run(xs, on=True)
    notes = [p.read_text() for p in tmp_path.glob("*.decisions.txt") if "b^T @ a^T" in p.read_text()]
    off, off_kernels = _run(xs, on=False)
    ref = _attention_with_kt(*(x.cpu().float() for x in xs))
    torch.testing.assert_close(on.float(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(off.float(), ref, atol=2e-2, rtol=2e-2)
    # off: the projections' group, the K matmul, the transposing copy, attention; on: K joins the group
    assert [r.name for r in off_kernels] == ["spyre_mm_x2_0", "spyre_mm_1", "spyre_fused_flash_attention_t_unsqueeze_2",
                                             "spyre_sdpa_3"]
    assert [r.name for r in on_kernels] == ["spyre_mm_x3_0", "spyre_sdpa_1"]
    on_us, off_us = (round(sum(r.length for r in ks) * 1e6, 2) for ks in (on_kernels, off_kernels))
    assert (off_us, on_us) == (91.07, 50.57)
    assert torch.equal(on, off)  # at this shape both splits sum each element's products in the same order
    assert len(notes) == 1 and notes[0].startswith("kernel spyre_mm_x3_0 (matmul_group)")
    assert "member 1: computed as b^T @ a^T, written once in the layout its reader wants (transposed_product): the " \
           "transposing copy kernel 20.88 us, the product's in-kernel transposes +0.19 us (card timing model)" in notes[0]


def test_the_copy_stays_where_the_timing_model_prices_the_transposed_product_slower(tmp_path, monkeypatch):
    """Priced the other way (the product's transposes dearer than the copy): the graph is kept, the matmul's
    decisions say why."""
    from torch_spyre.compiler import transposed_product

    monkeypatch.setattr(transposed_product, "_prices", lambda *args: (1e-6, 2e-6))
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    xs = [x.to("spyre") for x in _inputs()]
    out, kernels = _run(xs, on=True)
    assert [r.name for r in kernels] == ["spyre_mm_x2_0", "spyre_mm_1", "spyre_fused_flash_attention_t_unsqueeze_2",
                                         "spyre_sdpa_3"]
    notes = [p.read_text() for p in tmp_path.glob("*.decisions.txt") if "transposed_product" in p.read_text()]
    assert any("read transposed, kept (then a transposing copy; transposed_product): the transposing copy kernel "
               "1.00 us, the product's in-kernel transposes +2.00 us (card timing model)" in n for n in notes)


def test_a_product_a_matmul_reads_transposed_is_left_alone():
    """A matmul reads an A sticked on M in kernel (no copy kernel to save): the graph keeps its product."""
    from torch._inductor.utils import run_and_get_code

    def chain(x, w, v):
        return (x @ w).t() @ v

    xs = [(torch.randn(*s) / 4).half().to("spyre") for s in ((128, 64), (64, 128), (128, 64))]
    fresh()
    out, (code,) = run_and_get_code(torch.compile(chain, dynamic=False), *xs)
    # the second matmul reads the first's output through a transposed view (folded, it would read it as is)
    assert "spyre_mm_1.run(a=reinterpret_tensor(buf0, (128, 128), (1, 128), 0), b=arg2_1" in code
    torch.testing.assert_close(out.cpu().float(), chain(*(x.cpu().float() for x in xs)), atol=2e-2, rtol=2e-2)


def test_dynamic_shapes_are_not_priced_and_do_not_recompile_per_length():
    """``dynamic=True``: pricing would fix the symbolic sizes to the first call's (a recompile per length), so
    a symbolic site is kept, and one graph serves every length."""
    xs = [x.to("spyre") for x in _inputs(S=256)]
    fresh()
    torch._dynamo.utils.counters.clear()
    fn = torch.compile(_attention_with_kt, dynamic=True)
    for S in (256, 192, 320):
        xs = [x.to("spyre") for x in _inputs(S=S)]
        out = fn(*xs).cpu().float()
        ref = _attention_with_kt(*(x.cpu().float() for x in xs))
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_product_of_one_transpose_with_itself_is_folded_once():
    """``xt @ xt`` with ``xt = x.t()``: the shared transpose is erased once (FX warned of erasing an erased
    node), and the result is right."""
    import warnings

    def self_product(x, q, v):
        xt = x.t()
        return F.scaled_dot_product_attention(q[None, None], (xt @ xt).t()[None, None], v[None, None])[0, 0]

    torch.manual_seed(5)
    xs = [(torch.randn(64, 64) / 4).half() for _ in range(3)]
    fresh()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(self_product, dynamic=False)(*(x.to("spyre") for x in xs)).cpu().float()
    assert not [w for w in caught if "erased" in str(w.message)]
    torch.testing.assert_close(out, self_product(*(x.float() for x in xs)), atol=2e-2, rtol=2e-2)


def test_sites_left_unpriced_say_why():
    from torch_spyre.compiler.transposed_product import _not_priced

    def t(*shape, dtype=torch.float16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    assert _not_priced(t(8, 64), t(64, 16), t(8, 16)) is None
    assert "float32, not priced" in _not_priced(t(8, 64, dtype=torch.float32), t(64, 16, dtype=torch.float32),
                                                 t(8, 16, dtype=torch.float32))
    assert "a dim of 1" in _not_priced(t(1, 64), t(64, 16), t(1, 16))
    assert _not_priced(None, t(64, 16), t(8, 16)) == "no shape recorded"

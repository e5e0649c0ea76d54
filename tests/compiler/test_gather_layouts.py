"""Gathers whose source, index or output rows do not sit at fixed sticks in their storage (issue 11, model
coverage): Swin's relative position bias table with one head ([169, 1], stored as [169]), a router's
``gather(x, -1, idx [B, S, 1])`` (zaya), rows of a graph input that is a view merging its allocation's dims
(JetMoE), and an embedding index that is a non-contiguous view (XLNet). Each failed code generation
("rows start at different lanes of their sticks" / "not a fixed set of sticks" / "does not run along the
stick dim"); compiled, they now match the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_spyre
from torch_spyre.compiler import wrapper

from .spyre_compile_helpers import TOL, check, fresh, specs_of


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ints(high, *shape, seed=1):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _swin_index(window: int) -> torch.Tensor:
    """Swin's relative_position_index: [window^2, window^2] rows of the [(2w-1)^2, heads] table."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += window - 1
    rel[:, :, 1] += window - 1
    rel[:, :, 0] *= 2 * window - 1
    return rel.sum(-1)


def _swin_bias(table, index, scores):
    n = index.shape[0]
    bias = table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
    return scores + bias.unsqueeze(0)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("window", [2, 7])
def test_swin_relative_position_bias(heads, window):
    index = _swin_index(window)
    n = window * window
    check(_swin_bias, rnd((2 * window - 1) ** 2, heads), index, rnd(2, heads, n, n))


def test_tables_of_one_column():
    """A [V, 1] table is stored as [V] (size-1 dims dropped): its rows are elements packed 64 to a stick,
    gathered by the element gather along V."""
    check(lambda t, i: F.embedding(i, t) * 2, rnd(9, 1), ints(9, 4, 4))
    check(lambda t, i: t.index_select(0, i) * 2, rnd(9, 1), ints(9, 16))
    check(lambda t, i: t[i] + 1, rnd(70, 1, 1), ints(70, 5, 3))
    check(lambda t, i: torch.gather(t, 0, i.expand(5, 1)) * 2, rnd(9, 1), ints(9, 5, 1))


@pytest.mark.parametrize("shape,idx", [((2, 8, 5), (2, 8, 1)), ((3, 8, 5), (2, 8, 1)), ((2, 3, 4, 70), (2, 3, 4, 1))])
def test_gather_along_the_stick_dim_by_one_index_per_row(shape, idx):
    """zaya's router: ``gather(x, -1, idx)`` with idx [B, S, 1], stored as [B, S]: its rows (one element
    each) neither own sticks nor form one run."""
    check(lambda x, i: torch.gather(x, -1, i) * 2, rnd(*shape), ints(shape[-1], *idx))
    check(lambda x: torch.gather(x, -1, x.argmax(-1, keepdim=True)) * 2, rnd(*shape))


def test_rows_of_a_graph_input_view_that_merges_its_allocation_dims():
    """JetMoE: the gathered rows are of ``hidden.view(-1, D)``, a graph input whose [B, S, D] allocation
    interleaves the B rows stick by stick; only the bound tensor shows it, so the kernel copies it first."""
    fresh()
    base, idx = rnd(2, 8, 64), ints(16, 32)
    f = torch.compile(lambda x, i: x[i] * 2)
    got = f(base.to("spyre").view(16, 64), idx.to("spyre")).cpu()
    torch.testing.assert_close(got, base.view(16, 64)[idx] * 2, **TOL[torch.float32])
    assert wrapper.host_fallback_stats() == {} and dict(torch_spyre.fallback_stats()) == {}


def test_embedding_by_a_non_contiguous_index():
    """XLNet looks up ``input_ids.t()``-style views: the index's last dim does not run along its sticks."""
    check(lambda w, i: F.embedding(i.t(), w) * 2, rnd(30, 64), ints(30, 8, 5))
    check(lambda w, i: F.embedding(i[:, ::2], w) * 2, rnd(30, 64), ints(30, 5, 8))
    # XLNet's ``input_ids.transpose(0, 1).contiguous()``: Inductor would give the copy the input's stride
    # order (its layout is still flexible when the embedding is lowered) unless the lowering freezes it.
    check(lambda w, i: F.embedding(i.transpose(0, 1).contiguous(), w) * 2, rnd(30, 64), ints(30, 2, 8))

    fresh()
    w, ids = rnd(30, 64), ints(30, 8, 5)
    f = torch.compile(lambda w, i: F.embedding(i, w) * 2)
    got = f(w.to("spyre"), ids.to("spyre").t()).cpu()  # a graph input that is a transposed view
    torch.testing.assert_close(got, F.embedding(ids.t(), w) * 2, **TOL[torch.float32])


def test_the_gather_kernel_records_why_it_reads_another_form():
    """The rewrite is named in the kernel's params, which its decisions' notes carry (gather.generate)."""
    gathers = [s for s in specs_of(lambda t, i: F.embedding(i, t) * 2, rnd(9, 1), ints(9, 4, 4))
               if s.generator == "gather"]
    assert len(gathers) == 1 and "size-1 dims" in gathers[0].params["note"], [s.params for s in gathers]
    gathers = [s for s in specs_of(lambda x, i: torch.gather(x, -1, i) * 2, rnd(2, 8, 5), ints(5, 2, 8, 1))
               if s.generator == "gather"]
    assert len(gathers) == 1 and "repeated twice" in gathers[0].params["note"], [s.params for s in gathers]


def test_attention_mask_made_of_a_one_head_bias():
    """Swin with one head: the bias gathered from its [9, 1] table is, reshaped, the attention's
    [1, 1, 4, 4] mask: a view of the gather's [16] output whose rows share sticks; it is copied first."""

    def f(table, index, q, k, v):
        bias = table[index.view(-1)].view(4, 4, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    check(f, rnd(9, 1), _swin_index(2), rnd(1, 1, 4, 64, seed=1), rnd(1, 1, 4, 64, seed=2), rnd(1, 1, 4, 64, seed=3))


@pytest.mark.parametrize("shapes", [((4, 9, 1), (1, 6, 1), (4, 6, 1), 1), ((9, 3, 1, 1), (6, 1, 1, 1), (6, 3, 1, 1), 0)],
                         ids=["3d", "4d"])
def test_gather_of_unit_rows_by_an_expanded_index(shapes):
    # An expanded index (stride 0 along a dim of size > 1) cannot be viewed without its size-1 dims: it is
    # made contiguous first (it failed with a bare AssertionError in Inductor's view).
    src, idx, expand, dim = shapes
    x, i = rnd(*src), ints(src[dim], *idx)
    check(lambda x, i: torch.gather(x, dim, i.expand(*expand)) * 2, x, i)

"""Sibling embedding lookups as one gather kernel (compiler/embedding_group.py, the gather generator's
"embedding_group" kind): the rewrite and its switch, and compiled lookups matching the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_spyre.compiler import embedding_group, optimizations

from .spyre_compile_helpers import TOL, profiled_kernels


def _bert_embeddings(ids, types, w_word, w_type, w_pos, pos_buffer, nw, nb):
    """BertEmbeddings' order: word and token-type lookups and their sum, then the position ids (a slice of a
    buffer) and their lookup, then the LayerNorm."""
    x = F.embedding(ids, w_word) + F.embedding(types, w_type)
    x = x + F.embedding(pos_buffer[:, : ids.shape[1]], w_pos)
    return F.layer_norm(x, x.shape[-1:], nw, nb, 1e-12)


def _args(B=1, S=16, D=128, V=50):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, V, (B, S), generator=g), torch.randint(0, 2, (B, S), generator=g),
            torch.randn(V, D, generator=g).half(), torch.randn(2, D, generator=g).half(),
            torch.randn(64, D, generator=g).half(), torch.arange(64).unsqueeze(0),
            torch.rand(D, generator=g).half() + 0.5, torch.randn(D, generator=g).half())


def _graph(fn, args):
    from .test_bert_layer_fusion import _graph as graph

    return graph(fn, *args)


def _lookups(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.embedding.default)


def test_three_lookups_become_one_group_the_position_slice_moved_up():
    gm = _graph(_bert_embeddings, _args())
    assert _lookups(gm) == 3
    [group] = embedding_group.group_embeddings(gm)
    assert len(group) == 3 and _lookups(gm) == 0
    [fused] = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is embedding_group.op()]
    assert tuple(fused.meta["val"].shape) == (3, 1, 16, 128)
    gm.graph.lint()  # still topologically ordered


def test_index_shapes_must_agree_and_the_switch_leaves_the_graph():
    gm = _graph(_bert_embeddings, _args(B=2))  # positions [1, S], words and types [2, S]: two of three
    [group] = embedding_group.group_embeddings(gm)
    assert len(group) == 2 and _lookups(gm) == 1
    gm = _graph(_bert_embeddings, _args())
    before = str(gm.graph)
    with optimizations.disabled("embedding_group"):
        assert embedding_group.group_embeddings(gm) == []
    assert str(gm.graph) == before


def test_priced_out_the_lookups_stay_apart_and_say_why(monkeypatch):
    """MiniLM's batch 32 shape: two [32, 128] lookups of 384-wide rows take longer in one launch (each
    member's chunks follow the stacked output's bursts) than apart; the rewrite leaves them."""
    gm = _graph(lambda a, b, wa, wb: F.embedding(a, wa) + F.embedding(b, wb),
                [torch.zeros(32, 128, dtype=torch.int64), torch.zeros(32, 128, dtype=torch.int64),
                 torch.zeros(1000, 384).half(), torch.zeros(2, 384).half()])
    assert embedding_group.group_embeddings(gm) == [] and _lookups(gm) == 2
    notes = [n.meta.get("spyre_note", "") for n in gm.graph.nodes if n.target is torch.ops.aten.embedding.default]
    assert all(n.startswith("embedding_group not used: 2 lookups in one launch take") for n in notes)


def test_a_lone_lookup_is_left_alone():
    gm = _graph(lambda ids, w: F.embedding(ids, w) * 2, _args()[::2][:2])
    assert embedding_group.group_embeddings(gm) == [] and _lookups(gm) == 1


@pytest.mark.slow
@pytest.mark.parametrize("B", [1, 2])
def test_compiled_embeddings_match_cpu(B):
    args = _args(B=B)
    want = _bert_embeddings(*args[:2], *(a.float() for a in args[2:5]), args[5], *(a.float() for a in args[6:]))
    kernels, got = profiled_kernels(_bert_embeddings, list(args), no_grad=True)
    names = [k.name.rsplit("_", 1)[0] for k in kernels]
    assert names[0] == ("spyre_embedding_x3" if B == 1 else "spyre_embedding_x2")
    assert len(names) == (2 if B == 1 else 3)
    torch.testing.assert_close(got.float(), want, **TOL[torch.float16])
    with optimizations.disabled("embedding_group"):
        kernels, off = profiled_kernels(_bert_embeddings, list(args), no_grad=True)
    assert len(kernels) == 4 and torch.equal(off, got)


@pytest.mark.parametrize("one_table", [False, True])
def test_a_bad_index_in_a_group_names_its_own_index_tensor(one_table):
    """The group's lookups run in one program: an index out of range names the member whose index it was
    (each member's gather reads its own source operand, by which the card finds the member's tensors; two
    lookups of one table are two operands bound to the same tensor)."""
    import re

    import torch_spyre.profiler
    from torch_spyre.card.execute import ExecutionError

    from .spyre_compile_helpers import fresh

    class TwoLookups(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e1 = torch.nn.Embedding(10, 64)
            self.e2 = self.e1 if one_table else torch.nn.Embedding(10, 64)

        def forward(self, i, j):
            return self.e1(i) + self.e2(j)

    fresh()
    compiled = torch.compile(TwoLookups().half().to("spyre"))
    good, bad = torch.tensor([[1, 2, 3]]).to("spyre"), torch.tensor([[4, 50, 6]]).to("spyre")
    named = []
    with torch.no_grad():
        with torch_spyre.profiler.profile() as prof:
            compiled(good, good)
        assert any(r.name.startswith("spyre_embedding_x2") for r in prof.events() if r.kind == "kernel")
        for args in ((bad, good), (good, bad)):
            with pytest.raises(ExecutionError, match="gather index 50 at position 1") as err:
                compiled(*args)
            found = re.search(r"the index tensor is %(\w+)", str(err.value))
            assert found, str(err.value)
            named.append(found.group(1))
    assert named[0] != named[1]


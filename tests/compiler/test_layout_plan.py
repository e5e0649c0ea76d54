"""layout_plan.py: buffers in the layout their consumers want, weights relayouted once to their matmul's."""

from __future__ import annotations

import glob
import os

import pytest
import torch

import torch_spyre
import torch_spyre.profiler
from torch_spyre.compiler import layout_plan as lp
from torch_spyre.compiler.layout_plan import BufferInfo, Operand, plan_layouts

from .spyre_compile_helpers import TOL, fresh

F16 = TOL[torch.float16]


def _stick_dim(t: torch.Tensor) -> int:
    return torch_spyre.get_layout(t).stick_layout.stick_dim


def _linear_calls(lin: torch.nn.Module, x: torch.Tensor, calls: int) -> list[list]:
    """``calls`` calls of the compiled module; the profiler's records of each call."""
    fresh()
    lp.reset_layout_stats()
    f = torch.compile(lin, dynamic=False)
    records = []
    for _ in range(calls):
        with torch_spyre.profiler.profile() as prof:
            out = f(x)
        records.append(prof.events())
    return out, records


# --- the plan on plain graph descriptions --------------------------------------------------------
def _linear_graph(weight_producer: str) -> tuple[list[BufferInfo], list[Operand]]:
    """x [128, 384] @ w[1536, 384].t() -> out [128, 1536], w produced by ``weight_producer``."""
    k = "the mm writing out"
    buffers = [BufferInfo("x", (128, 384), (384, 1), "input"), BufferInfo("w", (1536, 384), (384, 1), weight_producer),
               BufferInfo("out", (128, 1536), (1536, 1), "matmul")]
    ops = [Operand(k, "matmul", "a", "x", (128, 384), (384, 1)), Operand(k, "matmul", "b", "w", (384, 1536), (1, 384)),
           Operand(k, "matmul", "out", "out", (128, 1536), (1536, 1))]
    return buffers, ops


def test_plan_weight_of_an_inference_graph_is_sticked_on_n():
    plan = plan_layouts(*_linear_graph("weight"), inference=True)
    (c,) = plan.weights()
    assert (c.buffer, c.stick_dim, c.host_shape) == ("w", 0, (1536, 384))
    assert "the mm writing out's B (N)" in c.reason
    assert plan.stick_dim("w") is None  # not allocated by the wrapper: relayouted at run time


def test_plan_keeps_weights_of_a_training_graph():
    plan = plan_layouts(*_linear_graph("weight"), inference=False)
    assert plan.weights() == [] and any("training graph" in n for n in plan.notes)


def test_plan_pointwise_producer_writes_the_consumers_layout():
    plan = plan_layouts(*_linear_graph("pointwise"), inference=False)
    assert plan.stick_dim("w") == 0 and "pointwise producer" in plan.choices["w"].reason


def test_plan_leaves_graph_inputs_and_fixed_producers_alone():
    assert plan_layouts(*_linear_graph("input"), inference=True).choices == {}
    plan = plan_layouts(*_linear_graph("matmul"), inference=True)
    assert plan.choices == {} and any("kept as its matmul producer writes it: in-kernel handling costs" in n
                                      for n in plan.notes)


def test_plan_disagreeing_consumers_keep_the_layout():
    buffers, ops = _linear_graph("weight")
    ops.append(Operand("the embedding writing e", "gather", "source", "w", (1536, 384), (384, 1)))
    plan = plan_layouts(buffers, ops, inference=True)
    assert plan.choices == {} and any("consumers disagree" in n for n in plan.notes)


def test_plan_round_trips_through_json():
    plan = plan_layouts(*_linear_graph("weight"), inference=True)
    again = lp.LayoutPlan.from_json(plan.to_json())
    assert again.choices == plan.choices and again.notes == plan.notes
    assert "sticked on dim 0" in again.decisions("p").format()


# --- compiled graphs -------------------------------------------------------------------------------
@torch.no_grad()
@pytest.mark.parametrize("onchip", [True, False])
def test_linear_weight_is_relayouted_once_and_matches_cpu(onchip):
    """Once: on chip (one kernel, the weight through the scratchpads and the ring) or, with onchip_relayout
    off, through device memory (the relayout kernel and the copy back)."""
    from torch_spyre.compiler import optimizations

    torch.manual_seed(0)
    lin = torch.nn.Linear(384, 1536).half()
    x = torch.randn(128, 384).half()
    ref = lin.float()(x.float())
    lin = lin.half().to("spyre")
    assert _stick_dim(lin.weight) == 1  # nn.Linear's [N, K] weight arrives sticked on K
    with optimizations.disabled(*(() if onchip else ("onchip_relayout",))):
        out, records = _linear_calls(lin, x.to("spyre"), 3)
    assert _stick_dim(lin.weight) == 0
    assert lp.layout_stats() == {"weight_relayouts": 1}
    relayouts = [[r for r in recs if "relayout" in r.name] for recs in records]
    assert [r.kind for r in relayouts[0]] == (["kernel"] if onchip else ["kernel", "copy_d2d"])
    assert relayouts[0][0].name.endswith("_onchip") == onchip and relayouts[1:] == [[], []]
    assert [r.name for r in records[2]] == [r.name for r in records[1]]
    torch.testing.assert_close(out.cpu().float(), ref, **F16)


@torch.no_grad()
def test_mutated_weight_gives_the_right_results():
    torch.manual_seed(1)
    lin = torch.nn.Linear(256, 512).half().to("spyre")
    x = torch.randn(64, 256).half().to("spyre")
    f = torch.compile(lin, dynamic=False)
    fresh()
    lp.reset_layout_stats()
    f(x)
    lin.weight.data.mul_(2)  # an eager op on the relayouted weight: reads and writes through its layout
    out = f(x)
    ref = torch.nn.functional.linear(x.cpu().float(), lin.weight.cpu().float(), lin.bias.cpu().float())
    assert _stick_dim(lin.weight) == 0 and lp.layout_stats() == {"weight_relayouts": 1}
    torch.testing.assert_close(out.cpu().float(), ref, **F16)


@torch.no_grad()
def test_plan_does_not_depend_on_input_layouts():
    """A weight already sticked on N is left alone; an activation sticked on its rows still works."""
    torch.manual_seed(2)
    w, b, x = torch.randn(512, 256).half(), torch.randn(512).half(), torch.randn(64, 256).half()
    lin = torch.nn.Linear(256, 512).half()
    lin.weight.data, lin.bias.data = w, b
    ref = torch.nn.functional.linear(x.float(), w.float(), b.float())
    lin = lin.to("spyre")
    lin.weight.data = torch_spyre.to_spyre(w, stick_dim=0)
    xs = torch_spyre.to_spyre(x, stick_dim=0)
    out, _ = _linear_calls(lin, xs, 2)
    assert lp.layout_stats() == {} and _stick_dim(lin.weight) == 0 and _stick_dim(xs) == 0
    torch.testing.assert_close(out.cpu().float(), ref, **F16)


def test_producer_writes_the_layout_its_matmul_consumer_wants():
    """``(w * 2)`` read as B^T: the pointwise kernel writes it sticked on N, no relayout, no transpose."""
    from torch._inductor.utils import run_and_get_code

    def fn(x, w):
        return x @ (w * 2).t()

    torch.manual_seed(3)
    xs, ws = torch.randn(128, 256).half().to("spyre"), torch.randn(384, 256).half().to("spyre")
    fresh()
    out, (code,) = run_and_get_code(torch.compile(fn, dynamic=False), xs, ws)
    assert "stick_dim=0)  # sticked on dim 0 for the mm writing" in code
    # against the values the card holds (DLFloat16): K=256 sums of randn products would otherwise
    # carry the inputs' rounding into results near 0
    torch.testing.assert_close(out.cpu().float(), fn(xs.cpu().float(), ws.cpu().float()), **F16)


def _transposed_matmul_chain(x, w, v):
    y = x @ w  # [M, N], written sticked on N (its last dim)
    return y.t() @ v  # A = y^T: K = M, so the consumer wants y sticked on its rows


def test_fixed_producer_keeps_in_kernel_handling_when_the_timing_model_says_so():
    """On the card the A transpose hides behind the PE arrays: far cheaper than a relayout kernel."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(7)
    xs, ws, vs = ((torch.randn(*s) / 4).half().to("spyre") for s in ((256, 128), (128, 256), (256, 128)))
    fresh()
    out, (code,) = run_and_get_code(torch.compile(_transposed_matmul_chain, dynamic=False), xs, ws, vs)
    assert "relayout_buffer(buf0" not in code
    assert "kept as its matmul producer writes it: in-kernel handling costs" in code
    ref = _transposed_matmul_chain(xs.cpu().float(), ws.cpu().float(), vs.cpu().float())
    torch.testing.assert_close(out.cpu().float(), ref, **F16)


def test_relayout_is_inserted_where_it_is_priced_cheaper(monkeypatch):
    """The insertion itself (generated code, run time, values), with the relayout priced at 0 s."""
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setattr(lp.Costs, "relayout_s", lambda self, *args: 0.0)
    monkeypatch.setattr(lp.Costs, "matmul_saving_s", lambda self, *args: 1e-6)
    torch.manual_seed(8)
    xs, ws, vs = ((torch.randn(*s) / 4).half().to("spyre") for s in ((256, 128), (128, 192), (256, 128)))
    fresh()
    lp.reset_layout_stats()
    out, (code,) = run_and_get_code(torch.compile(_transposed_matmul_chain, dynamic=False), xs, ws, vs)
    assert "buf0 = relayout_buffer(buf0, 0); buf1 = empty_spyre(" in code
    assert "relayout inserted (from dim 1, as its matmul producer writes it) to be sticked on dim 0" in code
    assert lp.layout_stats() == {"relayout_kernels": 1}
    ref = _transposed_matmul_chain(xs.cpu().float(), ws.cpu().float(), vs.cpu().float())
    torch.testing.assert_close(out.cpu().float(), ref, **F16)


class _TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(320, 128)
        self.head = torch.nn.Linear(128, 320, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


@torch.no_grad()
def test_tied_weights_keep_their_layout():
    torch.manual_seed(4)
    model = _TiedLM().half()
    ids = torch.randint(0, 320, (2, 64))
    ref = _TiedLM().float()
    ref.load_state_dict(model.float().state_dict())
    model = model.half().to("spyre")
    assert model.head.weight is model.emb.weight  # Module.to("spyre") keeps ties (tests/device/test_tied_parameters.py)
    fresh()
    lp.reset_layout_stats()
    out = torch.compile(model, dynamic=False)(ids.to("spyre"))
    assert _stick_dim(model.emb.weight) == 1 and lp.layout_stats().get("weight_relayouts", 0) == 0
    torch.testing.assert_close(out.cpu().float(), ref(ids), **F16)


def test_training_graph_keeps_weights_and_matches_cpu():
    torch.manual_seed(5)
    lin = torch.nn.Linear(128, 256).half().to("spyre")
    x = torch.randn(64, 128).half().to("spyre")
    fresh()
    lp.reset_layout_stats()
    out = torch.compile(lin, dynamic=False)(x)
    assert lin.weight.requires_grad and lp.layout_stats() == {} and _stick_dim(lin.weight) == 1
    w, b = lin.weight.detach().cpu().float(), lin.bias.detach().cpu().float()
    ref = torch.nn.functional.linear(x.cpu().float(), w, b)
    torch.testing.assert_close(out.detach().cpu().float(), ref, **F16)


@torch.no_grad()
@pytest.mark.parametrize("onchip", [True, False])
def test_debug_output_shows_the_layout_decisions(tmp_path, monkeypatch, onchip):
    monkeypatch.setenv("TORCH_SPYRE_DEBUG", "1")
    monkeypatch.setenv("TORCH_SPYRE_DEBUG_DIR", str(tmp_path))
    monkeypatch.setattr(lp, "_dumped", set())  # a plan is dumped once per process; this test wants it again
    if not onchip:
        monkeypatch.setenv("TORCH_SPYRE_DISABLE", "onchip_relayout")
    torch.manual_seed(6)
    lin = torch.nn.Linear(192, 320).half().to("spyre")
    _linear_calls(lin, torch.randn(64, 192).half().to("spyre"), 1)
    (plan_file,) = glob.glob(os.path.join(tmp_path, "spyre_layout_plan_*.decisions.txt"))
    plan = open(plan_file).read()
    assert "(layout)" in plan and "sticked on dim 0 for the addmm writing buf0's B (N)" in plan
    # The weight's relayout program as it ran: on chip, or through device memory with the reason.
    name = "spyre_relayout_320x192_d1_to_d0" + ("_onchip" if onchip else "")
    relayout = open(os.path.join(tmp_path, f"{name}.decisions.txt")).read()
    assert "relayouted in place" in relayout
    assert ("on chip: no copy back" in relayout and "ring sends between scratchpads" in relayout) if onchip else \
        "not on chip: onchip_relayout is switched off" in relayout
    (mm_file,) = glob.glob(os.path.join(tmp_path, "spyre_addmm_*.decisions.txt"))
    mm = open(mm_file).read()
    assert "stick_dim=0" in mm and "transposed in scratchpad" not in mm


def test_ensure_weight_layout_keeps_a_view_of_a_larger_storage():
    lp.reset_layout_stats()
    big = torch.randn(512, 256).half().to("spyre")
    part = big[:256]
    lp.ensure_weight_layout(part, 0, (256, 256), "test")
    assert _stick_dim(big) == 1 and lp.layout_stats() == {"weights_kept": 1}


def test_ensure_weight_layout_keeps_a_weight_whose_new_layout_does_not_fit():
    """[100, 128] sticked on dim 0 pads 100 rows to 128: more bytes than its allocation holds."""
    lp.reset_layout_stats()
    w = torch.randn(100, 128).half().to("spyre")
    lp.ensure_weight_layout(w, 0, (100, 128), "test")
    assert _stick_dim(w) == 1 and lp.layout_stats() == {"weights_kept": 1}


def test_ensure_weight_layout_refuses_a_host_tensor():
    from torch_spyre.compiler.relayout import RelayoutError

    with pytest.raises(RelayoutError, match="expects a spyre tensor, got one on cpu"):
        lp.ensure_weight_layout(torch.zeros(8, 8), 0, (8, 8), "test")


def test_eager_ops_leave_their_arguments_layouts_alone(monkeypatch):
    """Single-op programs (TORCH_SPYRE_EAGER=compile) have no static inputs: a user's tensor is not a weight."""
    monkeypatch.setenv("TORCH_SPYRE_EAGER", "compile")
    lp.reset_layout_stats()
    torch_spyre.reset_fallback_stats()
    x, w, b = torch.randn(64, 128).half(), torch.randn(256, 128).half(), torch.randn(256).half()
    ws = w.to("spyre")
    out = torch.addmm(b.to("spyre"), x.to("spyre"), ws.t())
    assert torch_spyre.fallback_stats().compiled  # it ran as a program
    assert lp.layout_stats() == {} and _stick_dim(ws) == 1
    torch.testing.assert_close(out.cpu().float(), torch.addmm(b.float(), x.float(), w.float().t()), **F16)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])


def test_a_multi_output_kernel_leaves_the_rest_of_the_graph_planned():
    """topk (a kernel with two outputs: no geometry of its own) used to leave its whole graph without a layout
    plan: a bmm's B written by a pointwise kernel from a permuted view was then sticked on its batch dim and
    the matmul refused it (GraniteMoeHybrid's MoE router + Mamba mixer). Now only that node is left out."""
    from torch._inductor.utils import run_and_get_code

    def fn(a, c, x):
        return torch.bmm(a, c.permute(2, 1, 0) * 2), torch.topk(x, 2).values

    torch.manual_seed(4)
    a, c, x = torch.randn(16, 32, 4).half(), torch.randn(16, 4, 16).half(), torch.randn(4, 8)
    fresh()
    (out, top), codes = run_and_get_code(torch.compile(fn, dynamic=False), *(t.to("spyre") for t in (a, c, x)))
    code = "\n".join(codes)
    assert "topk" in code and "no layout plan" not in code and "for the bmm writing" in code
    want, want_top = fn(a.float(), c.float(), x)
    torch.testing.assert_close(out.cpu().float(), want, **F16)
    torch.testing.assert_close(top.cpu(), want_top, **F16)

"""Eager ops on spyre tensors, compared with the CPU."""

from __future__ import annotations

import pytest
import torch

import torch_spyre


def s(x: torch.Tensor) -> torch.Tensor:
    return x.to("spyre")


def test_pointwise_reduction_and_matmul_match_cpu():
    a, b = torch.randn(7, 33), torch.randn(33, 5)
    assert torch.allclose((s(a) @ s(b)).cpu(), a @ b, atol=1e-5)
    assert torch.allclose(s(a).softmax(-1).cpu(), a.softmax(-1), atol=1e-6)
    assert torch.equal(s(a).argmax(1).cpu(), a.argmax(1))
    assert torch.allclose(torch.nn.functional.gelu(s(a)).cpu(), torch.nn.functional.gelu(a))
    assert torch.equal(torch.cat([s(a), s(a)], 0).cpu(), torch.cat([a, a], 0))
    assert torch.equal(s(a).sort(dim=1).values.cpu(), a.sort(dim=1).values)


def test_views_share_storage_and_in_place_writes_go_through_them():
    x = torch.arange(20.0).reshape(4, 5)
    d = s(x)
    d.t()[1].mul_(100)  # column 1 through a transposed view
    d.diagonal().zero_()
    d.select(0, 3).add_(1)
    x.t()[1].mul_(100)
    x.diagonal().zero_()
    x.select(0, 3).add_(1)
    assert torch.equal(d.cpu(), x)
    parts = d.split(2)
    parts[1][0, 0] = -5.0
    assert d[2, 0].item() == -5.0
    assert d.view(-1)[10].item() == -5.0
    assert d.unsqueeze(0).expand(3, 4, 5)[2, 2, 0].item() == -5.0


def test_in_place_returns_self_and_out_variants():
    x = s(torch.ones(3))
    y = x.add_(2)
    assert y is x and x.cpu().tolist() == [3.0, 3.0, 3.0]
    out = torch.empty(3, device="spyre")
    r = torch.mul(x, 2, out=out)
    assert r is out and out.cpu().tolist() == [6.0, 6.0, 6.0]
    small = torch.empty(0, device="spyre")
    torch.add(x, x, out=small)  # out= resizes
    assert small.shape == (3,) and small.cpu().tolist() == [6.0, 6.0, 6.0]
    values, indices = torch.empty(0, device="spyre"), torch.empty(0, dtype=torch.long, device="spyre")
    torch.max(s(torch.tensor([[1.0, 5.0], [7.0, 2.0]])), 1, out=(values, indices))
    assert values.cpu().tolist() == [5.0, 7.0] and indices.cpu().tolist() == [1, 0]


F = torch.nn.functional
_a, _b = torch.randn(6, 5), torch.rand(6, 5)
_t = torch.randint(0, 5, (6,))
COMMON_OPS = {
    "mse_loss": lambda a, b, t: F.mse_loss(a, b),
    "mse_loss_sum": lambda a, b, t: F.mse_loss(a, b, reduction="sum"),
    "smooth_l1_loss": lambda a, b, t: F.smooth_l1_loss(a, b),
    "huber_loss": lambda a, b, t: F.huber_loss(a, b),
    "l1_loss": lambda a, b, t: F.l1_loss(a, b),
    "soft_margin_loss": lambda a, b, t: F.soft_margin_loss(a, b.sign()),
    "binary_cross_entropy": lambda a, b, t: F.binary_cross_entropy(a.sigmoid(), b),
    "bce_with_logits": lambda a, b, t: F.binary_cross_entropy_with_logits(a, b),
    "kl_div": lambda a, b, t: F.kl_div(a.log_softmax(-1), b, reduction="batchmean"),
    "cross_entropy": lambda a, b, t: F.cross_entropy(a, t),
    "nll_loss": lambda a, b, t: F.nll_loss(a.log_softmax(-1), t),
    "sum_mean_var_std": lambda a, b, t: a.sum() + a.mean() + a.var() + a.std(),
    "norm": lambda a, b, t: a.norm() + torch.linalg.vector_norm(a, dim=1).sum(),
    "max_min_dim": lambda a, b, t: a.max(1).values + a.min(0).values.sum(),
    "argmax_topk_sort": lambda a, b, t: a.argmax(1) + a.topk(2).indices.sum() + a.sort(1).indices[:, 0],
    "cumsum_logsumexp": lambda a, b, t: a.cumsum(1).sum() + a.logsumexp(1).sum(),
    "layer_norm_softmax": lambda a, b, t: F.layer_norm(a, (5,)).softmax(-1),
    "matmul_addmm": lambda a, b, t: a @ b.T + torch.addmm(a, a, b.T[:5, :5]).sum(),
}


@pytest.mark.parametrize("name", list(COMMON_OPS))
def test_common_ops_give_no_warning_the_cpu_does_not(name):
    """The fallback must not add warnings: a same-shaped host out= made CPU kernels warn "was resized"."""
    import warnings

    fn = COMMON_OPS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ref = fn(_a, _b, _t)
        out = fn(s(_a), s(_b), s(_t))
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_backward_of_a_loss_gives_no_warning():
    import warnings

    x = s(_a).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.mse_loss(x, s(_b)).backward()
    torch.testing.assert_close(x.grad.cpu(), 2 * (_a - _b) / _a.numel())


def test_a_wrong_sized_out_warns_as_on_the_cpu():
    x = s(torch.ones(3))
    for dev in ("cpu", "spyre"):
        out = torch.empty(2, device=dev)
        with pytest.warns(UserWarning, match=r"had shape \[2\], which does not match the required output shape \[3\]"):
            torch.add(x.to(dev), 1, out=out)
        assert out.cpu().tolist() == [2.0, 2.0, 2.0]


def _resized_warnings(fn) -> list[str]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "was resized" in str(w.message)]


def test_the_resize_warning_names_the_op_and_the_argument(capfd):
    """An out= with elements and another shape is resized with torch's warning (its text first, so
    filters on it still match), once, naming the op and the argument; an out= of no elements is
    resized silently, as torch allows."""
    src, idx = torch.arange(12.0).reshape(4, 3), torch.tensor([2, 0])
    out = torch.empty(5, device="spyre")
    (msg,) = _resized_warnings(lambda: torch.index_select(s(src), 0, s(idx), out=out))
    assert msg.startswith("An output with one or more elements was resized since it had shape [5], which does "
                          "not match the required output shape [2, 3].")
    assert msg.endswith("(aten::index_select.out, argument 'out', a spyre:0 tensor)")
    assert torch.equal(out.cpu(), src[idx])
    values, indices = torch.empty(3, device="spyre"), torch.empty(0, dtype=torch.long, device="spyre")
    (msg,) = _resized_warnings(lambda: torch.max(s(src), 1, out=(values, indices)))
    assert "had shape [3], which does not match the required output shape [4]" in msg
    assert msg.endswith("(aten::max.dim_max, argument 'max', a spyre:0 tensor)")
    assert torch.equal(values.cpu(), src.max(1).values) and torch.equal(indices.cpu(), src.max(1).indices)
    empty = torch.empty(0, device="spyre")
    assert _resized_warnings(lambda: torch.ops.aten.index.Tensor_out(s(src), [s(idx)], out=empty)) == []
    assert torch.equal(empty.cpu(), src[idx])
    assert "was resized" not in capfd.readouterr().err  # nor torch's C++ warning on stderr


def test_autograd_grads_on_spyre_and_optimizer_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    ref.load_state_dict(model.state_dict())
    model.to("spyre")
    assert all(type(p) is torch.nn.Parameter and p.device.type == "spyre" for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x, target = torch.randn(8, 6), torch.randint(0, 3, (8,))
    for _ in range(2):
        for m, o, dev in ((model, opt, "spyre"), (ref, ref_opt, "cpu")):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x.to(dev)), target.to(dev))
            loss.backward()
            o.step()
    assert model[0].weight.grad.device.type == "spyre"
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.detach().cpu(), q.detach(), atol=1e-5)


def test_no_grad_and_inference_mode():
    w = s(torch.randn(3, 3)).requires_grad_()
    with torch.no_grad():
        assert not (w * 2).requires_grad
    with torch.inference_mode():
        y = w @ w
        assert y.is_inference() and y.device.type == "spyre"


def test_print_item_tolist():
    t = s(torch.tensor([[1.5, -2.0], [3.25, 4.0]]))
    text = str(t)
    assert "device='spyre:0'" in text and "3.2500" in text
    assert t[1, 0].item() == 3.25
    assert t.tolist() == [[1.5, -2.0], [3.25, 4.0]]
    h = s(torch.tensor([1.0, 2.0], dtype=torch.float16))
    assert "dtype=torch.float16" in str(h)
    assert "device='spyre:0'" in repr(torch.zeros(100, 100, device="spyre"))  # summarized printing


def test_factories_and_random_ops_on_spyre():
    torch.spyre.manual_seed(123)
    a = torch.randn(4, 4, device="spyre")
    torch.spyre.manual_seed(123)
    b = torch.randn(4, 4, device="spyre")
    assert torch.equal(a.cpu(), b.cpu())
    state = torch.spyre.get_rng_state()
    c = torch.rand(3, device="spyre")
    torch.spyre.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="spyre").cpu(), c.cpu())
    assert torch.arange(5, device="spyre").cpu().tolist() == [0, 1, 2, 3, 4]
    assert torch.full((2,), 7, dtype=torch.int32, device="spyre").cpu().tolist() == [7, 7]
    assert torch.eye(3, device="spyre").sum().item() == 3.0


def test_integer_and_bool_dtypes():
    x = torch.tensor([1, -2, 3], dtype=torch.int64)
    assert torch.equal((s(x) * 3).cpu(), x * 3)
    assert torch.equal((s(x) > 0).cpu(), x > 0)
    assert torch.equal(s(torch.tensor([200], dtype=torch.uint8)).cpu(), torch.tensor([200], dtype=torch.uint8))


def test_fallback_stats_name_the_ops_and_count_them():
    x = s(torch.ones(4))
    torch_spyre.reset_fallback_stats()
    x + x
    x + x
    torch.relu(x)
    stats = torch_spyre.fallback_stats()
    assert stats["add.out"] == 2 or stats.get("add.Tensor") == 2
    assert stats["relu"] == 1
    stats.reset()
    assert torch_spyre.fallback_stats() == {}


def test_half_precision_ops_run_on_dlfloat16_values():
    x = torch.tensor([1 + 2**-10], dtype=torch.float16)  # not representable in DLFloat16
    assert (s(x) * 1).cpu().item() == 1 + 2**-9


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_module_in_half_precision(dtype):
    lin = torch.nn.Linear(8, 4).to(dtype)
    x = torch.randn(2, 8, dtype=dtype)
    out = lin.to("spyre")(x.to("spyre")).cpu()
    assert out.dtype == dtype and torch.allclose(out.float(), lin.cpu()(x).float(), atol=0.05, rtol=0.05)


def test_resize_keeps_elements_and_shrinks_in_place():
    t = torch.arange(4.0).to("spyre")
    ptr = t.untyped_storage().data_ptr()
    t.resize_(2, 2)
    assert t.untyped_storage().data_ptr() == ptr and t.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    t.resize_(10)
    assert t[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert torch_spyre.get_layout(t).stick_layout.numel == 10


@pytest.mark.parametrize("make", [lambda: torch.nn.Conv2d(3, 4, 3, padding=1), lambda: torch.nn.ConvTranspose1d(3, 2, 3, stride=2),
                                  lambda: torch.nn.Conv1d(4, 4, 3, groups=2, bias=False)], ids=["conv2d", "convT1d", "conv1d_groups"])
def test_convolutions_forward_and_backward(make):
    torch.manual_seed(0)
    m = make()
    x = torch.randn(2, m.in_channels, 8, 8) if isinstance(m, torch.nn.Conv2d) else torch.randn(2, m.in_channels, 9)
    ref = m(x)
    ref.square().sum().backward()
    grad_w = m.weight.grad.clone()
    m.zero_grad()
    m.to("spyre")
    xs = x.to("spyre").requires_grad_()
    out = m(xs)
    out.square().sum().backward()
    assert torch.allclose(out.cpu(), ref, atol=1e-5)
    assert torch.allclose(m.weight.grad.cpu(), grad_w, atol=1e-4)
    assert xs.grad.shape == x.shape
    assert torch_spyre.fallback_stats()["convolution_overrideable"] == 1


def test_python_scalars_in_tensor_arguments_keep_type_promotion():
    i = torch.tensor([5, 7], dtype=torch.int32)
    assert torch.equal((i.to("spyre") % 4).cpu(), i % 4)
    x = torch.randn(3, 4)
    idx = torch.tensor([[0], [1], [2]])
    assert torch.equal(torch.take_along_dim(x.to("spyre"), idx.to("spyre"), 1).cpu(), torch.take_along_dim(x, idx, 1))


def test_conv_roofline_counts_convolution_flops():
    from torch_spyre.runtime import stream as rt

    got = []
    rt.add_listener(got.append)
    try:
        torch.nn.functional.conv2d(torch.randn(1, 8, 16, 16).to("spyre"), torch.randn(16, 8, 3, 3).to("spyre"))
    finally:
        rt.remove_listener(got.append)
    rec = next(r for r in got if r.kind == "fallback")
    assert rec.details["flops"] == 2 * (16 * 14 * 14) * (8 * 3 * 3)

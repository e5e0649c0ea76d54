"""The on-chip relayout (issue 13 §5): an in-place relayout through the scratchpads, stick blocks exchanged
over the ring, gives the device-memory path's bytes exactly, in the time the card model charges the ring."""

from __future__ import annotations

import pytest
import torch

import torch_spyre
from benchmarks import onchip_relayout as bench
from torch_spyre.card import CardConfig, StickLayout
from torch_spyre.compiler import optimizations
from torch_spyre.compiler.codegen.exchange import onchip_relayout_program, why_not
from torch_spyre.compiler.relayout import onchip_fallback, relayout_in_place
from torch_spyre.device import storage
from torch_spyre.program import RingSend


def _device_codes(t: torch.Tensor):
    """The allocation's layout and its device-order codes (DLFloat16 bits, fp32 words)."""
    alloc = storage.allocation_of(t)
    layout = alloc.meta["layout"]
    return layout, alloc.buffer[:layout.nbytes].view(layout.storage_dtype).copy()


def _relayouted(x: torch.Tensor, dims: tuple[int, ...], on: bool):
    """``x`` on the card, relayouted in place to each of ``dims`` in turn: (host values, the host element
    codes before, the layout and device codes after, the launch records)."""
    xs = x.to("spyre")
    before_layout, before = _device_codes(xs)
    records = []
    with optimizations.disabled(*(() if on else ("onchip_relayout",))):
        for d in dims:
            records.append(relayout_in_place(xs, d, "test"))
    layout, after = _device_codes(xs)
    assert layout.stick_dim == dims[-1]
    return xs.cpu(), before_layout.unpack(before), layout, after, records


@pytest.mark.parametrize("shape,dtype,dims", [
    ((64, 128), torch.float16, (0,)),           # one core per stick column: nothing to exchange
    ((300, 200), torch.float16, (0, 1)),         # partial blocks both ways, pieces split across cores
    ((100, 70), torch.float16, (0, 1)),          # padded lanes: zeros in the destination's padding
    ((222, 2), torch.float16, (0,)),             # one stick column, 4 row sticks, 34 padding lanes
    ((96, 64), torch.float32, (0, 1)),           # fp32: 32-lane blocks
])
def test_onchip_relayout_gives_the_device_memory_paths_values_bit_for_bit(shape, dtype, dims):
    """Every element's code is what the device-memory path gives (and the CPU's value); the on-chip path's
    padding lanes are zeros, the layout's canonical packing (``StickLayout.pack``), where the device-memory
    path leaves what its scratch allocation held."""
    torch_spyre.reset_fallback_stats()
    x = torch.randn(*shape, dtype=dtype)
    reference = x.to("spyre").cpu()  # the values as the card stores them (DLFloat16 for fp16)
    on_values, codes, layout, on_device, on_records = _relayouted(x, dims, on=True)
    off_values, off_codes, off_layout, off_device, off_records = _relayouted(x, dims, on=False)
    assert torch.equal(on_values, reference) and torch.equal(off_values, reference)
    torch.testing.assert_close(on_values, x, atol=1e-2, rtol=1e-2)
    assert (layout.unpack(on_device) == off_layout.unpack(off_device)).all() and (codes == off_codes).all()
    assert (on_device == layout.pack(codes)).all()  # padding included
    assert all(r.program.endswith("_onchip") for r in on_records)
    assert not any(r.program.endswith("_onchip") for r in off_records)
    assert all(r.stats.total_ring_bytes == 0 for r in off_records)
    if shape not in ((64, 128), (222, 2)):
        assert all(r.stats.total_ring_bytes > 0 for r in on_records)
    assert dict(torch_spyre.fallback_stats()) == {}


def test_the_seeds_exchange_takes_its_deterministic_simulated_time():
    """At the size whose ring time is the seed's 1.1 µs (384 KiB fp16 over 32 cores), the in-place relayout
    takes one kernel, 26.46 µs, instead of the relayout kernel and the copy back through device memory."""
    cfg = CardConfig()
    assert bench.sized_to_published(cfg) == (384, 512)
    program = onchip_relayout_program(StickLayout((384, 512), 1, "dlfloat16"), StickLayout((384, 512), 0, "dlfloat16"),
                                      cfg, in_place=True)
    assert len(program.cores) == 32
    # 384 KiB, of which the blocks at a core's edges go to both cores storing part of them
    assert sum(i.nbytes for _, _, i in program.instructions() if isinstance(i, RingSend)) == 480 * 1024
    assert bench.ring_s((384, 512), cfg) * 1e6 == pytest.approx(1.084, abs=5e-4)
    on, off = bench.measure(384, 512, on=True), bench.measure(384, 512, on=False)
    assert [k for _, k, _ in on["work"]] == ["kernel"]
    assert [k for _, k, _ in off["work"]] == ["kernel", "copy_d2d"]
    assert on["us"] == pytest.approx(26.46, abs=5e-3)
    assert off["us"] == pytest.approx(53.32, abs=5e-3)


def test_what_the_exchange_cannot_take_goes_through_device_memory_with_the_reason(monkeypatch):
    cfg = CardConfig()
    three_d = StickLayout((2, 64, 64), 2, "dlfloat16"), StickLayout((2, 64, 64), 1, "dlfloat16")
    assert "2-D tensor" in why_not(*three_d, cfg)
    assert "bit for bit, not int32" in why_not(StickLayout((64, 64), 1, "int32"), StickLayout((64, 64), 0, "int32"),
                                              cfg)
    big = StickLayout((8192, 8192), 1, "dlfloat16"), StickLayout((8192, 8192), 0, "dlfloat16")
    assert "bytes of scratchpad on the busiest of all 32 cores" in why_not(*big, cfg)
    with pytest.raises(ValueError, match="no on-chip relayout .*2-D tensor"):
        onchip_relayout_program(*three_d, cfg)
    with pytest.raises(ValueError, match="keeps the host shape and dtype"):
        onchip_relayout_program(StickLayout((64, 128), 1, "dlfloat16"), StickLayout((128, 64), 0, "dlfloat16"), cfg)
    # The fallback still relayouts (through device memory), with the reason asked for by name.
    xs = torch.randn(2, 64, 64).half().to("spyre")
    before = xs.cpu()
    assert "2-D tensor" in onchip_fallback(StickLayout((2, 64, 64), 2, "dlfloat16"),
                                           StickLayout((2, 64, 64), 1, "dlfloat16"))
    record = relayout_in_place(xs, 1)
    assert not record.program.endswith("_onchip") and torch.equal(xs.cpu(), before)
    # Switched off by the environment, like every optimization.
    two_d = StickLayout((64, 128), 1, "dlfloat16"), StickLayout((64, 128), 0, "dlfloat16")
    assert onchip_fallback(*two_d) is None
    monkeypatch.setenv(optimizations.ENV, "onchip_relayout")
    assert onchip_fallback(*two_d) == "onchip_relayout is switched off"


def _transposed_chain(x, w, v):
    y = x @ w  # [M, N], written sticked on N (its last dim)
    return y.t() @ v  # A = y^T: the consumer wants y sticked on its rows (M)


def _compiled_chain(xs, on: bool):
    """The chain compiled and run once with ``onchip_relayout`` on or off: (result on the host, the relayout
    kernel's work record)."""
    from torch_spyre.compiler import layout_plan as lp
    from torch_spyre.runtime import stream

    from .spyre_compile_helpers import fresh

    fresh()
    lp.reset_layout_stats()
    records = []
    with optimizations.disabled(*(() if on else ("onchip_relayout",))):
        fn = torch.compile(_transposed_chain, dynamic=False)
        stream.add_listener(records.append)
        try:
            out = fn(*xs).cpu()
        finally:
            stream.remove_listener(records.append)
    assert lp.layout_stats() == {"relayout_kernels": 1}
    (relayout,) = [r for r in records if "relayout" in r.name]
    return out, relayout


@pytest.mark.parametrize("check", ["0", "1"])
def test_an_activation_relayout_between_compiled_kernels_goes_over_the_ring_when_faster(monkeypatch, check):
    """The layout plan's relayout kernel between two compiled matmuls (an activation, not a weight): with
    ``onchip_relayout`` on it is the exchange program where the card's timing model finds it faster (fp16
    [64, 4096]: one read and one write of device memory, the blocks swapped over the ring), the reason in
    its decisions; the values are bit-identical to the device-memory kernel's (fast and checked executors)."""
    from torch_spyre.compiler import layout_plan as lp
    from torch_spyre.compiler import relayout as rl
    from torch_spyre.device import cards

    monkeypatch.setenv("TORCH_SPYRE_CHECK", check)
    # the readers' in-kernel transposes priced at 1 s, so that the plan inserts the relayout kernel (on this
    # card they cost ~1 us and never lose to a kernel launch; test_layout_plan covers that choice)
    monkeypatch.setattr(lp.Costs, "matmul_saving_s", lambda self, *args: 1.0)
    torch.manual_seed(11)
    xs = [(torch.randn(*s) / 4).half().to("spyre") for s in ((64, 128), (128, 4096), (64, 128))]
    on, on_record = _compiled_chain(xs, on=True)
    off, off_record = _compiled_chain(xs, on=False)
    assert torch.equal(on, off)
    ref = _transposed_chain(*(x.cpu().float() for x in xs))
    torch.testing.assert_close(on.float(), ref, atol=5e-2, rtol=5e-2)
    src, dst = StickLayout((64, 4096), 1, "dlfloat16"), StickLayout((64, 4096), 0, "dlfloat16")
    config = cards.card(0).config
    onchip, why, seconds = rl.copy_choice(src, dst, config)
    assert onchip and why.startswith("on chip, the faster: on chip 27.03 us, through device memory 29.61 us")
    assert on_record.details["program"].endswith("_onchip") and not off_record.details["program"].endswith("_onchip")
    assert on_record.details["bytes"]["dram_read"] == on_record.details["bytes"]["dram_write"] == src.nbytes
    assert on_record.length == pytest.approx(seconds, rel=1e-9)
    assert round(on_record.length * 1e6, 2) == 27.03 and round(off_record.length * 1e6, 2) == 29.61
    notes = rl._prepared_relayout(0, src, dst, onchip=True, why=why).program.metadata["decisions"]["notes"]
    assert f"relayout into a new allocation {why}" in notes


def test_an_activation_relayout_stays_in_device_memory_where_that_is_faster_or_the_exchange_cannot():
    """[1024, 1024]: the device-memory kernel is faster (the exchange's load, ring and store do not overlap);
    fp16 [4, 64, 64] is not 2-D: no exchange, the reason recorded; switched off: said so."""
    from torch_spyre.compiler import relayout as rl

    config = CardConfig()
    onchip, why, seconds = rl.copy_choice(StickLayout((1024, 1024), 1, "dlfloat16"),
                                          StickLayout((1024, 1024), 0, "dlfloat16"), config)
    assert not onchip and why == ("through device memory, not slower: on chip 50.42 us, through device memory "
                                  "47.23 us (card timing model)") and round(seconds * 1e6, 2) == 47.23
    onchip, why, _ = rl.copy_choice(StickLayout((4, 64, 64), 2, "dlfloat16"), StickLayout((4, 64, 64), 1, "dlfloat16"),
                                    config)
    assert not onchip and "not on chip: the on-chip exchange swaps the stick dim of a 2-D tensor" in why
    with optimizations.disabled("onchip_relayout"):
        onchip, why, _ = rl.copy_choice(StickLayout((64, 4096), 1, "dlfloat16"),
                                        StickLayout((64, 4096), 0, "dlfloat16"), config)
    assert not onchip and why.endswith("not on chip: onchip_relayout is switched off")


def test_relayout_into_a_new_tensor_times_nothing_when_the_exchange_is_refused(monkeypatch):
    """``relayout(t, dim)`` needs the path, not its price: with the exchange refused (not 2-D, or switched
    off) the device-memory program is the only candidate, so nothing is timed to choose it (``prepare``
    times the program it runs); an eligible relayout still times both and takes copy_choice's answer."""
    import torch_spyre.card.timing as timing
    from torch_spyre.compiler import relayout as rl

    timed = []
    real = timing.time_program
    monkeypatch.setattr(timing, "time_program",
                        lambda prog, cfg, *a, **k: timed.append(prog.name) or real(prog, cfg, *a, **k))
    config = CardConfig()
    cube = StickLayout((4, 64, 64), 2, "dlfloat16"), StickLayout((4, 64, 64), 1, "dlfloat16")
    onchip, why = rl.copy_path(*cube, config)
    assert not onchip and why.startswith("through device memory; not on chip: the on-chip exchange swaps")
    flat = StickLayout((64, 4096), 1, "dlfloat16"), StickLayout((64, 4096), 0, "dlfloat16")
    with optimizations.disabled("onchip_relayout"):
        onchip, why = rl.copy_path(*flat, config)
    assert not onchip and why == "through device memory; not on chip: onchip_relayout is switched off"
    assert timed == []
    assert rl.copy_path(*flat, config) == rl.copy_choice(*flat, config)[:2] and len(timed) == 2

    def no_choice(*args):
        raise AssertionError("copy_choice called for a relayout the exchange cannot take")

    monkeypatch.setattr(rl, "copy_choice", no_choice)
    xs = torch.randn(4, 64, 64).half().to("spyre")
    y = rl.relayout(xs, 1)
    assert torch_spyre.get_layout(y).stick_layout.stick_dim == 1 and torch.equal(y.cpu(), xs.cpu())
    notes = rl._prepared_relayout(0, *cube, why=rl.copy_path(*cube, config)[1]).program.metadata["decisions"]["notes"]
    assert any(n.startswith("relayout into a new allocation through device memory; not on chip") for n in notes)

"""The profiler (runtime/profiler.py, public as torch_spyre.profiler): collection, tables, traces, timelines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torch_spyre.card import Card, load_config
from torch_spyre.program import Addr, DmaLoad, DmaPattern, DmaStore, Elementwise, Operand, Program, SpTensor
import torch_spyre.profiler as profiler  # the public alias, as users import it
from torch_spyre.runtime import stream as S
from torch_spyre.runtime.launch import launch, prepare

CARDS = (3, 4)  # card indices no other test file uses


@pytest.fixture
def cards():
    for c in CARDS:
        S.clock(c).reset()
    config = load_config(environ={}, dram_capacity_bytes=64 * 2**20)
    yield [Card(c, config) for c in CARDS]
    for c in CARDS:
        S.clock(c).reset()


def scale_program(n_sticks: int, cores: int, name: str) -> Program:
    """out = x * x on float32 over ``cores`` cores."""
    per = n_sticks // cores
    chunk = per * 128
    body = {}
    for c in range(cores):
        t = SpTensor(0, "float32", (per * 32,))
        o = SpTensor(chunk, "float32", (per * 32,))
        body[c] = [DmaLoad(Addr("x", c * chunk), 0, DmaPattern.contiguous(per)), Elementwise("mul", o, (t, t)),
                   DmaStore(Addr("out", c * chunk), chunk, DmaPattern.contiguous(per))]
    return Program(name, [Operand("x", n_sticks * 128), Operand("out", n_sticks * 128, "out")], body)


def run(card: Card, name: str = "square", cores: int = 4, times: int = 1, stream=None):
    p = prepare(scale_program(8, cores, name), card)
    x, out = card.memory.allocate(8 * 128), card.memory.allocate(8 * 128)
    recs = [launch(p, {"x": x, "out": out}, stream=stream) for _ in range(times)]
    return p, recs


def test_profile_collects_every_record_and_removes_its_listener(cards):
    before = list(S._listeners)
    with profiler.profile() as prof:
        assert len(S._listeners) == len(before) + 1
        p, recs = run(cards[0], times=2)
        S.Stream(cards[0].index).enqueue("copy in", 4e-6, kind="copy_h2d", resource="h2d", details={"nbytes": 4096})
    assert S._listeners == before
    run(cards[0])  # after the block: not collected
    evs = prof.events()
    assert [(e.name, e.kind) for e in evs] == [("square", "kernel")] * 2 + [("copy in", "copy_h2d")]
    assert [(e.start, e.end) for e in evs[:2]] == [(r.start, r.end) for r in recs]


def test_listener_is_removed_when_the_block_raises(cards):
    before = list(S._listeners)
    with pytest.raises(RuntimeError, match="boom"):
        with profiler.profile():
            raise RuntimeError("boom")
    assert S._listeners == before


def test_kernel_intervals_are_placed_at_the_kernel_start(cards):
    with profiler.profile() as prof:
        p, (r1, r2) = run(cards[0], times=2)
    ivs = prof.kernel_intervals()
    per_launch = len(list(p.timing.intervals))
    assert len(ivs) == 2 * per_launch
    second = ivs[per_launch:]
    for iv, raw in zip(second, p.timing.intervals):
        assert iv.start == pytest.approx(r2.start + raw.start) and iv.end == pytest.approx(r2.start + raw.end)
        assert (iv.core, iv.index, iv.engine) == (raw.core, raw.index, raw.engine)
    assert {iv.op for iv in ivs} >= {"dma_load", "elementwise", "dma_store"}
    assert all(r2.start <= iv.start <= iv.end <= r2.end + 1e-15 for iv in second)


def test_key_averages_table(cards):
    with profiler.profile() as prof:
        pa, _ = run(cards[0], "alpha", times=3)
        pb, _ = run(cards[0], "beta", cores=1, times=1)
        S.Stream(cards[0].index).enqueue("copy in", 1e-3, kind="copy_h2d", resource="h2d", details={"nbytes": 4096})
    avg = {e.key: e for e in prof.key_averages()}
    a = avg["alpha"]
    assert a.count == 3 and a.device_time_total == pytest.approx(3 * pa.timing.total_s)
    assert a.device_time == pytest.approx(pa.timing.total_s)
    assert a.flops == pytest.approx(3 * pa.timing.flops)
    assert a.roofline_fraction == pytest.approx(pa.timing.roofline_fraction)
    assert avg["copy in"].bytes == 4096 and avg["copy in"].roofline_fraction is None
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=10)
    lines = table.splitlines()
    assert "Name" in lines[1] and "# Calls" in lines[1] and "Op roofline %" in lines[1]
    assert lines[3].startswith("copy in")  # largest total first
    assert any(line.startswith("alpha") and " 3 " in line for line in lines)
    top1 = prof.key_averages().table(sort_by="count", row_limit=1)
    assert "alpha" in top1 and "beta" not in top1
    assert "copy in" in prof.key_averages().table(sort_by="cuda_time_total")
    with pytest.raises(ValueError, match="cannot sort by 'cpu_nonsense'"):
        prof.key_averages().table(sort_by="cpu_nonsense")


def test_chrome_trace_has_a_process_per_card_and_tracks_per_stream_pcie_core_engine(cards, tmp_path):
    s = S.Stream(cards[0].index)
    with profiler.profile() as prof:
        p0, _ = run(cards[0], "k0", cores=4, stream=s)
        s.enqueue("upload", 2e-6, kind="copy_h2d", resource="h2d", details={"nbytes": 1024})
        p1, _ = run(cards[1], "k1", cores=2)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    # One process per card; pid and tid 0 are avoided (Perfetto reserves them for the idle task).
    pid0, pid1 = cards[0].index + 1, cards[1].index + 1
    assert procs == {pid0: f"spyre:{cards[0].index}", pid1: f"spyre:{cards[1].index}"}
    threads = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert (pid0, f"stream {s.stream_id}") in threads and (pid0, "PCIe h2d") in threads
    assert (pid1, "stream 0 (default)") in threads
    for prep, pid in ((p0, pid0), (p1, pid1)):
        expected = {(pid, f"core {iv.core:02d} {iv.engine}") for iv in prep.timing.intervals}
        assert expected <= threads
    assert not any(name.startswith("core 02") for pid, name in threads if pid == pid1)  # k1 used 2 cores
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    n_intervals = len(list(p0.timing.intervals)) + len(list(p1.timing.intervals))
    assert len(xs) == 3 + 1 + n_intervals  # 3 stream records, the copy again on PCIe, every interval
    kernel = next(e for e in xs if e["name"] == "k0" and e["cat"] == "kernel")
    assert kernel["dur"] == pytest.approx(p0.timing.total_s * 1e6)
    assert kernel["args"]["flops"] == p0.timing.flops
    # Every event sits on a track that has a name.
    named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in xs} <= named
    assert all(e["pid"] > 0 for e in trace["traceEvents"])
    assert all(e["tid"] > 0 for e in trace["traceEvents"] if e["ph"] == "X" or e["name"].startswith("thread_"))


def test_timeline_png_is_written_and_not_blank(cards, tmp_path):
    with profiler.profile() as prof:
        run(cards[0], "k0", cores=4, times=2)
        S.Stream(cards[0].index).enqueue("upload", 30e-6, kind="copy_h2d", resource="h2d")
        run(cards[1], "k1", cores=2)
    path = tmp_path / "timeline.png"
    prof.export_timeline(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image as mpimg

    img = mpimg.imread(str(path))
    assert img.shape[0] > 400 and img.shape[1] > 1000
    colors = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colors) > 20  # bars in several engine colours, not an empty canvas


def test_empty_profile_still_exports(tmp_path):
    with profiler.profile() as prof:
        pass
    assert prof.key_averages() == []
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"] == []
    prof.export_timeline(str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # a PNG, not just some bytes


def test_on_trace_ready_is_called_when_profiling_stops(cards):
    seen = []
    with profiler.profile(on_trace_ready=seen.append, activities=["spyre"], record_shapes=True) as prof:
        run(cards[0])
    assert seen == [prof]


def test_start_and_stop_without_a_with_block(cards):
    prof = profiler.profile()
    prof.start()
    run(cards[0], "started")
    prof.stop()
    run(cards[0], "after stop")
    assert [e.name for e in prof.events()] == ["started"]

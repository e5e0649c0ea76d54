"""The serving plugin's host-side parts and its attention kernel, without vLLM: buckets, the step plan,
KV-slot runs and writes, paged attention against a dense reference, the KV budget, the serve command."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch

from torch_spyre.errors import SpyreError
from torch_spyre.serving import buckets, plugin
from torch_spyre.serving.kv_budget import kv_cache_budget
from torch_spyre.serving.paged_attention import paged_attention, slot_runs, write_kv
from torch_spyre.serving.plan import plan_step
from torch_spyre.serving.serve import ServeUsageError, server_command, server_env


def test_buckets():
    assert [buckets.query_bucket(n) for n in (1, 2, 16, 17, 100)] == [1, 16, 16, 32, 128]
    assert [buckets.block_bucket(n) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]
    assert [buckets.batch_bucket(n) for n in (1, 3, 4)] == [1, 4, 4]
    with pytest.raises(ValueError, match="positive"):
        buckets.next_pow2(0)


def test_slot_runs_merge_consecutive_slots_only():
    assert slot_runs([128, 129, 130, 64, 7, 8]) == [(0, 128, 3), (3, 64, 1), (4, 7, 2)]
    assert slot_runs([]) == []


def test_write_kv_places_tokens_at_their_slots():
    kv = torch.zeros(2, 4, 8, 2, 4, dtype=torch.float16)
    key, value = torch.randn(3, 2, 4).half(), torch.randn(3, 2, 4).half()
    write_kv(kv, key, value, slot_runs([9, 10, 31]))
    assert torch.equal(kv[0, 1, 1], key[0]) and torch.equal(kv[0, 1, 2], key[1]) and torch.equal(kv[1, 3, 7], value[2])
    assert kv.count_nonzero() == key.count_nonzero() + value.count_nonzero()


def _dense_reference(q, k, v, scale):
    """Causal attention of the last q.shape[0] positions over k/v [L, KVH, D], GQA by repeating KV heads."""
    qlen, h, _ = q.shape
    rep = h // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    ctx = k.shape[0] - qlen
    allowed = torch.arange(k.shape[0])[None, :] <= ctx + torch.arange(qlen)[:, None]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).reshape(qlen, -1)


def test_plan_and_paged_attention_match_dense_attention_on_cpu():
    # Two decode sequences and a prefill chunk continuing a 40-token context, in one step (block size 16).
    torch.manual_seed(0)
    bs, h, kvh, d, nblocks = 16, 4, 2, 8, 12
    seq_lens, qlens = [20, 3, 45], [1, 1, 5]
    tables = torch.tensor([[5, 2, 0, 0], [7, 0, 0, 0], [1, 9, 3, 0]])
    kv = torch.randn(2, nblocks, bs, kvh, d).half()
    kv[:, 0] = 0  # vLLM's null block
    qsl = [0, 1, 2, 7]
    q = torch.randn(7, h, d).half()
    slots = [int(tables[i, (s - 1 - j) // bs]) * bs + (s - 1 - j) % bs
             for i, (s, n) in enumerate(zip(seq_lens, qlens)) for j in reversed(range(n))]
    plan = plan_step(qsl, seq_lens, tables, torch.tensor(slots), 7, bs)
    assert [(g.batch, g.queries, g.blocks) for g in plan.groups] == [(2, 1, 2), (1, 16, 4)]
    assert plan.order is None and plan.kv_runs == slot_runs(slots)
    got = []
    for g in plan.groups:
        qg = q.index_select(0, g.query_rows.cpu()).reshape(g.batch, g.queries, h, d)
        out = paged_attention(qg.float(), kv.float(), g.block_idx.cpu(), g.mask.cpu(), 0.3)
        got.append(out.reshape(g.batch * g.queries, -1).index_select(0, g.keep.cpu()))
    got = torch.cat(got)
    for i, (s, n) in enumerate(zip(seq_lens, qlens)):
        blocks = tables[i, :math.ceil(s / bs)]
        k = kv[0, blocks].reshape(-1, kvh, d)[:s]
        v = kv[1, blocks].reshape(-1, kvh, d)[:s]
        ref = _dense_reference(q[qsl[i]:qsl[i + 1]], k, v, 0.3)
        torch.testing.assert_close(got[qsl[i]:qsl[i + 1]], ref, atol=1e-3, rtol=1e-3)


def test_plan_reorders_when_a_prefill_comes_before_decodes():
    plan = plan_step([0, 3, 4], [3, 9], torch.tensor([[1], [2]]), torch.tensor([16, 17, 18, 40]), 4, 16)
    # groups: the decode (token 3), then the prefill (tokens 0..2): kept rows come back in step order
    assert plan.order.cpu().tolist() == [1, 2, 3, 0]


def test_plan_refuses_a_token_without_a_slot():
    with pytest.raises(RuntimeError, match="no KV slot"):
        plan_step([0, 1], [1], torch.tensor([[1]]), torch.tensor([-1]), 1, 16)


@pytest.mark.slow
def test_compiled_paged_attention_on_the_card_matches_cpu():
    import torch_spyre
    from torch_spyre.serving.device import card_device, compiled_attention, softmax_scale

    torch.manual_seed(1)
    kv = torch.randn(2, 6, 16, 2, 8).half()
    q = torch.randn(2, 1, 4, 8).half()
    idx = torch.tensor([3, 0, 5, 1])
    mask = torch.zeros(2, 1, 32)
    mask[0, :, 20:] = float("-inf")
    mask[1, :, 3:] = float("-inf")
    torch_spyre.reset_fallback_stats()
    out = compiled_attention()(q.to(card_device()), kv.to(card_device()), idx.to(card_device()), mask.to(card_device()), softmax_scale(0.35))
    ref = paged_attention(q.float(), kv.float(), idx, mask, 0.35)
    torch.testing.assert_close(out.cpu().float(), ref, atol=4e-3, rtol=4e-3)  # DLFloat16 storage, fp32 math
    assert torch_spyre.fallback_stats() == {}


def test_kv_budget_in_card_bytes():
    free, total = torch.spyre.mem_get_info(0)
    assert kv_cache_budget(1 << 20, 0.9) == 1 << 20
    assert kv_cache_budget(None, 0.5) == int(total * 0.5) - (total - free)
    with pytest.raises(SpyreError, match="lower --kv-cache-memory-bytes"):
        kv_cache_budget(free + 1, 0.9)
    with pytest.raises(SpyreError, match="no card memory left"):
        kv_cache_budget(None, 0.0)


def test_plugin_activates_only_when_asked(monkeypatch):
    monkeypatch.delenv(plugin.ENV, raising=False)
    assert plugin.platform_plugin() is None
    monkeypatch.setenv(plugin.ENV, "1")
    assert plugin.platform_plugin() == "torch_spyre.serving.platform.SpyrePlatform"
    monkeypatch.setenv(plugin.ENV, "yes")
    with pytest.raises(ValueError, match="set it to 1"):
        plugin.platform_plugin()


def test_serve_command_line(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    cmd = server_command(str(tmp_path), "127.0.0.1", 8123, ["--max-model-len", "64"])
    assert cmd[:3] == [sys.executable, "-m", "torch_spyre.serving.server_main"]
    assert cmd[3:] == ["--model", str(tmp_path), "--host", "127.0.0.1", "--port", "8123", "--dtype", "float16",
                       "--max-model-len", "64"]
    assert "float16" not in server_command(str(tmp_path), "h", 1, ["--dtype", "half"])[9:10]
    assert server_env({})[plugin.ENV] == "1"
    with pytest.raises(ServeUsageError, match="no config.json"):
        server_command(str(tmp_path / "missing"), "h", 1, [])
    with pytest.raises(ServeUsageError, match="not a TCP port"):
        server_command(str(tmp_path), "h", 70000, [])
    with pytest.raises(ServeUsageError, match="own option"):
        server_command(str(tmp_path), "h", 1, ["--port", "9"])


def test_spyre_serve_cli_errors_exit_2(tmp_path, capsys):
    from torch_spyre.cli import main

    assert main(["serve", str(tmp_path / "nothing"), "--port", "8000"]) == 2
    assert "no config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["info", "--bogus"])  # pass-through is for serve only


def test_greedy_comparison_stops_at_a_near_tie_only():
    from .tiny_models import Reference, assert_greedy_matches

    ref = Reference([5, 6, 7, 8, 9])
    ref.runner_up, ref.gaps = [1, 2, 3, 4, 5], [0.5, 0.4, 0.3, 0.01, 0.3]
    assert_greedy_matches([5, 6, 7, 4, 1], ref)  # the tie at step 3 may take the runner-up; after it, anything
    with pytest.raises(AssertionError):
        assert_greedy_matches([5, 9, 7, 8, 9], ref)  # a decisive step differs
    with pytest.raises(AssertionError):
        assert_greedy_matches([5, 6, 7, 2, 9], ref)  # at the tie, only the top two are allowed
    ref.gaps = [0.01, 0.5, 0.5, 0.5, 0.5]
    with pytest.raises(AssertionError, match="ties at step 0"):
        assert_greedy_matches([5, 6, 7, 8, 9], ref)


def test_step_accounting_ttft_and_tpot_in_card_time():
    from torch_spyre.serving.sim_time import StepAccounting

    acc = StepAccounting()
    # step 1 [0, 2): A's prefill, first chunk (no token); busy 1.5 of 2
    acc.begin(["A"], set(), 0.0, 10.0)
    s1 = acc.end({"A": 0}, 2.0, 11.5)
    assert (s1.elapsed, s1.busy, s1.ttft, s1.tpot) == (2.0, 1.5, [], [])
    # step 2 [2, 5): A's last chunk samples its first token; B admitted, one-step prefill
    acc.begin(["A", "B"], set(), 2.0, 11.5)
    s2 = acc.end({"A": 1, "B": 1}, 5.0, 14.0)
    assert s2.ttft == [5.0, 3.0] and s2.tpot == [] and s2.busy == 2.5
    # step 3 [5, 6): both decode
    acc.begin(["A", "B"], set(), 5.0, 14.0)
    assert acc.end({"A": 1, "B": 1}, 6.0, 15.0).tpot == [1.0, 1.0]
    # step 4 [6, 9.5): A finished (reported now), B alone; two tokens at once share the gap
    acc.begin(["B"], {"A"}, 6.0, 15.0)
    s4 = acc.end({"B": 2}, 9.5, 17.0)
    assert s4.tpot == [1.75, 1.75] and acc.tracked() == 1
    acc.begin([], {"B"}, 9.5, 17.0)
    assert acc.end({}, 9.5, 17.0).elapsed == 0.0 and acc.tracked() == 0
    # a request that was never scheduled (no begin for it) gets no sample
    acc.begin(["C"], set(), 10.0, 17.0)
    assert acc.end({"C": 1, "ghost": 1}, 11.0, 17.5).ttft == [1.0]


def test_step_accounting_refuses_an_unopened_step_and_a_clock_going_back():
    from torch_spyre.serving.sim_time import StepAccounting

    acc = StepAccounting()
    with pytest.raises(RuntimeError, match="without begin"):
        acc.end({}, 1.0, 0.0)
    acc.begin(["A"], set(), 5.0, 1.0)
    with pytest.raises(RuntimeError, match="clock went backwards"):
        acc.end({"A": 1}, 4.0, 1.0)


@pytest.mark.slow  # an fp16 add and copies: a card program to generate on a cold cache (11 s)
def test_card_meter_reads_the_card_clock_and_compute_time():
    import torch_spyre.profiler
    from torch_spyre.serving.sim_time import CardMeter

    meter = CardMeter(0)
    torch.spyre.synchronize()
    t0, b0 = meter.now(), meter.busy()
    with torch_spyre.profiler.profile() as prof:
        x = torch.arange(64, dtype=torch.float16).reshape(8, 8).to("spyre")
        y = (x + x).cpu()
    t1, b1 = meter.now(), meter.busy()
    compute = sum(r.duration for r in prof.events() if r.resource == "compute" and r.card == 0)
    transfers = sum(r.duration for r in prof.events() if r.resource != "compute" and r.card == 0)
    assert torch.equal(y, 2 * torch.arange(64, dtype=torch.float16).reshape(8, 8))
    assert compute > 0 and transfers > 0
    assert b1 - b0 == pytest.approx(compute, rel=1e-12)
    assert t1 - t0 >= compute  # the add waits for the copy in; the copy out waits for the add


def test_card_meter_counts_collectives_as_link_time_not_busy_time():
    from torch_spyre.device import collectives
    from torch_spyre.serving.sim_time import CardMeter

    meter = CardMeter(0)
    x = torch.zeros(16, 64, dtype=torch.float16).to("spyre")
    t0, b0, l0 = meter.now(), meter.busy(), meter.link()
    rec = collectives.charge(0, "all_reduce", collectives.device_bytes(x), 2, start=t0 + 1e-3)
    assert rec.start == t0 + 1e-3  # waits for the slowest card
    assert meter.link() - l0 == collectives.seconds("all_reduce", 16 * 128, 2) == rec.duration
    assert meter.busy() == b0 and meter.now() == rec.end
    y = x.cpu()  # the next work on the stream (and on the PCIe port) waits for the collective
    assert meter.now() > rec.end and torch.equal(y, torch.zeros(16, 64, dtype=torch.float16))


@pytest.mark.parametrize("tp, pp, cards, message", [
    (2, 1, 1, "--tensor-parallel-size 2 needs 2 cards, one per rank, but the simulated system has 1: set "
              "TORCH_SPYRE_NUM_CARDS=2"),
    (1, 2, 2, "--pipeline-parallel-size 2: spyre serves tensor parallel only"),
])
def test_parallel_config_checks(tp, pp, cards, message):
    pytest.importorskip("vllm")
    from torch_spyre.serving.platform import check_parallel

    check_parallel(2, 1, 2)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_parallel(tp, pp, cards)


def test_sim_metrics_exposition():
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from torch_spyre.serving import sim_metrics
    from torch_spyre.serving.sim_time import StepTimes

    registry = prometheus_client.CollectorRegistry()
    metrics = sim_metrics.SimMetrics(registry)
    series = metrics.series("tiny", 0)
    series.record(StepTimes(0.0, 4e-3, 3e-3, ttft=[4e-3, 4e-3], tpot=[]))
    metrics.series("tiny", 0).record(StepTimes(4e-3, 5e-3, 1e-3, link=2e-4, ttft=[], tpot=[1e-3, 1e-3]))
    samples = {(s.name, s.labels.get("le")): s.value
               for fam in text_string_to_metric_families(prometheus_client.generate_latest(registry).decode())
               for s in fam.samples if s.labels.get("model_name") == "tiny" and s.labels.get("engine") == "0"}
    assert samples[(sim_metrics.TTFT + "_count", None)] == 2
    assert samples[(sim_metrics.TTFT + "_sum", None)] == pytest.approx(8e-3)
    assert samples[(sim_metrics.TTFT + "_bucket", "0.005")] == 2 and samples[(sim_metrics.TTFT + "_bucket", "0.0025")] == 0
    assert samples[(sim_metrics.TPOT + "_count", None)] == 2
    assert samples[(sim_metrics.BUSY + "_total", None)] == pytest.approx(4e-3)
    assert samples[(sim_metrics.STEPS + "_total", None)] == pytest.approx(5e-3)
    assert samples[(sim_metrics.LINK + "_total", None)] == pytest.approx(2e-4)
    assert samples[(sim_metrics.UTILIZATION, None)] == pytest.approx(0.8)  # both series objects share totals


def test_server_main_gives_the_server_one_metrics_directory(tmp_path, monkeypatch):
    from torch_spyre.serving.server_main import METRICS_DIR_ENV, shared_metrics_dir

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    env = {}
    directory = shared_metrics_dir(env)
    assert env[METRICS_DIR_ENV] == directory.name and list(tmp_path.iterdir()) == [tmp_path / directory.name]
    directory.cleanup()
    assert list(tmp_path.iterdir()) == []
    env = {METRICS_DIR_ENV: "/theirs"}
    assert shared_metrics_dir(env) is None and env == {METRICS_DIR_ENV: "/theirs"}


def _record_of_caught_error(make_record, name: str):
    """A record logged with ``exc_info`` from inside a caller whose frame holds ``owner`` (a stand-in for
    vLLM's ``LLM.__init__`` logging its renderer warm-up failure)."""
    import logging
    import weakref

    class Owner:
        pass

    def caller():
        owner = Owner()  # noqa: F841 - a local of the frame the traceback reaches through f_back
        try:
            raise ValueError("no tokenizer")
        except ValueError:
            import sys as _sys

            record = make_record(name, logging.WARNING, __file__, 1, "warm-up failed", (), _sys.exc_info())
        return record, weakref.ref(owner)

    return caller()


def test_vllm_log_records_keep_the_traceback_as_text_and_no_frames():
    import gc
    import logging

    from torch_spyre.serving import log_records

    make_record = log_records._detached(logging.LogRecord)
    record, owner = _record_of_caught_error(make_record, "vllm.renderers.base")
    gc.collect()
    assert owner() is None, "the record kept the logging caller's frame (and its locals) alive"
    assert record.exc_info is None and "ValueError: no tokenizer" in record.exc_text
    text = logging.Formatter().format(record)
    assert text.startswith("warm-up failed\nTraceback (most recent call last):") and text.endswith("ValueError: no tokenizer")

    # Other libraries' records are untouched (their exc_info, and so the caller, stay as logging keeps them).
    record, owner = _record_of_caught_error(make_record, "vllmish.other")
    gc.collect()
    assert record.exc_info is not None and owner() is not None


def test_log_record_factory_is_installed_once():
    import logging

    from torch_spyre.serving import log_records

    before = logging.getLogRecordFactory()
    try:
        logging.setLogRecordFactory(logging.LogRecord)  # as if not installed yet (an earlier LLM installed it)
        log_records.install()
        installed = logging.getLogRecordFactory()
        log_records.install()
        assert logging.getLogRecordFactory() is installed and installed is not logging.LogRecord
    finally:
        logging.setLogRecordFactory(before)

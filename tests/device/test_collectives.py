"""Collectives between simulated cards (``device/collectives.py``): values through gloo, time on the link model.

Two processes, each owning one card (spyre:0, spyre:1), as vLLM's tensor-parallel workers do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_spyre.card import interconnect, load_config

from .collective_rank import COLS, ROWS, rank_values

ROOT = Path(__file__).resolve().parents[2]


def test_link_model_figures():
    cfg = load_config({})
    lat, bw = cfg.p2p_latency_s, cfg.p2p_bandwidth
    assert (lat, bw) == (4.1e-6, 54e9)
    b = 1 << 20
    assert interconnect.collective_seconds(cfg, "all_reduce", b, 1) == 0.0
    assert interconnect.collective_seconds(cfg, "all_reduce", b, 2) == pytest.approx(2 * (lat + b / 2 / bw))
    assert interconnect.collective_seconds(cfg, "all_reduce", b, 4) == pytest.approx(6 * (lat + b / 4 / bw))
    assert interconnect.collective_seconds(cfg, "all_gather", b, 4) == pytest.approx(3 * (lat + b / bw))
    assert interconnect.collective_seconds(cfg, "reduce_scatter", b, 4) == pytest.approx(3 * (lat + b / 4 / bw))
    assert interconnect.collective_seconds(cfg, "gather", b, 4) == pytest.approx(lat + 3 * b / bw)
    assert interconnect.collective_seconds(cfg, "broadcast", b, 4) == pytest.approx(lat + b / bw)
    for bad, message in ((("all_to_all", b, 2), "unknown collective 'all_to_all'"), (("gather", b, 0), "at least one"),
                         (("gather", -1, 2), "negative size")):
        with pytest.raises(ValueError, match=message):
            interconnect.collective_seconds(cfg, *bad)


def run_ranks(tmp_path: Path, world: int = 2) -> list[dict]:
    env = {**os.environ, "TORCH_SPYRE_NUM_CARDS": str(world), "PYTHONPATH": str(ROOT)}
    init = tmp_path / "init"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.device.collective_rank", str(r), str(world), str(init)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


@pytest.mark.slow
def test_two_cards_get_correct_values_and_the_link_time(tmp_path):
    r0, r1 = run_ranks(tmp_path)
    v0, v1 = rank_values(0).float(), rank_values(1).float()
    # Values: every collective as torch computes it on the CPU (these sums are exact in DLFloat16).
    for r in (r0, r1):
        assert torch.tensor(r["all_reduce"]).equal(v0 + v1)
        assert torch.tensor(r["all_gather"]).equal(torch.cat([v0[:2], v1[:2]], dim=0))
        assert torch.tensor(r["broadcast"]).equal(v1[:2])
    assert torch.tensor(r0["gather"]).equal(torch.cat([v0[:2], v1[:2]], dim=1)) and r1["gather"] is None
    s = v0[:4] + v1[:4]
    assert torch.tensor(r0["reduce_scatter"]).equal(s[:2]) and torch.tensor(r1["reduce_scatter"]).equal(s[2:])

    # Time: the all-reduce of ROWS x COLS fp16 (ROWS sticks of 128 bytes) starts when the later card is ready and
    # lasts the ring all-reduce's 2 (n-1) steps of B/n bytes over the PCIe peer-to-peer link, on both cards.
    cfg = load_config({})
    nbytes = ROWS * COLS * 2
    expected = 2 * (cfg.p2p_latency_s + nbytes / 2 / cfg.p2p_bandwidth)
    assert r1["ready"] > r0["ready"]  # card 1 copied 8 MiB more first
    ar0, ar1 = r0["records"][0], r1["records"][0]
    for rec, card in ((ar0, 0), (ar1, 1)):
        assert (rec["name"], rec["card"], rec["bytes"], rec["cards"]) == ("all_reduce", card, nbytes, 2)
        assert rec["start"] == r1["ready"]
        assert rec["end"] - rec["start"] == pytest.approx(expected, rel=1e-12)
    assert ar0["end"] == ar1["end"]
    # Every later collective on both cards starts and ends together, in issue order.
    names = [rec["name"] for rec in r0["records"]]
    assert names == ["all_reduce", "all_gather", "gather", "reduce_scatter", "broadcast"]
    for a, b in zip(r0["records"], r1["records"]):
        assert a["end"] == b["end"] and a["name"] == b["name"]

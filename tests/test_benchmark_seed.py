"""benchmarks/seed.py, the seed's table, on tiny shapes: every row there, measured (not remembered)."""

from __future__ import annotations

import json

import pytest

from benchmarks import seed


def test_the_matmul_rows_measure_off_and_on():
    from torch_spyre.card import CardConfig

    cfg = CardConfig()
    tiling = seed.matmul_switch_row("matmul_tiling", "x", seed.TINY.tiling, cfg, "")
    sharing = seed.matmul_switch_row("ring_sharing", "x", seed.TINY.sharing, cfg, "")
    corelets = seed.corelets_row(seed.TINY.corelets, cfg)
    for row in (tiling, sharing, corelets):
        (m,) = row.measurements
        assert m.on_us < m.off_us, row  # each one pays on these shapes
    assert tiling.measurements[0].on_us == corelets.measurements[0].on_us  # the same default program


@pytest.mark.slow
def test_the_tiny_table_prints_every_row_as_markdown_and_json(capsys):
    assert seed.main(["--tiny", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["optimization"] for r in rows] == ["matmul_tiling", "scratchpad_planning", "fused_mlp",
                                                 "onchip_relayout", "corelets", "ring_sharing"]
    for r in rows:
        assert r["seed"]
        if r["status"] == "built":
            assert r["measurements"] and all(m["off_us"] > 0 and m["on_us"] > 0 for m in r["measurements"])
    planning = rows[1]["measurements"][0]
    assert planning["on_us"] < planning["off_us"]
    (mlp,) = rows[2]["measurements"]
    assert rows[2]["status"] == "built" and mlp["on_us"] < mlp["off_us"] and "-> 1 kernels)" in mlp["workload"]
    (relayout,) = rows[3]["measurements"]
    assert rows[3]["status"] == "built" and relayout["on_us"] < relayout["off_us"] and "ring" in relayout["workload"]
    text = seed.markdown(seed.table(seed.TINY))
    assert text.count("\n") == 7 and "not built" not in text and "all-to-all" in text and "SwiGLU" in text


@pytest.mark.slow
@pytest.mark.parametrize("off", [(), ("ring_sharing",), ("matmul_tiling",)])
def test_the_matmul_rows_time_what_a_timing_only_launch_takes(off):
    """seed.py builds the matmul program and times it on the card model; an eager ``a @ b`` on spyre in
    timing-only mode, with the same switches, takes exactly that simulated time."""
    import torch

    import torch_spyre
    import torch_spyre.profiler
    from torch_spyre.card import CardConfig
    from torch_spyre.compiler import optimizations

    M, K, N = seed.TINY.sharing[0]
    with torch_spyre.timing_only(), optimizations.disabled(*off):
        a = torch.empty(M, K, dtype=torch.float16, device="spyre")
        b = torch.empty(K, N, dtype=torch.float16, device="spyre")
        a @ b
        with torch_spyre.profiler.profile() as prof:
            a @ b
    (kernel,) = [e for e in prof.key_averages() if e.kind == "kernel" and e.key.startswith("spyre_mm")]
    assert kernel.device_time * 1e6 == pytest.approx(seed.matmul_us((M, K, N), CardConfig(), off), rel=1e-9)

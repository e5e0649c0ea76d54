"""Card latency of serving, in simulated time: TTFT, TPOT and card utilization per batch size.

    python benchmarks/serving_sim_latency.py       # --new-tokens N --batches 1,2,4 --tp 1
    TORCH_SPYRE_NUM_CARDS=2 python benchmarks/serving_sim_latency.py --tp 2    # over two cards

`vllm.LLM` on spyre in this process (the tests' tiny random Llama, tests/serving/tiny_models.py), read
through the simulated-time series the model runner records (docs/serving.md, "Simulated-time metrics"):
for each batch size, B prompts are generated together and the differences of the series over that
generate give the mean TTFT, the mean TPOT, and busy / step time. Simulated time is deterministic: the
figures do not depend on the machine or its load. ``--tp N`` runs vLLM's tensor parallelism over N simulated
cards (one worker process per card; the series are recorded in TP rank 0's worker, so they are read through
prometheus_client's multiprocess directory) and adds the card-to-card collective time per step.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[1, 5, 9, 33, 70, 2], [3, 4, 200, 17], [250, 12, 12, 99, 7, 8], [40, 41, 42, 43, 44]]


def series(model_name: str, metrics_dir: str) -> dict[str, float]:
    """Every process's series of the model (the engine's and, with --tp, the workers')."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from torch_spyre.serving import sim_metrics as sm

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=metrics_dir)
    labels = {"model_name": model_name, "engine": "0"}
    names = {"ttft_n": sm.TTFT + "_count", "ttft_s": sm.TTFT + "_sum", "tpot_n": sm.TPOT + "_count",
             "tpot_s": sm.TPOT + "_sum", "busy": sm.BUSY + "_total", "steps": sm.STEPS + "_total",
             "link": sm.LINK + "_total"}
    return {k: registry.get_sample_value(n, labels) or 0.0 for k, n in names.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--batches", default="1,2,4", help="batch sizes, at most 4 (the prompts)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (needs TORCH_SPYRE_NUM_CARDS >= it)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if not all(1 <= b <= len(PROMPTS) for b in batches):
        sys.exit(f"--batches: each batch size must be 1..{len(PROMPTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        metrics_dir = Path(tmp) / "metrics"
        metrics_dir.mkdir()
        os.environ.update(TORCH_SPYRE_VLLM="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1",
                          TRANSFORMERS_OFFLINE="1", VLLM_CACHE_ROOT=str(Path(tmp) / "cache"),
                          PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))  # before prometheus_client is imported
        if args.tp > 1:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i % os.cpu_count()) for i in range(args.tp)))
        sys.path.insert(0, str(ROOT))
        from tests.serving import tiny_models
        from vllm import LLM, SamplingParams

        model = Path(tmp) / "llama"
        tiny_models.build("llama", model)
        llm = LLM(model=str(model), skip_tokenizer_init=True, dtype="float16", max_model_len=128,
                  max_num_seqs=max(batches), kv_cache_memory_bytes=1 << 22, seed=0, tensor_parallel_size=args.tp)
        params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, detokenize=False, ignore_eos=True)
        print(f"tiny Llama, {args.new_tokens} new tokens per request, TP={args.tp}, simulated card time")
        print(f"{'batch':>5} {'TTFT ms':>9} {'TPOT ms':>9} {'tokens/s':>9} {'busy ms':>9} {'step ms':>9} {'util':>6} "
              f"{'link ms':>9}")
        for b in batches:
            before = series(str(model), str(metrics_dir))
            llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:b]], params, use_tqdm=False)
            d = {k: v - before[k] for k, v in series(str(model), str(metrics_dir)).items()}
            tokens = d["ttft_n"] + d["tpot_n"]
            print(f"{b:>5} {d['ttft_s'] / d['ttft_n'] * 1e3:>9.3f} {d['tpot_s'] / d['tpot_n'] * 1e3:>9.3f} "
                  f"{tokens / d['steps']:>9.0f} {d['busy'] * 1e3:>9.3f} {d['steps'] * 1e3:>9.3f} "
                  f"{d['busy'] / d['steps']:>6.3f} {d['link'] * 1e3:>9.3f}")
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()

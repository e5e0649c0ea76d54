"""The tensor-parallel test's own process: ``python -m tests.serving.tp_run MODEL_DIR METRICS_DIR``.

Runs ``vllm.LLM`` on the card with TP=1 (in this process) and then TP=2 (two vLLM worker processes, one card
each), and prints one JSON line: each run's greedy tokens and its simulated-time series. Its own process
because the card count (``TORCH_SPYRE_NUM_CARDS=2``) is read once per process, and so that prometheus_client
starts in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``): the TP=2 series are recorded in a worker process.
"""

from __future__ import annotations

import gc
import json
import sys

PROMPTS = [[1, 5, 9, 33, 70, 2], [3, 4, 200, 17]]
NEW_TOKENS = 4


def generate(model_dir: str, tp: int) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, served_model_name=f"tp{tp}", skip_tokenizer_init=True, dtype="float16",
              max_model_len=128, max_num_seqs=4, kv_cache_memory_bytes=1 << 22, seed=0, tensor_parallel_size=tp)
    try:
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, detokenize=False, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def series(metrics_dir: str) -> dict[str, dict[str, float]]:
    """Every process's spyre: samples, by served model name."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=metrics_dir)
    out: dict[str, dict[str, float]] = {}
    for metric in registry.collect():
        for s in metric.samples:
            if s.name.startswith("spyre:") and "le" not in s.labels:
                out.setdefault(s.labels["model_name"], {})[s.name] = s.value
    return out


def main(model_dir: str, metrics_dir: str) -> None:
    tokens = {tp: generate(model_dir, tp) for tp in (1, 2)}
    print(json.dumps({"tokens": {str(k): v for k, v in tokens.items()}, "series": series(metrics_dir)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

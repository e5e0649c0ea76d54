"""Decode host time of vLLM on spyre vs the same vLLM run on the CPU (issue 10's target: at most 20x).

    python benchmarks/serving_decode.py            # --new-tokens N --batch B

Each platform runs in its own process (vLLM picks its platform once per process): a tiny random Llama
(tests/serving/tiny_models.py's shape with hidden size 128, head size 32), `vllm.LLM` in one process, `enforce_eager` on both sides (the spyre
platform runs the model op by op anyway). A warm-up generate at the same shapes first (program
generation on spyre), then a prefill-only generate (1 token) and a full one (1 + N tokens) are timed;
decode time per step = (full - prefill-only) / N. Host wall time (perf_counter), medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(platform: str, model: str, new_tokens: int, batch: int, repeat: int) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float16", max_model_len=128, max_num_seqs=max(batch, 1),
              kv_cache_memory_bytes=1 << 22, enforce_eager=True, seed=0)
    prompts = [{"prompt_token_ids": [1 + i, 5, 9, 33, 70, 2, 11, 12]} for i in range(batch)]

    def gen(n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0.0, detokenize=False, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    gen(1 + new_tokens)  # warm-up: every program of these shapes generated
    prefill = [gen(1) for _ in range(repeat)]
    full = [gen(1 + new_tokens) for _ in range(repeat)]
    step = (statistics.median(full) - statistics.median(prefill)) / new_tokens
    return {"platform": platform, "prefill_s": statistics.median(prefill), "full_s": statistics.median(full),
            "decode_step_s": step}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", choices=["cpu", "spyre"])
    ap.add_argument("--model")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.model, args.new_tokens, args.batch, args.repeat)))
        return
    sys.path.insert(0, str(ROOT))
    from tests.serving import tiny_models

    results = {}
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        # head size 32: vLLM's CPU attention kernels take no smaller head (the tests' models use 16)
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**{**tiny_models.COMMON, "hidden_size": 128})
        transformers.AutoModelForCausalLM.from_config(cfg).half().save_pretrained(tmp)
        for platform in ("cpu", "spyre"):
            env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1",
                       VLLM_CACHE_ROOT=str(Path(tmp) / "cache"), TORCH_SPYRE_VLLM="1" if platform == "spyre" else "0")
            out = subprocess.run([sys.executable, __file__, "--child", platform, "--model", tmp, "--new-tokens",
                                  str(args.new_tokens), "--batch", str(args.batch), "--repeat", str(args.repeat)],
                                 env=env, capture_output=True, text=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if out.returncode or not line:
                sys.exit(f"{platform} run failed:\n{out.stderr[-3000:]}")
            results[platform] = json.loads(line[0][7:])
    print(f"tiny Llama, batch {args.batch}, {args.new_tokens} decode steps, medians of {args.repeat}")
    print(f"{'platform':>8} {'prefill-only s':>15} {'decode step ms':>15}")
    for p, r in results.items():
        print(f"{p:>8} {r['prefill_s']:>15.3f} {r['decode_step_s'] * 1e3:>15.1f}")
    print(f"decode step spyre / cpu: {results['spyre']['decode_step_s'] / results['cpu']['decode_step_s']:.1f}x")


if __name__ == "__main__":
    main()

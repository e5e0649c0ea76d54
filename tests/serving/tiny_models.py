"""Tiny random decoders (Llama-, Qwen3- and Granite-shaped) written to a directory as vLLM and HF load them.

All three share one attention geometry (4 query heads, 2 KV heads, head size 16: GQA) so the card programs
generated for one are reused by the others in the same process; they differ where the architectures do
(Qwen3's q/k norms, Granite's multipliers). A byte-level BPE tokenizer trained offline on local text with
the ``tokenizers`` package is saved next to the weights, with a chat template: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
              initializer_range=0.2)  # wide enough that greedy picks are not near-ties
KINDS = ("llama", "qwen3", "granite")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def config(kind: str):
    import transformers

    if kind == "llama":
        return transformers.LlamaConfig(**COMMON)
    if kind == "qwen3":
        return transformers.Qwen3Config(**COMMON, head_dim=16, use_sliding_window=False)
    if kind == "granite":
        return transformers.GraniteConfig(**COMMON, embedding_multiplier=2.0, residual_multiplier=0.5,
                                          attention_multiplier=0.25, logits_scaling=2.0)
    raise ValueError(f"unknown tiny model kind {kind!r}; one of {KINDS}")


# Seeds whose models give the test prompts decisive greedy steps (no near-tie in the first 3 tokens; found
# by trying seeds on the CPU reference): random tiny models otherwise tie often, see assert_greedy_matches.
SEEDS = {"llama": 17, "qwen3": 0, "granite": 25}


def build(kind: str, path: Path, seed: int | None = None):
    """Write a random fp16 ``kind`` model (and the tokenizer) to ``path``; return the HF model (fp16, CPU)."""
    import transformers

    torch.manual_seed(SEEDS[kind] if seed is None else seed)
    model = transformers.AutoModelForCausalLM.from_config(config(kind)).half().eval()
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    save_tokenizer(path, COMMON["vocab_size"])
    return model


TEXT = """The simulated Spyre card executes programs over 128-byte sticks on 32 cores connected by a ring.
Each core has a scratchpad, and the card keeps fp16 values as DLFloat16 in its LPDDR5 memory.
vLLM schedules requests, keeps a paged KV cache and samples tokens; the model runs on the card.
Hello, how are you today? Tell me a story about a small accelerator that learned to serve language models.
"""


def save_tokenizer(path: Path, vocab_size: int) -> None:
    """A byte-level BPE of ``vocab_size`` tokens trained on TEXT, saved as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


NEAR_TIE = 0.05  # logits this close in the float32 reference may swap under fp16/DLFloat16 arithmetic


class Reference(list):
    """HF's greedy tokens; ``.runner_up`` and ``.gaps``: the second-best token and the top-two logit gap at
    each step."""


def hf_greedy(model, prompt: list[int], new_tokens: int) -> Reference:
    """HF's greedy continuation on the CPU, computed in float32 from the fp16 weights (the reference)."""
    with torch.no_grad():
        out = model.float().generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                     eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    ref = Reference(out.sequences[0, len(prompt):].tolist())
    top2 = [step[0].float().topk(2) for step in out.logits]
    ref.runner_up = [int(t.indices[1]) for t in top2]
    ref.gaps = [float(t.values[0] - t.values[1]) for t in top2]
    return ref


def assert_greedy_matches(got: list[int], ref: Reference, min_compared: int = 3) -> None:
    """``got`` equals HF's greedy tokens up to the first near-tie of the reference (top two logits within
    NEAR_TIE), where either of the two is accepted and comparison stops (the continuations differ from
    there on by construction). At least ``min_compared`` tokens must be compared, so a reference full of
    ties cannot make the check empty."""
    tie = next((i for i, gap in enumerate(ref.gaps) if gap < NEAR_TIE), len(ref))
    assert tie >= min_compared, f"the reference ties at step {tie}: pick other prompts or another seed"
    assert len(got) == len(ref), (got, list(ref))
    assert got[:tie] == ref[:tie], (got, list(ref))
    if tie < len(ref):
        assert got[tie] in (ref[tie], ref.runner_up[tie]), (got, list(ref), tie)

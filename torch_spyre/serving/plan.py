"""The host-side plan of one engine step's attention, built once and shared by every layer.

The step's sequences are grouped (all decode sequences in one group, each prefill chunk alone), each
group is padded to its bucket (``buckets.py``), and the device tensors a layer needs are built: the query
rows to gather, the block indices, the additive mask (causal rule, sequence lengths and padding as data)
and the rows to keep; plus the runs of the KV-cache writes. Needs no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import buckets
from .device import card_device
from .paged_attention import slot_runs


@dataclass
class AttentionGroup:
    """One padded attention call: ``batch`` sequences of ``queries`` query rows over ``blocks`` blocks."""

    batch: int
    queries: int
    blocks: int
    query_rows: torch.Tensor  # [batch*queries] token index of each padded query row (spyre, int64)
    block_idx: torch.Tensor  # [batch*blocks] KV block of each padded block slot (spyre, int64)
    mask: torch.Tensor  # [batch, queries, blocks*block_size] float32, 0 or -inf (spyre)
    keep: torch.Tensor  # rows of the [batch*queries] result that are real tokens (spyre, int64)


@dataclass
class SpyreAttentionMetadata:
    num_actual_tokens: int
    groups: list[AttentionGroup]
    order: torch.Tensor | None  # token order of the groups' kept rows -> step order (spyre), None if identity
    kv_runs: list[tuple[int, int, int]]  # (first token, first flat slot, length) of the KV-cache writes


def plan_step(query_start_loc: list[int], seq_lens: list[int], block_table: torch.Tensor, slot_mapping: torch.Tensor,
              num_tokens: int, block_size: int) -> SpyreAttentionMetadata:
    """Host-side plan of one step's attention (see the module docstring); tensors end on the card."""
    num_reqs = len(seq_lens)
    decode = [i for i in range(num_reqs) if query_start_loc[i + 1] - query_start_loc[i] == 1]
    prefill = [i for i in range(num_reqs) if query_start_loc[i + 1] - query_start_loc[i] > 1]
    groups, kept_tokens = [], []
    for members in ([decode] if decode else []) + [[i] for i in prefill]:
        qlens = [query_start_loc[i + 1] - query_start_loc[i] for i in members]
        nq = buckets.query_bucket(max(qlens))
        nb = buckets.block_bucket(max(-(-seq_lens[i] // block_size) for i in members))
        b = buckets.batch_bucket(len(members)) if nq == 1 else 1
        rows = torch.zeros(b, nq, dtype=torch.int64)
        blocks = torch.zeros(b, nb, dtype=torch.int64)  # padding reads block 0 (vLLM's null block), masked
        mask = torch.full((b, nq, nb * block_size), float("-inf"))
        mask[:, :, 0] = 0.0  # padded query rows see one key, so their softmax stays finite
        keep = []
        for slot, (i, qlen) in enumerate(zip(members, qlens)):
            start, seq = query_start_loc[i], seq_lens[i]
            context = seq - qlen
            rows[slot, :qlen] = torch.arange(start, start + qlen)
            rows[slot, qlen:] = start
            used = -(-seq // block_size)
            blocks[slot, :used] = block_table[i, :used]
            keys = torch.arange(nb * block_size)
            mask[slot, :qlen] = torch.where(keys[None, :] <= context + torch.arange(qlen)[:, None], 0.0, float("-inf"))
            keep.extend(range(slot * nq, slot * nq + qlen))
            kept_tokens.extend(range(start, start + qlen))
        dev = card_device()
        groups.append(AttentionGroup(b, nq, nb, rows.reshape(-1).to(dev), blocks.reshape(-1).to(dev), mask.to(dev),
                                     torch.tensor(keep, dtype=torch.int64).to(dev)))
    identity = kept_tokens == list(range(len(kept_tokens)))
    order = None if identity else torch.argsort(torch.tensor(kept_tokens)).to(card_device())
    slots = slot_mapping[:num_tokens].tolist()
    if any(s < 0 for s in slots):
        raise RuntimeError(f"a scheduled token has no KV slot (slot_mapping {slots})")
    return SpyreAttentionMetadata(num_tokens, groups, order, slot_runs(slots))



"""Paged attention in plain torch ops, compiled for the card by torch_spyre's own ``torch.compile`` backend.

The KV cache of one layer is one spyre tensor ``[2, num_blocks, block_size, num_kv_heads, head_size]``
(K then V; a block's tokens are contiguous, so gathering a block is one row of ``index_select``).

One call serves a group of sequences padded to the same shape: ``q [B, Q, H, D]`` (Q query tokens per
sequence), ``block_idx [B * K]`` (K blocks per sequence, from the block table) and an additive mask
``[B, Q, K * block_size]`` built on the host (0 where a query may see a key, -inf elsewhere), so the
causal rule, the sequence lengths and the padding are data, not shapes. GQA shares each KV head with
``H // KVH`` query heads by folding them into the query rows of one batched matmul; no KV copy.

Shapes are padded to buckets (``buckets.py``) so a server compiles a bounded set of programs.
"""

from __future__ import annotations

import torch


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_idx: torch.Tensor, mask: torch.Tensor,
                    scale: torch.Tensor | float) -> torch.Tensor:
    """Attention of ``q [B, Q, H, D]`` over the blocks ``block_idx [B*K]`` of ``kv_cache``; returns
    ``[B, Q, H * D]`` in q's dtype. ``mask [B, Q, K*block_size]`` (float32) is added to the scores;
    ``scale`` is a float32 0-d tensor when compiled (a Python float would become a symbolic float64)."""
    b, nq, h, d = q.shape
    _, _, block_size, kvh, _ = kv_cache.shape
    g = h // kvh
    length = mask.shape[-1]
    k = kv_cache[0].index_select(0, block_idx).reshape(b, length, kvh, d).permute(0, 2, 3, 1)  # B,KVH,D,L
    v = kv_cache[1].index_select(0, block_idx).reshape(b, length, kvh, d).permute(0, 2, 1, 3)  # B,KVH,L,D
    # Query rows of one KV head: its G query heads times the Q tokens.
    qh = q.reshape(b, nq, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * nq, d)
    scores = torch.matmul(qh, k).float() * scale  # B,KVH,G*Q,L
    scores = scores.reshape(b, kvh, g, nq, length) + mask.reshape(b, 1, 1, nq, length)
    probs = torch.softmax(scores, dim=-1).to(q.dtype).reshape(b, kvh, g * nq, length)
    out = torch.matmul(probs, v)  # B,KVH,G*Q,D
    return out.reshape(b, kvh, g, nq, d).permute(0, 3, 1, 2, 4).reshape(b, nq, h * d)


def slot_runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """``(first token, first slot, length)`` of each run of consecutive slots: a prefill chunk fills whole
    blocks in order, so its tokens take one copy per block touched, a decode token one copy."""
    runs: list[tuple[int, int, int]] = []
    for token, slot in enumerate(slots):
        if runs and runs[-1][1] + runs[-1][2] == slot and runs[-1][0] + runs[-1][2] == token:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((token, slot, 1))
    return runs


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             runs: list[tuple[int, int, int]]) -> None:
    """Store ``key``/``value [T, KVH, D]`` in ``kv_cache`` at the flat token slots (block * block_size +
    offset) given as ``slot_runs``, in place: one device-to-device copy per run and tensor (the card has
    no scatter lowering; a host ``index_copy_`` would move the whole cache)."""
    _, num_blocks, block_size, kvh, d = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, kvh, d)
    for token, slot, length in runs:
        flat[0, slot:slot + length].copy_(key[token:token + length])
        flat[1, slot:slot + length].copy_(value[token:token + length])

"""The padded shapes paged attention runs at, so a server generates a bounded set of card programs.

Every attention call is padded up to a bucket (docs/serving.md, "Buckets"):

- query tokens per sequence: 1 for a decode step, else the next power of two from ``MIN_QUERY``
  (16, 32, 64, ...; a prefill chunk of 100 tokens runs as 128);
- KV blocks per sequence: the next power of two (1, 2, 4, ...), at most the blocks of max_model_len;
- sequences per decode group: the next power of two (1, 2, 4, ...), at most max_num_seqs' bucket.

A server with max_model_len 2048, block size 64 and 4 sequences therefore sees at most 6 block counts x
(8 prefill query buckets + 3 decode batch buckets) shapes per head geometry.
"""

from __future__ import annotations

MIN_QUERY = 16


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"a bucket needs a positive length, got {n}")
    return 1 << (n - 1).bit_length()


def query_bucket(n: int) -> int:
    """Padded query length for ``n`` new tokens of one sequence: 1 (decode) or a power of two >= MIN_QUERY."""
    return 1 if n == 1 else max(MIN_QUERY, next_pow2(n))


def block_bucket(n: int) -> int:
    """Padded number of KV blocks for a sequence that spans ``n`` blocks."""
    return next_pow2(n)


def batch_bucket(n: int) -> int:
    """Padded number of sequences in a decode group of ``n``."""
    return next_pow2(n)

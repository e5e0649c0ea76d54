"""benchmarks/host_speed.py's other batches of the default sentences: each call of a timed row a new input
with the same shapes (the same cached programs)."""

from __future__ import annotations

import pytest

from benchmarks.host_speed import cycling, sentence_batches
from torch_spyre.jobs import embed as job


def test_batches_hold_no_sentence_twice_and_tokenize_alike():
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(job.model_path()))
    batches = sentence_batches()
    sentences = [s for b in batches for s in b]
    assert len(batches) == 6 and all(len(b) == 8 for b in batches) and len(set(sentences)) == len(sentences)
    lengths = {tuple(len(ids) for ids in tokenizer(b)["input_ids"]) for b in batches}
    assert len(lengths) == 1  # sentence i has the same number of tokens in every batch
    assert batches[0][:6] == list(job.DEFAULT_SENTENCES)  # batch 0 swaps nothing in its first six
    assert all(len(set(b)) == 10 for b in sentence_batches(count=6, size=10))


@pytest.mark.parametrize("count, size", [(0, 8), (7, 8), (6, 11)])
def test_more_batches_than_the_swaps_make_is_a_clear_error(count, size):
    with pytest.raises(ValueError, match="1 to 6 batches of 1 to 10 sentences"):
        sentence_batches(count, size)


def test_cycling_goes_round():
    nxt = cycling([1, 2, 3])
    assert [nxt() for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]

"""Token-budget micro-batches (flowrl.engines.train.token_batching): partitions checked by hand."""

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.train.token_batching import budget_micro_batches, karmarkar_karp, token_micro_batches


def sums(lengths, parts):
    return [sum(lengths[i] for i in part) for part in parts]


def test_karmarkar_karp_by_hand():
    # 2 ways: differences 8-7=1, 6-5=1, then {4, 1, 1}: 4-1=3, 3-1=2, so the spread is 2 (the optimum is 15/15)
    assert karmarkar_karp([8, 7, 6, 5, 4], 2) == [[1, 3, 4], [0, 2]]
    # 3 ways over 30: the best largest part is 11 ({7, 4}, {6, 5}, {8})
    lengths = [4, 5, 6, 7, 8]
    parts = karmarkar_karp(lengths, 3)
    assert sorted(sums(lengths, parts)) == [8, 11, 11]
    assert sorted(i for part in parts for i in part) == [0, 1, 2, 3, 4]  # every row once
    assert karmarkar_karp([3], 2) == [[0], []]


def test_karmarkar_karp_equal_sizes_by_hand():
    # starts 8 | 7, 6 | 5, 4 | 3 (spread 1 each); 8+5 | 7+6 (spread 0); then 7+6+4 | 8+5+3: 17 and 16, 3 each
    assert karmarkar_karp([8, 7, 6, 5, 4, 3], 2, equal_size=True) == [[1, 2, 4], [0, 3, 5]]
    # 3 parts of 2: starts 10 | 3 | 3 and 3 | 1 | 1 merge to 10+1 | 3+3 | 3+1; 11 is the least 10's part can hold
    lengths = [10, 1, 1, 3, 3, 3]
    parts = karmarkar_karp(lengths, 3, equal_size=True)
    assert [len(part) for part in parts] == [2, 2, 2] and sorted(sums(lengths, parts)) == [4, 6, 11]
    assert karmarkar_karp([], 2, equal_size=True) == [[], []]
    with pytest.raises(ValueError, match="5 items do not split into 2 parts of equal size"):
        karmarkar_karp([1, 2, 3, 4, 5], 2, equal_size=True)


def test_packed_micro_batches_fit_the_budget_balanced():
    lengths = [10, 1, 1, 1, 9, 2]  # 24 tokens, budget 12: two micro-batches of 12
    parts = token_micro_batches(lengths, 12, packed=True)
    assert parts == [[1, 4, 5], [0, 2, 3]] and sums(lengths, parts) == [12, 12]
    # a row over the budget runs alone; ceil(32 / 12) = 3 micro-batches
    assert token_micro_batches([30, 1, 1], 12, packed=True) == [[0], [1], [2]]
    # an agreed count (another rank needs 3): exactly 3, largest 10 (the least possible): [10], [9], [1, 1, 1, 2]
    assert sorted(sums(lengths, token_micro_batches(lengths, 12, packed=True, num_micro_batches=3))) == [5, 9, 10]


def test_padded_micro_batches_count_rows_times_the_longest():
    lengths = [10, 1, 1, 1, 9, 2]
    # longest first: 10 alone (2 x 10 > 12), 9 alone, then 2, 1, 1, 1: 4 rows x 2 = 8 <= 12
    assert token_micro_batches(lengths, 12, packed=False) == [[0], [4], [5, 1, 2, 3]]
    # exactly 4: the micro-batch of most rows is halved
    assert token_micro_batches(lengths, 12, packed=False, num_micro_batches=4) == [[0], [4], [5, 1], [2, 3]]
    assert token_micro_batches(lengths, 100, packed=False) == [[0, 4, 5, 1, 2, 3]]


def test_bad_budget_and_empty_batch():
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        token_micro_batches([1, 2], 0, packed=True)
    assert token_micro_batches([], 8, packed=False) == []


def test_every_rank_runs_the_agreed_count():
    """Under FSDP every rank runs as many micro-batches as the rank that needs most (`agree`: the all-reduce)."""
    prompt_mask = torch.ones(4, 2, dtype=torch.long)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    batch = TensorDict(prompt_mask=prompt_mask, response_mask=response_mask, batch_size=[4])  # lengths 6, 3, 4, 3
    alone = budget_micro_batches(batch, 8, packed=True)
    # ceil(16 / 8) = 2 parts are 6+3 = 9 > 8 and 4+3: three, 6 | 3+3 | 4
    assert [g.tolist() for g in alone] == [[0], [1, 3], [2]]
    agreed = budget_micro_batches(batch, 8, packed=True, agree=lambda count: count + 1)
    assert len(agreed) == 4 and sorted(torch.cat(agreed).tolist()) == [0, 1, 2, 3]

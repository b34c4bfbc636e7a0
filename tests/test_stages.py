"""Stages run eagerly on small batches: the fields they read and write."""

import torch
from tensordict import TensorDict

from flowrl.rl import stages
from flowrl.data.batch import repeat_rows


def test_remax_baseline_rides_along_as_rows_repeat():
    greedy = TensorDict({"uid": torch.tensor([7, 8]), "scores": torch.tensor([1.0, 0.0])}, batch_size=[2])
    greedy = stages.keep_as_baseline(greedy)
    # a later generate(n=2) repeats rows; the sampled rows are then scored afresh
    sampled = repeat_rows(greedy, 2)
    sampled["scores"] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    sampled["response_mask"] = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
    assert sampled["baseline_scores"].tolist() == [1.0, 1.0, 0.0, 0.0]
    out = stages.remax_advantage(sampled)
    # advantage = score - its prompt's greedy score: [0, -1, 1, 0] on valid tokens; returns = score
    assert out["advantages"].tolist() == [[0, 0], [-1, 0], [1, 1], [0, 0]]
    assert out["returns"].tolist() == [[1, 1], [0, 0], [1, 1], [0, 0]]


def test_keep_as_baseline_copies():
    batch = TensorDict({"scores": torch.tensor([1.0, 2.0])}, batch_size=[2])
    batch = stages.keep_as_baseline(batch)
    batch["scores"] += 1
    assert batch["baseline_scores"].tolist() == [1.0, 2.0]

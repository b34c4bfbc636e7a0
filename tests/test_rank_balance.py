"""train.balance_batch (flowrl.engines.train.rank_balance): rows moved between a pool's ranks so each holds as many rows
and near-equal tokens. Partitions checked by hand; two gloo ranks on CPU, one holding every long row, train the
actor with and without it: the tokens even out, and outputs and final weights are the same."""

import pathlib
import warnings

import pytest
import torch
import torch.distributed as dist

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl import metrics
from flowrl.config import load_run_config, warn_no_effect
from flowrl.engines.models.folders import load_causal_lm
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train.rank_balance import balanced_shares, exchange, max_over_mean
from flowrl.roles.actor import Actor
from flowrl.roles.context import UpdateSettings
from test_engine_fsdp2 import WORLD, assert_states_close, make_batch, spawn_and_join

RATIO = "train/balance_tokens_max_over_mean"


def test_balanced_shares_by_hand():
    # two ranks of 4 rows (30 and 5 tokens), groups of 2 rows (an update's mini-batches of 2 a rank):
    # group 0 holds 9, 8 | 1, 1: starts {9 | 8} and {1 | 1} merge to 9+1 | 8+1;
    # group 1 holds 7, 6 | 2, 1: starts {7 | 6} and {2 | 1} merge to 7+1 | 6+2
    lengths = [[9, 8, 7, 6], [1, 1, 2, 1]]
    shares = balanced_shares(lengths, 2)
    assert shares == [[(0, 0), (1, 1), (0, 2), (1, 3)], [(0, 1), (1, 0), (0, 3), (1, 2)]]  # 2 rows of each group
    assert [sum(lengths[rank][row] for rank, row in share) for share in shares] == [18, 17]
    assert max_over_mean([30, 5]) == 30 / 17.5 and max_over_mean([18, 17]) == 18 / 17.5
    # one group of every row (a forward pass): starts 9 | 8, 7 | 6, 2 | 1, 1 | 1 -> 9+6 | 8+7 -> 8+7+2 | 9+6+1
    # -> 8+7+2+1 | 9+6+1+1
    whole = balanced_shares(lengths, 4)
    assert whole == [[(0, 1), (0, 2), (1, 2), (1, 3)], [(0, 0), (0, 3), (1, 0), (1, 1)]]
    # a part goes to the rank that holds most of its rows: one row a rank stays where it is
    assert balanced_shares([[3], [5], [4]], 1) == [[(0, 0)], [(1, 0)], [(2, 0)]]


def long_tailed_rows(rank):
    """Rank 0: 8 rows of 14 to 28 tokens; rank 1: 8 rows of 2 to 5 (ids below the tiny model's vocabulary)."""
    gen = torch.Generator().manual_seed(rank)
    rows = []
    for i in range(8):
        prompt_len = 2 + i % 3
        response_len = (12 + 2 * i) if rank == 0 else 1 + i % 2
        ids = torch.randint(1, 15, (prompt_len + response_len,), generator=gen).tolist()
        rows.append((ids[:prompt_len], ids[prompt_len:]))
    return rows


class AdvantageNLL:
    """Token-mean NLL weighted by each row's advantage: a row's fields must travel with it."""

    reads = ("response_mask", "advantages")
    needs = ("logprobs",)
    combine = "mean"

    def __call__(self, out, mb):
        mask = mb["response_mask"].float()
        loss = -(out["logprobs"] * mask * mb["advantages"][:, None]).sum() / mask.sum()
        return loss, {"loss": loss.detach()}

    def weight(self, mb):
        return float(mb["response_mask"].sum())


def run(model_path, rank, balance):
    batch = make_batch(long_tailed_rows(rank))
    batch["advantages"] = torch.linspace(-1.0, 1.0, 8) + rank
    engine = HFTrainEngine(load_causal_lm(model_path), HFTrainConfig(lr=1.0, grad_clip=1e9), kind="actor", eps=1.0)
    # 8 rows a rank: 2 optimizer steps of 4 rows, micro-batches of 2
    actor = Actor(engine, UpdateSettings(mini_batch_size=4, micro_batch_size=2, balance_batch=balance))
    with metrics.collect() as logged:
        with metrics.node("actor.logprobs"):
            logprobs = actor.logprobs(batch.copy())["old_logprobs"]
        with metrics.node("actor.update"):
            actor.update(batch, loss=AdvantageNLL())
    return dict(logprobs=logprobs, logged=logged, state=engine.full_state_dict())


def _worker(rank, world, model_path, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir / 'rendezvous'}", rank=rank, world_size=world)
    try:
        even = make_batch([([1, 2], [3] * (1 + (rank + i) % 2)) for i in range(4)])  # 14 tokens on each rank
        with metrics.collect() as logged:
            assert exchange(even, 4) is None  # no better balance: no row moves
        assert logged == {RATIO: 1.0, f"{RATIO}_before": 1.0}
        torch.save({balance: run(model_path, rank, balance) for balance in (False, True)}, out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_balanced_ranks_even_their_tokens_and_train_the_same(tiny_model_path, tmp_path: pathlib.Path):
    spawn_and_join(_worker, args=(WORLD, tiny_model_path, tmp_path), timeout_s=180)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]
    lengths = [sum(len(p) + len(r) for p, r in long_tailed_rows(rank)) for rank in range(WORLD)]
    for result in ranks:
        plain, balanced = result[False], result[True]
        assert RATIO not in plain["logged"]  # off: nothing is logged, nothing moves
        forward, update = balanced["logged"][RATIO], balanced["logged"][f"{RATIO}#2"]
        assert balanced["logged"][f"{RATIO}_before"] == max_over_mean(lengths)  # what the plain split gives
        print(f"tokens {lengths}: max/mean {max_over_mean(lengths):.3f} -> {forward:.3f} (forward), "
              f"{update:.3f} (update, by mini-batch)")
        assert forward < 1.05 and update < 1.05 < max_over_mean(lengths)
        # the outputs come back to the rows' own rank and order; the optimizer steps saw the same rows
        torch.testing.assert_close(balanced["logprobs"], plain["logprobs"], atol=1e-5, rtol=0)
        assert_states_close(balanced["state"], plain["state"], atol=1e-5)
    initial = load_causal_lm(tiny_model_path).state_dict()
    assert not torch.allclose(ranks[0][True]["state"]["model.norm.weight"], initial["model.norm.weight"])


def test_micro_batch_size_under_a_token_budget_warns():
    """A role's micro_batch_size has no effect when its engine groups micro-batches by tokens."""
    budget = ["roles.actor.max_tokens_per_micro_batch=64", "roles.actor.micro_batch_size=8"]
    with pytest.warns(UserWarning, match="roles.actor.micro_batch_size has no effect: "
                                         "roles.actor.max_tokens_per_micro_batch=64 groups micro-batches by tokens"):
        warn_no_effect(load_run_config(None, budget), {"actor", "ref", "rollout"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_no_effect(load_run_config(None, budget[:1]), {"actor", "ref", "rollout"})  # left at its default
        critic = [budget[0], "roles.critic.micro_batch_size=8"]
        warn_no_effect(load_run_config(None, critic), {"actor", "critic", "rollout"})  # the critic counts rows

"""Packed token-budget micro-batches under FSDP2 (two gloo ranks on CPU): a rank of long rows needs more
micro-batches than a rank of short ones, every rank runs the larger count (FSDP gathers per micro-batch, so
unequal counts would hang), and the step equals one process's over all rows in row micro-batches."""

import pathlib

import torch
import torch.distributed as dist

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.models.folders import load_causal_lm
from flowrl.engines.train.hf_engine import HFTrainEngine
from fakes import TokenMeanNLL
from test_engine_fsdp2 import WORLD, assert_states_close, make_batch, spawn_and_join

# rank 0: lengths 10, 10, 9, 9; rank 1: 3, 3, 2, 2. A budget of 20 tokens: rank 0 needs 2 packed micro-batches
# (19 + 19 of 38) and rank 1 one (10), so rank 1 runs 2 too (FSDP2 gathers the full lm_head: full logits)
ROWS = [([3, 12, 4, 15], [5, 6, 7, 8, 9, 1]), ([7, 8, 2, 3, 4], [9, 10, 11, 3, 1]),
        ([2, 13, 2, 15, 4, 4], [6, 7, 1]), ([4, 14, 5], [3, 3, 7, 5, 4, 1]),
        ([9], [2, 1]), ([5, 12], [1]), ([6], [1]), ([2, 14], [8, 1])]
BUDGET = 20


def run(model_path, rank, world, **options):
    torch.set_num_threads(1)
    rows = slice(rank * len(ROWS) // world, (rank + 1) * len(ROWS) // world)
    batch = make_batch(ROWS)[rows]
    engine = HFTrainEngine(load_causal_lm(model_path), HFTrainConfig(lr=1.0, grad_clip=1e9, **options), kind="actor",
                           eps=1.0)
    counts = len(engine._micro_batches(batch, 4, engine.max_tokens)) if engine.max_tokens else 0
    logprobs = engine.forward(batch, micro_batch_size=4)["logprobs"]
    metrics = engine.update(batch, TokenMeanNLL(), mini_batch_size=8 // world, micro_batch_size=4)
    return dict(counts=counts, logprobs=logprobs, grad_norm=metrics["grad_norm"], state=engine.full_state_dict())


def _worker(rank, world, model_path, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{out_dir / 'rendezvous'}", rank=rank, world_size=world)
    try:
        torch.save(run(model_path, rank, world, max_tokens_per_micro_batch=BUDGET, packing=True),
                   out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_token_budget_and_packing_under_fsdp2_match_one_process(tiny_model_path, tmp_path: pathlib.Path):
    spawn_and_join(_worker, args=(WORLD, tiny_model_path, tmp_path), timeout_s=180)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]
    single = run(tiny_model_path, rank=0, world=1)  # rows of 4, padded
    assert [r["counts"] for r in ranks] == [2, 2]  # rank 1 alone would run 1
    torch.testing.assert_close(torch.cat([r["logprobs"] for r in ranks]), single["logprobs"], atol=1e-5, rtol=0)
    for result in ranks:
        assert abs(result["grad_norm"] - single["grad_norm"]) < 1e-5 * single["grad_norm"]
        assert_states_close(result["state"], single["state"], atol=1e-5)

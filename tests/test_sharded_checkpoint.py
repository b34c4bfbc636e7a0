"""Sharded checkpoints (DCP) with 2 gloo ranks on CPU: each rank writes its shards; resuming at 2 ranks and at 1
rank gives the same next step as the uninterrupted run; CPU offload and LoRA train and reshard alike."""

import pathlib

import pytest
import torch
import torch.distributed as dist

from flowrl.engines.train import lora, sharded_checkpoint
from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.hf.options import LORA_TARGETS
from flowrl.engines.models.folders import load_causal_lm
from flowrl.engines.train.hf_engine import HFTrainEngine
from fakes import TokenMeanNLL
from test_engine_fsdp2 import ROWS, WORLD, make_batch, spawn_and_join

OPTIONS = {"full": {}, "offload_params": {"offload_params": True}, "offload_optimizer": {"offload_optimizer": True},
           "lora": {"lora_rank": 4}}
ATOL = 1e-5


# eps=1: Adam's step ~ lr * g / (|g| + 1): a gradient that is 0 but for rounding (a key bias's) stays tiny
def engine(model_path, lora_rank=0, **options):
    model = load_causal_lm(model_path)
    if lora_rank:
        model = lora.apply(model, lora_rank, 8.0, LORA_TARGETS, "lora_target_modules")
    config = HFTrainConfig(lr=0.5, grad_clip=1e9, warmup_steps=2, lora_rank=lora_rank, **options)
    return HFTrainEngine(model, config, kind="actor", eps=1.0)


def step(e, rank, world):
    rows = slice(rank * len(ROWS) // world, (rank + 1) * len(ROWS) // world)
    return e.update(make_batch(ROWS)[rows], TokenMeanNLL(), mini_batch_size=8 // world, micro_batch_size=3)


def run(model_path, out: pathlib.Path, rank, world):
    """Each option: step 1, a sharded save, step 2 (uninterrupted); then a fresh engine resumes at this world
    size and takes step 2 again."""
    results = {}
    for name, options in OPTIONS.items():
        e = engine(model_path, **options)
        first = step(e, rank, world)
        e.save(str(out / name))
        second = step(e, rank, world)
        resumed = engine(model_path, **options)
        resumed.load(str(out / name))
        again = step(resumed, rank, world)
        results[name] = dict(first=first["loss"], grad_norm=first["grad_norm"], second=second["loss"],
                             lr=second["lr"], state=e.full_state_dict(), again=again["loss"],
                             resumed_state=resumed.full_state_dict())
    return results


def _worker(rank, world, model_path, out):
    dist.init_process_group("gloo", init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=world)
    try:
        torch.save(run(model_path, out, rank, world), out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def close(actual, expected):
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, atol=ATOL, rtol=0, msg=key)


@pytest.fixture(scope="module")
def two_ranks(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    spawn_and_join(_worker, args=(WORLD, tiny_model_path, out), timeout_s=400)
    return out, [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]


def test_each_rank_writes_its_shards_and_the_folder_is_whole(two_ranks):
    out, _ = two_ranks
    for name in OPTIONS:
        files = sorted(p.name for p in (out / name).iterdir())
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"], name
    assert not list(out.glob(".*tmp*"))  # the temporary folders were renamed into place
    model_keys = [k for k in sharded_checkpoint.saved_keys(out / "lora") if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_resume_at_2_ranks_and_at_1_rank_equals_the_uninterrupted_run(two_ranks, tiny_model_path, name):
    out, ranks = two_ranks
    for result in ranks:  # at 2 ranks
        assert abs(result[name]["again"] - result[name]["second"]) < ATOL
        close(result[name]["resumed_state"], result[name]["state"])
    single = engine(tiny_model_path, **OPTIONS[name])  # at 1 rank: the shards resharded on load
    single.load(str(out / name))
    metrics = step(single, 0, 1)  # its loss is a mean of other micro-batches than the ranks'
    assert abs(metrics["lr"] - ranks[0][name]["lr"]) < 1e-12  # the schedule's position came back too
    close(single.full_state_dict(), ranks[0][name]["state"])


def test_offload_trains_equal_to_no_offload(two_ranks):
    _, ranks = two_ranks
    for result in ranks:
        for name in ("offload_params", "offload_optimizer"):
            assert abs(result[name]["first"] - result["full"]["first"]) < ATOL
            assert abs(result[name]["grad_norm"] - result["full"]["grad_norm"]) < ATOL * result["full"]["grad_norm"]
            close(result[name]["state"], result["full"]["state"])

"""FSDP2 on CPU: two gloo ranks, each with half the rows, match one process with all of them (token-mean and
token-sum losses)."""

import pathlib
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict
from torch.distributed.tensor import DTensor

from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl import metrics as fl_metrics
from flowrl.engines.weights.in_process import StreamedSync
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from fakes import TokenMeanNLL, TokenSumNLL
import cli_process

WORLD = 2
ROWS = [([3, 12, 4, 15], [5, 1]), ([7, 8], [9, 10, 11, 1]), ([2, 13, 2, 15, 4, 4], [6]),
        ([4, 14, 5], [3, 3, 7, 1]), ([9], [2, 1]), ([5, 12, 5, 15], [11, 2, 1]),
        ([6, 6], [8, 8, 8, 8, 1]), ([2, 14, 3, 15], [8])]  # rank 0 holds 11 tokens, rank 1 holds 11 - 2 = 9
PARAMS = SamplingParams(max_new_tokens=8, temperature=1.2)


def make_batch(rows):
    width_p, width_r = max(len(p) for p, _ in rows), max(len(r) for _, r in rows)
    tensors = {key: torch.zeros(len(rows), width, dtype=torch.long) for key, width in
               [("prompt_ids", width_p), ("prompt_mask", width_p), ("response_ids", width_r), ("response_mask", width_r)]}
    for i, (prompt, response) in enumerate(rows):
        tensors["prompt_ids"][i, width_p - len(prompt):] = torch.tensor(prompt)
        tensors["prompt_mask"][i, width_p - len(prompt):] = 1
        tensors["response_ids"][i, :len(response)] = torch.tensor(response)
        tensors["response_mask"][i, :len(response)] = 1
    return TensorDict(tensors, batch_size=[len(rows)])


def run(model_path, out_dir, rank, world):
    """One rank's work (world=1: the reference run on all rows); returns what the test compares."""
    torch.set_num_threads(1)
    rows = slice(rank * len(ROWS) // world, (rank + 1) * len(ROWS) // world)
    batch = make_batch(ROWS)
    # eps=1: Adam's step ~ lr * g / (|g| + 1), so the gradient's scale shows in the parameters
    engine = HFTrainEngine(load_causal_lm(model_path), HFTrainConfig(lr=1.0, grad_clip=1e9), kind="actor", eps=1.0)
    assert engine.sharded == (world > 1)
    assert isinstance(engine.model.model.embed_tokens.weight, DTensor) == (world > 1)
    logprobs = engine.forward(batch[rows], micro_batch_size=3)["logprobs"]
    metrics = engine.update(batch[rows], TokenMeanNLL(), mini_batch_size=8 // world, micro_batch_size=3)
    engine.save(str(out_dir / f"ckpt{world}"))
    restored = HFTrainEngine(load_causal_lm(model_path), HFTrainConfig(lr=1.0, grad_clip=1e9), kind="actor", eps=1.0)
    restored.load(str(out_dir / f"ckpt{world}"))
    restored.update(batch[rows], TokenMeanNLL(), mini_batch_size=8 // world, micro_batch_size=3)
    summed = HFTrainEngine(load_causal_lm(model_path), HFTrainConfig(lr=1.0, grad_clip=1e9), kind="actor", eps=1.0)
    sum_metrics = summed.update(batch[rows], TokenSumNLL(), mini_batch_size=8 // world, micro_batch_size=3)
    tokenizer = load_tokenizer(model_path)
    engine.save_pretrained(str(out_dir / f"hf{world}"), tokenizer)
    rollout = HFRolloutEngine(load_causal_lm(model_path), tokenizer, HFRolloutConfig())
    with fl_metrics.collect() as logged:  # world 2: the reshard (each rank receives the other's rows)
        rollout.weight_sync(engine)(engine, rollout)
    gathered = HFRolloutEngine(load_causal_lm(model_path), tokenizer, HFRolloutConfig())
    StreamedSync()(engine, gathered)  # today's gather path
    own = sum(t.to_local().numel() * t.element_size() for t in engine.model.state_dict().values()
              if isinstance(t, DTensor))  # the bytes of this rank's rows
    prompts = make_batch([(p, [0]) for p, _ in ROWS])
    generated = rollout.generate(prompts["prompt_ids"], prompts["prompt_mask"], PARAMS, seed=5)
    streamed = {name: tensor.clone() for name, tensor in engine.named_full_tensors()}  # the vLLM sync's source
    return dict(logprobs=logprobs, grad_norm=metrics["grad_norm"], state=engine.full_state_dict(), streamed=streamed,
                rollout_state=dict(rollout.model.state_dict()), gathered_state=dict(gathered.model.state_dict()),
                logged={k: v for k, v in logged.items() if k.startswith("sync/")}, own_bytes=own,
                restored_state=restored.full_state_dict(), sum_grad_norm=sum_metrics["grad_norm"],
                sum_state=summed.full_state_dict(), response_ids=generated["response_ids"],
                response_mask=generated["response_mask"])


def _worker(rank, world, model_path, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{out_dir / 'rendezvous'}", rank=rank, world_size=world)
    try:
        torch.save(run(model_path, out_dir, rank, world), out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn_and_join(fn, args, timeout_s):
    """Runs fn on WORLD spawned ranks; a rank's error re-raises here, a hang fails instead of blocking."""
    # forked from the server that imported flowrl once (tests/cli_process.py), not spawned: 7 s of CPU less a rank
    context = mp.start_processes(fn, args=args, nprocs=WORLD, start_method=cli_process.START_METHOD, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.terminate()
            raise TimeoutError(f"the {WORLD} ranks did not finish within {timeout_s} s")


def assert_states_close(actual, expected, atol):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, atol=atol, rtol=0, msg=name)


def test_fsdp2_matches_single_process(tiny_model_path, tmp_path: pathlib.Path):
    spawn_and_join(_worker, args=(WORLD, tiny_model_path, tmp_path), timeout_s=180)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]
    single = run(tiny_model_path, tmp_path, rank=0, world=1)
    initial = load_causal_lm(tiny_model_path).state_dict()
    assert not torch.allclose(single["state"]["model.norm.weight"], initial["model.norm.weight"])  # it trained
    torch.testing.assert_close(torch.cat([r["logprobs"] for r in ranks]), single["logprobs"], atol=1e-5, rtol=0)
    for result in ranks:
        assert abs(result["grad_norm"] - single["grad_norm"]) < 1e-5 * single["grad_norm"]
        assert_states_close(result["state"], single["state"], atol=1e-5)
        assert_states_close(result["streamed"], result["state"], atol=0)  # unsharded, tied lm_head included
        assert_states_close(result["rollout_state"], result["gathered_state"], atol=0)  # reshard == gather
        whole = sum(t.numel() * t.element_size() for t in result["streamed"].values())
        received, sent = result["logged"]["sync/received_mb"], result["logged"]["sync/sent_mb"]
        # a replica keeping the whole model receives all but its own rows (today: the ring all-gather's same
        # (n-1)/n, then every full tensor at once); it sends its rows to the other rank
        assert received == (whole - result["own_bytes"]) / 2**20 and sent == result["own_bytes"] / 2**20
        assert_states_close(result["restored_state"], single["restored_state"], atol=1e-5)
        assert abs(result["sum_grad_norm"] - single["sum_grad_norm"]) < 1e-5 * single["sum_grad_norm"]  # token-sum
        assert_states_close(result["sum_state"], single["sum_state"], atol=1e-5)
        assert torch.equal(result["response_ids"], single["response_ids"])
        assert torch.equal(result["response_mask"], single["response_mask"])
    exported = load_causal_lm(tmp_path / f"hf{WORLD}").state_dict()
    assert_states_close(exported, ranks[0]["state"], atol=0)

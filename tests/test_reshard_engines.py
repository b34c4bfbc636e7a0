"""The reshard under real engines over several syncs while the weights move (issue 44 points 3-5), on gloo ranks:

- colocated (torchrun's layout, one process group): an FSDP2 HFTrainEngine and an HF rollout fed through
  ReshardSync, beside one fed by today's gather path (StreamedSync): bit-equal weights, equal greedy rows,
  and the sampler's logprobs within 1e-6 of the trainer's (fp32), at every sync;
- split pools (the Ray layout, on the objects a Ray worker builds: SyncGroup + ReshardTransport): 2 train ranks
  holding FSDP2's rows, 2 HF rollout replicas; the same three checks against a model holding the whole weights;
- bytes: each rank's logged/measured bytes equal the plan's, a rollout rank receives exactly what it keeps
  (less its own rows), a train rank sends each of its rows once per replica that keeps them;
- a rank that never sends is a WeightSyncTimeout naming it within sync.timeout_s, colocated and split.
(vLLM under TP 2: tests/test_engine_vllm.py; every TP x DP layout's weights: tests/test_reshard.py.)"""

import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from flowrl import metrics
from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.weights.buckets import SyncGroup, WeightSyncTimeout
from flowrl.engines.weights.in_process import StreamedSync
from flowrl.engines.weights.reshard import Moved
from flowrl.engines.weights.reshard_sync import ReshardShape, ReshardSync, ReshardTransport, WeightShards, model_heads
from flowrl.runtime.threads import CPU_KERNELS
from cli_process import START_METHOD, stall_until

GREEDY = SamplingParams(max_new_tokens=5, greedy=True)
SYNCS = 3
BUCKET = 16 << 10  # several buckets per sync


def _prompts(tokenizer):
    ids = torch.tensor([tokenizer.encode("12+3="), tokenizer.encode("7*8=1")])
    return ids, torch.ones_like(ids)


def _move(tensors, step):
    """The weights move between syncs (every rank applies the same change to the rows it holds)."""
    with torch.no_grad():
        for t in tensors:
            t.mul_(1.05).add_(0.003 * (step + 1))


def _gap(train_logprobs, out):
    return ((train_logprobs - out["rollout_logprobs"]) * out["response_mask"]).abs().max().item()


def _batch(ids, mask, out):
    return TensorDict({"prompt_ids": ids, "prompt_mask": mask, "response_ids": out["response_ids"],
                       "response_mask": out["response_mask"]}, batch_size=[ids.shape[0]])


def _kernels() -> str:
    """The CPU kernels this rank runs (ATen's capability)."""
    return torch.backends.cpu.get_cpu_capability()


def _start_pinned(fn, args, nprocs, monkeypatch):
    """The ranks in fresh processes with the CPU kernels the quick start pins (flowrl.runtime.threads: AVX2's on an
    x86 CPU), read at each one's first op: the 1e-6 bar between the sampler's and the trainer's logprobs holds
    there, while under AVX-512's the two part by 1.19e-6 on these magnitudes (a few fp32 ulps; weights and greedy
    rows still equal). A forked rank would inherit the kernels its parent already chose."""
    for key, value in CPU_KERNELS.items():
        monkeypatch.setenv(key, value)
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="spawn")


def _colocated_rank(rank, path, out, stall):
    kernels = _kernels()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    tokenizer = load_tokenizer(path)
    train = HFTrainEngine(load_causal_lm(path), HFTrainConfig(lr=1.0), kind="actor")
    resharded, gathered = HFRolloutEngine(load_causal_lm(path), tokenizer, HFRolloutConfig()), \
        HFRolloutEngine(load_causal_lm(path), tokenizer, HFRolloutConfig())
    sync = resharded.weight_sync(train, timeout_s=3.0 if stall else 60.0)
    assert isinstance(sync, ReshardSync) and sync.timeout_s == (3.0 if stall else 60.0)
    if stall:  # rank 1 never takes part; rank 0 waits on its rows
        if rank == 1:
            stall_until([out / "rank0.pt"], longest=7)
            return
        start = time.perf_counter()
        try:
            sync(train, resharded)
            result = dict(error=None)
        except WeightSyncTimeout as err:
            result = dict(error=str(err), seconds=time.perf_counter() - start)
        torch.save(result, out / f"rank{rank}.pt")
        return
    ids, mask = _prompts(tokenizer)
    rows, sync = [], ReshardSync(StreamedSync(), bucket_bytes=BUCKET, timeout_s=60.0)  # several buckets a sync
    for step in range(SYNCS):
        _move([v.to_local() for v in train.model.state_dict().values()], step)
        with metrics.collect() as logged:
            sync(train, resharded)
        StreamedSync()(train, gathered)
        new, old = (e.generate(ids, mask, GREEDY) for e in (resharded, gathered))
        ours, theirs = resharded.model.state_dict(), gathered.model.state_dict()
        rows.append(dict(equal=all(torch.equal(ours[k], theirs[k]) for k in theirs),
                         same_rows=torch.equal(new["response_ids"], old["response_ids"]), kernels=kernels,
                         gap=_gap(train.forward(_batch(ids, mask, new))["logprobs"], new),
                         logged={k: v for k, v in logged.items() if k.startswith("sync/")},
                         own=sum(v.to_local().numel() * 4 for v in train.model.state_dict().values()),
                         whole=sum(v.numel() * 4 for v in theirs.values()),
                         largest=max(v.numel() * 4 for v in theirs.values())))
    torch.save(rows, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_colocated_hf_replicas_sync_exactly_over_moving_weights(tiny_model_path, tmp_path, monkeypatch):
    """2 ranks, rollout TP 1 x DP 2 (each rank an HF replica keeping the whole model): the resharded replica
    equals the gathered one bit for bit at each of 3 syncs, generates the same greedy rows, and its logprobs are
    the trainer's within 1e-6; each rank receives exactly the other's rows and sends its own."""
    _start_pinned(_colocated_rank, (tiny_model_path, tmp_path, False), 2, monkeypatch)
    for rank in range(2):
        for row in torch.load(tmp_path / f"rank{rank}.pt", weights_only=False):
            assert row["equal"] and row["same_rows"] and row["gap"] < 1e-6, row
            # the model's whole bytes (tied lm_head counted once, as the state dict streams it) less its own rows
            assert row["logged"]["sync/received_mb"] == (row["whole"] - row["own"]) / 2**20, row
            assert row["logged"]["sync/sent_mb"] == row["own"] / 2**20, row
            # O(bucket): a bucket's send and receive buffers (an entry over the bucket goes alone: half of it
            # out, the other half in)
            assert row["logged"]["sync/buffer_peak_mb"] * 2**20 <= max(BUCKET, row["largest"]), row
            assert row["logged"]["sync/buckets"] > 3, row


def test_colocated_rank_that_never_sends_is_named_within_sync_timeout(tiny_model_path, tmp_path):
    """sync.timeout_s reaches the hybrid engine's ReshardSync (engine.weight_sync(train, timeout_s))."""
    mp.start_processes(_colocated_rank, args=(tiny_model_path, tmp_path, True), nprocs=2, start_method=START_METHOD)
    result = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert re.search(r"the (send to|receive from) rank 1 got no answer within 3 s \(sync.timeout_s\)",
                     result["error"]), result
    assert result["seconds"] < 9, result


def _split_rank(rank, path, out, port, stall):
    """Sync-group ranks 0, 1: train (torch.chunk rows of the model, FSDP2's Shard(0)); 2, 3: HF rollout replicas.
    With `stall`, train rank 1 never sends."""
    kernels = _kernels()
    torch.set_num_threads(1)
    timeout = 3.0 if stall else 60.0
    store = SyncGroup.store("127.0.0.1", port, 4, rank == 0, timeout)
    group = SyncGroup(store, rank, 4, "cpu", "127.0.0.1", timeout)
    model, tokenizer = load_causal_lm(path), load_tokenizer(path)
    heads = model_heads(model.config)
    entries = [(n, tuple(t.shape), t.dtype) for n, t in model.state_dict().items()]
    transport = ReshardTransport(group, ReshardShape(entries, *heads, num_train=2, tp=1), BUCKET)
    rollout, rows = HFRolloutEngine(load_causal_lm(path), tokenizer, HFRolloutConfig()), []
    ids, mask = _prompts(tokenizer)
    for step in range(1 if stall else SYNCS):
        _move(model.state_dict().values(), step)  # every rank: the whole model (the reference), its rows sent
        if rank < 2:
            if stall and rank == 1:
                stall_until([out / f"rank{r}.pt" for r in (0, 2, 3)], longest=7)
                return
            local, start = {n: t.chunk(2)[rank] for n, t in model.state_dict().items()}, time.perf_counter()
            try:
                rows.append(transport.send(WeightShards(entries, local, *heads, torch.device("cpu"))))
            except WeightSyncTimeout as err:  # the rollout ranks stopped reading: they wait on rank 1
                torch.save(dict(error=str(err), seconds=time.perf_counter() - start), out / f"rank{rank}.pt")
                stall_until([out / "rank2.pt", out / "rank3.pt"], longest=6)  # the rollout ranks gave up
                return
            continue
        moved, start = Moved(), time.perf_counter()
        try:
            rollout.load_weight_stream(transport.receive(moved))
        except WeightSyncTimeout as err:
            torch.save(dict(error=str(err), seconds=time.perf_counter() - start), out / f"rank{rank}.pt")
            return
        new = rollout.generate(ids, mask, GREEDY)
        reference = HFRolloutEngine(model, tokenizer, HFRolloutConfig()).generate(ids, mask, GREEDY)
        ours, theirs = rollout.model.state_dict(), model.state_dict()
        with torch.no_grad():
            logits = model(input_ids=torch.cat([ids, new["response_ids"]], 1)).logits[:, ids.shape[1] - 1:-1]
        trainer = torch.log_softmax(logits.float(), -1).gather(-1, new["response_ids"].unsqueeze(-1)).squeeze(-1)
        rows.append(dict(equal=all(torch.equal(ours[k], theirs[k]) for k in theirs), gap=_gap(trainer, new), kernels=kernels,
                         same_rows=torch.equal(new["response_ids"], reference["response_ids"]), received=moved.received,
                         whole=sum(t.numel() * 4 for t in theirs.values())))
    torch.save(rows, out / f"rank{rank}.pt")
    group.close()


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_split_pools_hf_replicas_sync_exactly_over_moving_weights(tiny_model_path, tmp_path, monkeypatch):
    """2 train ranks -> 2 HF replicas over the Ray workers' SyncGroup + ReshardTransport: each replica's weights
    equal the whole model's bit for bit at each of 3 syncs, its greedy rows equal, its logprobs within 1e-6;
    a replica receives the whole model once (TP 1), a train rank sends its rows to each replica (2 x its share)."""
    _start_pinned(_split_rank, (tiny_model_path, tmp_path, _free_port(), False), 4, monkeypatch)
    whole = sum(t.numel() * 4 for t in load_causal_lm(tiny_model_path).state_dict().values())
    sent = [sum(r["sync/sent_mb"] for r in torch.load(tmp_path / f"rank{k}.pt", weights_only=False)) for k in (0, 1)]
    assert sum(sent) * 2**20 == SYNCS * 2 * whole  # every row once to each of the 2 replicas
    for rank in (2, 3):
        for row in torch.load(tmp_path / f"rank{rank}.pt", weights_only=False):
            assert row["equal"] and row["same_rows"] and row["gap"] < 1e-6, row
            assert row["received"] == row["whole"] == whole, row


def test_split_pools_train_rank_that_never_sends_is_named_within_sync_timeout(tiny_model_path, tmp_path):
    mp.start_processes(_split_rank, args=(tiny_model_path, tmp_path, _free_port(), True), nprocs=4,
                       start_method=START_METHOD)
    for rank in (2, 3):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert "the receive from rank 1 got no answer within 3 s (sync.timeout_s)" in result["error"], result
        assert result["seconds"] < 9, result
    # train rank 0 sent bucket 0, then waits on rollout ranks that no longer read: named too
    result = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert re.search(r"bucket \d+: the send to rank [23] got no answer within 3 s", result["error"]), result
    assert result["seconds"] < 9, result

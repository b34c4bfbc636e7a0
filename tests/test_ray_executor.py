"""The Ray executor on one local cluster: equal to the local executor, FSDP2 pools, overlap, bad input."""

import dataclasses
import gc
import json
import math
from pathlib import Path

import pytest
import torch

from flowrl.engines.hf.configs import HFRolloutConfig
import flowrl as fl
from flowrl.config import ExecutorSection, RunConfig, load_run_config
from flowrl.data import PromptStream
from flowrl.rl import stages
from flowrl.runtime.factory import make_factory
from flowrl.runtime.trainer import train
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask, fake_specs
from transformers import AutoModelForCausalLM

ray = pytest.importorskip("ray")
from flowrl.runtime.ray.executor import RayExecutor  # noqa: E402  (needs ray)
from flowrl.runtime.executor_configs import RayExecutorConfig  # noqa: E402

RAY = RayExecutorConfig(device="cpu", options=ExecutorSection(name="ray", ship_files=False, gc_freeze=False))
INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
SPLIT = ('placement={"pools": [{"name": "train", "roles": ["actor", "ref"]}, '
         '{"name": "gen", "roles": ["rollout"]}]}')


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_local):
    """The session's local Ray cluster (conftest.ray_local); workers find `fakes` on PYTHONPATH."""


def config(tmp_path, *overrides):
    return load_run_config(None, [f"train.output_dir={tmp_path}", *overrides])


def test_ray_equals_local_on_a_split_placement(tmp_path):
    """The rollout pool's copy is refreshed from the actor pool each step (without that sync the runs part)."""
    common = ["task.name=fakes:ParityTask", "train.steps=3", "train.batch_size=8", "eval.every=3",
              "eval.prompts=8", SPLIT]
    local = train(config(tmp_path / "local", *common), progress=False)
    remote = train(config(tmp_path / "ray", *common, "executor.name=ray"), progress=False)
    assert len({row["reward/mean"] for row in local}) == 3  # the policy moves
    for key in ("reward/mean", "actor/pg_loss", "response_length/mean", "actor/grad_norm"):
        assert [row[key] for row in remote] == pytest.approx([row[key] for row in local], abs=1e-6), key
    assert remote[-1]["eval/reward/mean"] == pytest.approx(local[-1]["eval/reward/mean"], abs=1e-6)
    rows = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the evaluation before training
    exported = [AutoModelForCausalLM.from_pretrained(tmp_path / run / "final").state_dict() for run in ("local", "ray")]
    worst = {k: (exported[0][k] - exported[1][k]).abs().max().item() for k in exported[0]}
    assert max(worst.values()) <= 1e-6, sorted(worst.items(), key=lambda kv: -kv[1])[:3]


def test_a_two_rank_fsdp_pool_trains_checkpoints_and_resumes(tmp_path):
    wide = ('placement={"pools": [{"name": "train", "roles": ["actor", "ref"], "world_size": 2}, '
            '{"name": "gen", "roles": ["rollout"]}]}')
    common = ["executor.name=ray", "task.name=fakes:ParityTask", "train.batch_size=4", "algo.group_size=4",
              "eval.every=0", "checkpoint.every=2"]
    first = train(config(tmp_path, *common, "train.steps=2", wide), progress=False)
    assert [row["step"] for row in first] == [1, 2]
    assert all(math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0 for row in first)
    assert (tmp_path / "checkpoints" / "step_000002" / "actor" / ".metadata").exists()
    # resume on one pool of two ranks (the rollout keeps its own copy, synced inside the workers): checkpoints
    # hold full state dicts, so any placement loads them
    hybrid = 'placement={"pools": [{"name": "all", "roles": ["actor", "ref", "rollout"], "world_size": 2}]}'
    resumed = train(config(tmp_path, *common, "train.steps=3", hybrid), progress=False)
    assert [row["step"] for row in resumed] == [3]
    assert math.isfinite(resumed[0]["actor/pg_loss"]) and 0.0 <= resumed[0]["reward/mean"] <= 1.0
    rows = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3]
    assert (tmp_path / "checkpoints" / "step_000003" / "actor" / ".metadata").exists()


@fl.algorithm
def two_forwards(batch, actor, rollout, ref):
    batch = rollout.generate(batch, n=2)
    batch = actor.logprobs(batch)
    return ref.logprobs(batch)


def fake_executor(placement, algo=two_forwards, forward_s=0.0, cfg=None, node_timeout_s=None, ref_exits=False,
                  gc_freeze=False):
    plan = fl.compile_plan(algo, placement, INPUTS, ROLE_CLASSES)
    factory = make_factory(cfg or RunConfig(), plan, ParityTask(), Path("unused"))
    options = ExecutorSection(name="ray", node_timeout_s=node_timeout_s, ship_files=False, gc_freeze=gc_freeze)
    return RayExecutor(plan, dataclasses.replace(factory, specs=fake_specs(forward_s, ref_exits)),
                       RayExecutorConfig(device="cpu", options=options))


def assert_heaps_frozen_after_the_first_step_only(executor, freeze: bool) -> None:
    """executor.gc_freeze: each worker's heap is frozen after its first step (not after an evaluation's view of
    the plan), and only then; with it off, after none."""
    workers = [w for pool in executor.workers.values() for w in pool]
    frozen = lambda: ray.get([w.__ray_call__.remote(lambda self: gc.get_freeze_count()) for w in workers])  # noqa: E731
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2)
    before = frozen()
    executor.for_plan(executor.plan).run_step(0, stream)  # a view (the evaluation's) freezes nothing
    assert all(n <= b for n, b in zip(frozen(), before))  # (a frozen object may be freed since)
    before = frozen()
    executor.run_step(0, stream)
    after = frozen()
    assert all(a > b for a, b in zip(after, before)) == freeze and len(after) == 2
    executor.run_step(1, stream)
    assert all(n <= a for n, a in zip(frozen(), after))  # once (a frozen object may be freed since)


def test_train_gc_freeze_freezes_each_workers_heap_after_the_first_step_only():
    """On; off is checked on test_closing_the_executor_closes_each_workers_roles's executor (a pool start fewer)."""
    executor = fake_executor(TWO_POOLS, gc_freeze=True)
    try:
        assert_heaps_frozen_after_the_first_step_only(executor, freeze=True)
    finally:
        executor.close()


def test_independent_nodes_on_two_pools_overlap():
    placement = fl.Placement(pools=[fl.Pool(name="a", roles=["actor", "rollout"]), fl.Pool(name="b", roles=["ref"])])
    executor = fake_executor(placement, forward_s=0.5)
    try:
        stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2)
        executor.run_step(0, stream)  # warm up
        batch, logged = executor.run_step(1, stream)
    finally:
        executor.close()
    expected = -0.1 * batch["response_ids"].float() * batch["response_mask"]
    assert torch.equal(batch["old_logprobs"], expected) and torch.equal(batch["ref_logprobs"], expected)
    assert logged["timing_s/actor.logprobs"] >= 0.5 and logged["timing_s/ref.logprobs"] >= 0.5
    assert logged["timing_s/step"] < 0.9, logged  # one after the other would take 1 s and more


def test_rows_that_do_not_split_over_a_pool_are_named(monkeypatch):
    placement = fl.Placement(pools=[fl.Pool(name="a", roles=["actor", "ref"]),
                                    fl.Pool(name="gen", roles=["rollout"], world_size=2)])
    executor = fake_executor(placement)
    try:
        batch, _ = executor.run_step(0, PromptStream(ParityTask(), FakeTokenizer(), batch_size=4))
        assert batch.batch_size[0] == 8 and torch.equal(batch["group"], batch["uid"])
        with pytest.raises(ValueError, match="pool 'gen': rollout.generate got 3 rows, which do not split evenly"):
            executor.run_step(1, PromptStream(ParityTask(), FakeTokenizer(), batch_size=3))
    finally:
        executor.close()
    import flowrl.runtime.ray.executor as ray_executor

    def started(*args, **kwargs):
        raise AssertionError("a worker started for a batch size the plan refuses")

    monkeypatch.setattr(ray_executor, "start_pool", started)  # refused before any pool's workers start
    with pytest.raises(ValueError, match="roles.actor.mini_batch_size=5 must be divisible by the world_size 2 of "
                                         "pool 'gen'"):
        fake_executor(placement, cfg=config("unused", "roles.actor.mini_batch_size=5"))


@fl.algorithm
def fill_three(batch, actor, rollout, reward):
    batch = stages.drop_uniform_groups(reward.score(rollout.generate(batch, n=2)))
    return actor.logprobs(fl.fill(batch, num_groups=3))


def test_fill_on_a_two_rank_pool_keeps_groups_the_ranks_split_evenly():
    """The fake rollout's two samples of a prompt differ in parity: every group survives; 3 of the 4 are wanted,
    and the 2 ranks after the fill take whole groups, so 2 are kept (one process keeps 3)."""
    placement = fl.Placement(pools=[fl.Pool(name="g", roles=["actor", "rollout"], world_size=2)])
    executor = fake_executor(placement, algo=fill_three)
    try:
        batch, logged = executor.run_step(0, PromptStream(ParityTask(), FakeTokenizer(), batch_size=4))
    finally:
        executor.close()
    assert batch["group"].tolist() == [0, 0, 1, 1] and logged["sampling/groups"] == 2
    assert logged["sampling/rounds"] == 1 and not batch["old_logprobs"].isnan().any()


def test_a_user_role_runs_on_the_driver_and_in_a_pool_as_locally(tmp_path):
    from custom_roles import grpo_judged

    common = ["train.steps=2", "train.batch_size=4", "eval.every=0", "checkpoint.export=false"]
    pooled = ('placement={"pools": [{"name": "g", "roles": ["actor", "rollout"]}, '
              '{"name": "j", "roles": ["judge"]}]}')
    local = train(config(tmp_path / "local", *common), algo=grpo_judged, progress=False)
    for name, extra in (("driver", []), ("pool", [pooled])):
        remote = train(config(tmp_path / name, *common, "executor.name=ray", *extra), algo=grpo_judged,
                       progress=False)
        for key in ("judge/mean", "combined/mean", "reward/mean", "actor/pg_loss"):
            assert [r[key] for r in remote] == pytest.approx([r[key] for r in local], abs=1e-6), (name, key)


def test_the_reward_placed_in_a_pool_scores_there_as_on_the_driver(tmp_path):
    """The driver's scores are the local executor's (the reward on the driver of a Ray run is test_ray_equals_local_
    on_a_split_placement's): a Ray worker fewer to start."""
    common = ["task.name=fakes:ParityTask", "train.steps=2", "train.batch_size=4", "eval.every=0",
              "checkpoint.export=false"]
    placed = ('placement={"pools": [{"name": "g", "roles": ["actor", "rollout", "ref"]}, '
              '{"name": "r", "roles": ["reward"]}]}')
    driver = train(config(tmp_path / "driver", *common), progress=False)
    pooled = train(config(tmp_path / "pooled", *common, "executor.name=ray", placed), progress=False)
    for key in ("reward/mean", "actor/pg_loss"):
        assert [r[key] for r in pooled] == pytest.approx([r[key] for r in driver], abs=1e-6), key


TWO_POOLS = fl.Placement(pools=[fl.Pool(name="a", roles=["actor", "rollout"]), fl.Pool(name="b", roles=["ref"])])


def test_the_watchdog_names_a_node_that_hangs():
    from flowrl.runtime.ray.executor import NodeTimeout

    executor = fake_executor(TWO_POOLS, forward_s=30.0, node_timeout_s=1.5)
    try:
        with pytest.raises(NodeTimeout, match=r"node (actor|ref).logprobs on pool '(a|b)' did not finish within "
                                              r"executor.node_timeout_s=1.5 s \(ranks still running: \[0\]\)"):
            executor.run_step(0, PromptStream(ParityTask(), FakeTokenizer(), batch_size=2))
    finally:
        executor.close()


def test_a_worker_that_dies_is_named():
    from flowrl.runtime.ray.executor import WorkerDied

    executor = fake_executor(TWO_POOLS, ref_exits=True)
    try:
        with pytest.raises(WorkerDied, match=r"a worker died while running .*ref.logprobs @b"):
            executor.run_step(0, PromptStream(ParityTask(), FakeTokenizer(), batch_size=2))
    finally:
        executor.close()


def test_a_cuda_pool_on_a_cluster_without_gpus_is_refused_at_once():
    placement = fl.Placement(pools=[fl.Pool(name="a", roles=["actor", "rollout"], device="cuda"),
                                    fl.Pool(name="b", roles=["ref"])])
    with pytest.raises(fl.PlanError, match=r"pool 'a' needs 1 GPU \(1 per rank, 1 for the pools so far\), but "
                                           r"the Ray cluster has 0"):
        fake_executor(placement)


def test_the_adaptive_kl_coefficient_resumes_under_ray(tmp_path):
    """The KL controller, a trainable driver role, is checkpointed with the pools' engines: a resumed Ray run
    continues from the coefficient the interrupted run would have used next, not from algo.kl_coef."""
    from flowrl.rl.ops.kl import adaptive_kl_coef

    run = ["executor.name=ray", "algorithm=ppo", "algo.kl_ctrl=adaptive", "algo.horizon=16", "train.batch_size=8",
           "eval.every=0", "checkpoint.export=false", "checkpoint.every=2"]
    first = train(config(tmp_path, *run, "train.steps=2"), progress=False)
    saved = json.loads((tmp_path / "checkpoints/step_000002/kl_ctrl/kl_ctrl.json").read_text())["coef"]
    last = first[-1]  # step 2's coefficient, moved by its KL over 8 rows: what step 3 uses
    assert saved == pytest.approx(adaptive_kl_coef(last["kl_ctrl/coef"], last["reward/kl"], 0.1, 16, 8), rel=1e-9)
    assert first[0]["kl_ctrl/coef"] == 0.001 and saved != 0.001
    resumed = train(config(tmp_path, *run, "train.steps=3"), progress=False)
    assert [row["step"] for row in resumed] == [3] and resumed[0]["kl_ctrl/coef"] == saved


def test_split_pools_stream_the_weights_in_buckets_without_a_state_dict(tmp_path, tiny_model_path):
    """Train pool x2 (FSDP2) and rollout pool x1: after the collective sync (the reshard: each train rank sends
    its own rows) the rollout's weights equal the trainer's to 0 and so does its greedy output; the bytes each
    rank moved are in its metrics; each process's peak host memory during the sync stays within a few buckets,
    where the state-dict path it replaced took the whole model (134 MB) on every train rank and on the rollout
    rank. Last, a train rank that never sends is a named error within sync.timeout_s."""
    import flowrl.algorithms  # noqa: F401 (registers the prebuilt algorithms: run alone, the list was empty)
    import host_memory as hm
    from flowrl.data.builtin.arithmetic import ArithmeticTask
    from flowrl.engines.models.folders import load_tokenizer
    from flowrl.engines.hf.rollout import HFRolloutEngine
    from flowrl.engines.protocols import SamplingParams
    from flowrl.graph.algorithm import ALGORITHMS
    from flowrl.runtime.trainer import make_plan

    path = hm.build_wide_model(tmp_path / "wide", tiny_model_path)
    wide = ('placement={"pools": [{"name": "train", "roles": ["actor"], "world_size": 2}, '
            '{"name": "gen", "roles": ["rollout"]}]}')
    cfg = config(tmp_path, f"model.path={path}", "sync.bucket_mb=8", "executor.name=ray", wide)
    algo, task = ALGORITHMS.get("grpo"), ArithmeticTask(4)
    plan = make_plan(cfg.model_copy(update={"algo": {"kl_coef": 0.0}}), algo, task)
    executor = RayExecutor(plan, make_factory(cfg, plan, task, path), RAY.model_copy(update={"sync": cfg.sync}))
    try:
        train_ranks, (gen,) = executor.workers["train"], executor.workers["gen"]
        everyone = [*train_ranks, gen]
        sync = next(node for node in executor.nodes if node.name == "rollout.sync_weights")
        for _ in range(2):  # the first sync also pages in the rollout's copy (mapped from the checkpoint)
            ray.get([w.__ray_call__.remote(hm.shift_actor, 0.01) for w in train_ranks])
            executor.book.updates["actor"] += 1
            starts = ray.get([w.__ray_call__.remote(hm.start_measuring) for w in everyone])
            _, *logged = executor._get([executor.pool_sync.launch(sync, 0.0)])  # the rollout's None, then metrics
            streamed = ray.get([w.__ray_call__.remote(hm.measured, s) for w, s in zip(everyone, starts)])
        trained = ray.get([w.__ray_call__.remote(hm.actor_weights) for w in train_ranks])[0]
        synced = ray.get(gen.__ray_call__.remote(hm.rollout_weights))
        assert synced.keys() == trained.keys() and all(torch.equal(synced[k], trained[k]) for k in trained)
        whole = sum(t.numel() * t.element_size() for t in trained.values()) / 2**20  # tied lm_head included
        # the reshard: each train rank sends its rows (half of each entry), the rollout (one replica, TP 1)
        # receives the whole model once; none of them gathers
        sent = [m["sync/sent_mb"] for m in logged[:2]]  # about half each (torch.chunk's rows of odd sizes)
        assert sum(sent) == pytest.approx(whole, abs=1e-9) and max(sent) < 0.51 * whole
        assert logged[2]["sync/received_mb"] == whole
        tokenizer = load_tokenizer(path)
        ids = torch.tensor([tokenizer.encode("12+3=")] * 2)
        greedy = SamplingParams(max_new_tokens=4, greedy=True)
        model = AutoModelForCausalLM.from_pretrained(path)
        model.load_state_dict(trained)
        expected = HFRolloutEngine(model, tokenizer, HFRolloutConfig()).generate(ids, torch.ones_like(ids), greedy)["response_ids"]
        assert torch.equal(ray.get(gen.__ray_call__.remote(hm.rollout_greedy, ids, torch.ones_like(ids), greedy)),
                           expected)
        starts = ray.get([w.__ray_call__.remote(hm.start_measuring) for w in everyone])
        ray.get([w.__ray_call__.remote(hm.old_gather) for w in train_ranks])
        ray.get(gen.__ray_call__.remote(hm.old_load, ray.put(trained)))
        old = ray.get([w.__ray_call__.remote(hm.measured, s) for w, s in zip(everyone, starts)])
        assert_a_rank_that_never_sends_is_named(executor, sync, tmp_path / "released")  # last: breaks the group
    finally:
        executor.close()
    bucket, largest = 8, 16  # MB: sync.bucket_mb, and the embedding (a tensor over a bucket goes alone)
    # the reshard: a train rank holds one bucket's send buffer (its half of the embedding alone), no gather
    assert all(peak < largest + 8 for peak in streamed[:2]), streamed
    # the rollout: one bucket's receive buffers, the block assembled from them and the one its loader still
    # holds (receiving into the kept blocks themselves would save the buffers: not done)
    assert streamed[2] < 3 * max(bucket, largest) + 8, streamed
    assert all(peak > 134 for peak in old), old  # the old path: the whole model on the CPU of every rank


def _busy(worker, released, seconds):
    """Fault injection: stuck elsewhere (an actor runs one call at a time), it never sends until `released` exists."""
    from cli_process import stall_until

    stall_until([released], seconds)


def _deadline(worker, key, seconds):
    """sync.timeout_s of weight-sync group `key` on this rank from now on (SyncGroup.set_timeout)."""
    worker.transports[key][0].group.set_timeout(seconds)


def assert_a_rank_that_never_sends_is_named(executor, sync, released, seconds=4):
    """Fault injection on a formed split-pools group: train rank 1 is kept busy through the next sync (a Ray
    actor runs one call at a time), so it never sends; the driver gets a WeightSyncTimeout naming the transfer
    from that rank within sync.timeout_s (not executor.node_timeout_s, nor a hang)."""
    import time

    from flowrl.engines.weights.buckets import WeightSyncTimeout

    (key,) = executor.pool_sync.groups
    everyone = [*executor.workers["train"], *executor.workers["gen"]]
    ray.get([w.__ray_call__.remote(_deadline, key, seconds) for w in everyone])
    executor.book.updates["actor"] += 1
    busy = executor.workers["train"][1].__ray_call__.remote(_busy, released, 3 * seconds)
    start = time.perf_counter()
    # the rollout rank's wait on rank 1, or train rank 0's on the rollout rank that gave up (whichever Ray
    # reports first): both name the bucket and the peer
    with pytest.raises(WeightSyncTimeout, match=rf"bucket \d+: the (receive from rank 1|send to rank 2) got no "
                                                rf"answer within {seconds} s \(sync.timeout_s\)"):
        executor._get([executor.pool_sync.launch(sync, 0.0)])
    assert time.perf_counter() - start < 2.5 * seconds
    released.touch()
    ray.get(busy)


def _mark_engine_closes(self, folder):
    """In a worker: each role's engine writes a file named for its role when it is closed."""
    import os

    for name, instance in self.roles.items():
        engine = getattr(instance, "engine", None)
        if engine is not None:
            engine.close = lambda path=os.path.join(folder, name): open(path, "w").close()


def test_closing_the_executor_closes_each_workers_roles(tmp_path):
    """As a local run closes its roles (flowrl.graph.role.close_role), so do the workers before they are ended
    (they were killed with their engines open: a vLLM engine's shutdown, an agent endpoint's stop never ran).
    The executor runs gc_freeze's off case first (test_train_gc_freeze_...: the same pools): no heap is frozen."""
    executor = fake_executor(TWO_POOLS)
    try:
        assert_heaps_frozen_after_the_first_step_only(executor, freeze=False)
    except BaseException:
        executor.close()
        raise
    workers = [w for pool in executor.workers.values() for w in pool]
    ray.get([w.__ray_call__.remote(_mark_engine_closes, str(tmp_path)) for w in workers])
    executor.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollout"]  # the roles whose close() closes an engine

"""Streamed rollouts (fl.buffer(stream=True), flowrl.runtime.offpolicy.streaming): a step trains on the first groups to
finish, k bounds each sample's versions, partial rollouts keep per-token versions and logprobs, and k = 0
trains the synchronous run's rows.

Over tests/fake_streamer.FakeStreamer (prompts of 2 per batch, 2 samples each: draw d's prompt i has uid 2d + i;
the i-th request to arrive is sample i % 2 of prompt i // 2 in draw order) and, end to end, the built-in task.
"""

import json
import sys

import pytest
import torch
from tensordict import TensorDict

import flowrl as fl
from flowrl import metrics
from flowrl.algorithms import grpo_async
from flowrl.data import PromptStream
from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.streaming.protocol import Request, Sample
from flowrl.graph.context import CallInfo, calling
from flowrl.runtime.store import checkpoint, resume
from flowrl.runtime.offpolicy.stream_runner import Group
from flowrl.runtime.trainer import train
from fake_streamer import FakeStreamer
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask
from test_buffer import COLOCATED, INPUTS, config
from test_planner_executor import make_roles
from crash import train_until_crash


def run(steps, k, stream=True, stall=lambda i: None, partial=False, per_version=0.0, timeout_s=60.0):
    roles = make_roles()
    streamer = FakeStreamer(roles["rollout"].engine, stall, per_version)
    roles["rollout"].streamer, roles["rollout"].partial = streamer, partial
    roles["rollout"].stream_timeout_s = timeout_s
    plan = fl.compile_plan(grpo_async, COLOCATED, INPUTS, ROLE_CLASSES,
                           {"group_size": 2, "max_staleness": k, "stream": stream})
    ex = fl.LocalExecutor(plan, roles)
    prompts = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=1)
    try:
        return streamer, [ex.run_step(step, prompts) for step in range(steps)]
    finally:
        ex.close()


def groups(batch):
    return batch["group"].unique_consecutive().tolist()


def test_a_batch_is_taken_while_a_long_group_is_in_flight():
    # requests 2 and 3 (prompt uid 1) run until the first pause, which lets them finish under version 0
    streamer, steps = run(2, k=1, stall=lambda i: (1, 1) if i in (2, 3) else None)
    (first, first_logged), (second, second_logged) = steps
    assert groups(first) == [0, 2] and first_logged["stream/in_flight"] >= 2
    # uid 1 finished during step 0's pause: trained at step 1 (version 1) with uid 3, both sampled at version 0
    assert groups(second) == [1, 3] and second["policy_version"].tolist() == [0, 0, 0, 0]
    assert second["policy_version_max"].tolist() == [0, 0, 0, 0]
    assert second_logged["buffer/staleness/max"] == 1 and second_logged["buffer/dropped"] == 0
    assert streamer.pauses == [False, False] and streamer.closed


def test_partial_rollouts_keep_each_tokens_version_and_logprob():
    # request 2 (uid 1, sample 0) is cut by step 0's pause after one token and resumes under version 1
    streamer, steps = run(2, k=1, stall=lambda i: (1, 1) if i == 2 else None, partial=True, per_version=0.01)
    batch, logged = steps[1]
    assert groups(batch) == [1, 3] and streamer.pauses == [True, True]
    assert batch["policy_version_min"].tolist() == [0, 0, 0, 0]
    assert batch["policy_version_max"].tolist() == [1, 0, 0, 0]
    # FakeRolloutEngine: response [digit + 1, eos 11], logprobs -0.1 x id; minus 0.01 x version for each token
    digit = batch["response_ids"][0, 0].item()
    torch.testing.assert_close(batch["rollout_logprobs"][0], torch.tensor([-0.1 * digit, -1.1 - 0.01]))
    assert logged["stream/aborted"] == 1 and logged["stream/mixed_versions"] == 1


def test_samples_more_than_k_versions_behind_are_dropped():
    # request 2 is cut at steps 0 and 1 and finishes under version 2, request 3 is cut at step 0 and finishes
    # under version 1: uid 1's samples, started under version 0, are trained at step 2 (version 2) with uid 5
    _, steps = run(3, k=1, stall=lambda i: (1, 2) if i == 2 else (1, 1) if i == 3 else None, partial=True)
    assert [groups(b) for b, _ in steps] == [[0, 2], [3, 4], [5]]
    batch, logged = steps[2]
    # staleness [2, 2, 1, 1] (uid 1 twice, uid 5 twice): uid 1's two samples dropped
    assert logged["buffer/dropped"] == 2 and logged["buffer/staleness/mean"] == 1.5
    assert logged["buffer/staleness/max"] == 2 and logged["stream/mixed_versions"] == 2
    assert logged["stream/aborted"] == 2 and batch["policy_version"].tolist() == [1, 1]


def test_k0_streamed_rows_equal_the_synchronous_rows():
    _, plain = run(3, k=0, stream=False)
    _, streamed = run(3, k=0)
    for (a, _), (b, b_logged) in zip(plain, streamed):
        assert set(b.keys()) == set(a.keys()) | {"policy_version_min", "policy_version_max", "trained_version"}
        for key in (k for k in a.keys() if isinstance(a[k], torch.Tensor)):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True)
        assert torch.equal(b["policy_version_max"], a["policy_version"])
        assert b_logged["buffer/dropped"] == 0 and b_logged["stream/aborted"] == 0


def test_a_step_whose_groups_do_not_finish_in_time_fails_in_one_line():
    # request 0 (uid 0) waits for a pause, which comes only once 2 groups are ready: uid 1 alone finishes
    with pytest.raises(TimeoutError, match=r"^stream: 1 of 2 groups ready after "
                                           r"roles.rollout.stream_timeout_s=0.2s$"):
        run(1, k=0, stall=lambda i: (1, 1) if i == 0 else None, timeout_s=0.2)


def test_a_plan_that_cannot_stream_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before the Ray executor imports Ray
    with pytest.raises(fl.PlanError, match=r"^grpo_async: fl.buffer\(stream=True\) on the Ray executor needs "
                                           r"rollout on a pool of its own \(split placement; or "
                                           r"executor.name=local\): pool 'global' also hosts actor, ref$"):
        train(config(tmp_path, "algorithm=grpo_async", "algo.stream=true", "executor.name=ray"), progress=False)
    episodes = fl.compile_plan(interact, fl.Placement.colocated(("rollout",)), INPUTS, ROLE_CLASSES)
    with pytest.raises(fl.PlanError, match=r"^interact: fl.buffer\(stream=True\) streams rollout.generate, which "
                                           r"must be the first node before it; got rollout.interact$"):
        fl.LocalExecutor(episodes, make_roles())


@fl.algorithm
def interact(batch, rollout):
    return fl.buffer(rollout.interact(batch, n=2), stream=True)


def test_grpo_async_streams_end_to_end_on_the_tiny_task(tmp_path):
    rows = train(config(tmp_path, "algorithm=grpo_async", "train.steps=3", "algo.stream=true",
                        "algo.max_staleness=1", "roles.rollout.partial=true", "roles.rollout.max_in_flight=8"),
                 progress=False)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert {"stream/wait_s", "stream/aborted", "stream/in_flight", "buffer/staleness/max",
                "buffer/dropped", "reward/mean", "actor/rollout/is_weight_mean"} <= set(r)
        assert 0 <= r["buffer/staleness/max"] <= 1 and r["buffer/dropped"] == 0


def test_streamed_rows_pad_responses_with_the_tokenizers_pad_id():
    rollout = make_roles()["rollout"]
    rollout.pad_id = 7
    request = Request((3, 4), SamplingParams(max_new_tokens=4), seed=0)
    samples = [Sample(request, [5, 6, 11], [-0.5, -0.6, -1.1], [0, 0, 1], FinishReason.STOP),
               Sample(request, [2], [-0.2], [1], FinishReason.LENGTH)]
    rows = TensorDict({"prompt_ids": torch.tensor([[3, 4]] * 2), "prompt_mask": torch.ones(2, 2, dtype=torch.long),
                       "uid": torch.tensor([5, 5])}, batch_size=[2])
    rows = rollout.streamed(rows, samples)
    assert rows["response_ids"].tolist() == [[5, 6, 11], [2, 7, 7]]
    assert rows["response_mask"].tolist() == rows["loss_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    torch.testing.assert_close(rows["rollout_logprobs"], torch.tensor([[-0.5, -0.6, -1.1], [-0.2, 0.0, 0.0]]))
    assert rows["policy_version_min"].tolist() == [0, 1] and rows["policy_version_max"].tolist() == [1, 1]


class InstantRunner:
    """A StreamRunner whose groups are done as soon as they are submitted (the batch generate's rows): every
    `finished` returns all groups submitted since the last."""

    def __init__(self, rollout):
        self.rollout, self.done = rollout, []

    def settings(self):
        return False, 5.0, self.rollout.pad_id

    def submit(self, batch, draw, n, sampling):
        with calling(CallInfo(draw, 1)), metrics.collect() as logged:
            rows = self.rollout.generate(batch, n=n, **sampling)
        rows["policy_version_min"], rows["policy_version_max"] = rows["policy_version"], rows["policy_version"]
        self.done += [Group(draw, i, rows[i * n:(i + 1) * n], logged=logged) for i in range(batch.batch_size[0])]

    def finished(self, wanted, timeout_s):
        done, self.done = self.done, []
        return done, 0

    def pause(self, abort):
        return 0

    def resume(self, version):
        pass

    def close(self):
        pass


class HighDigitTask(ParityTask):
    """Reward 1 when the response digit is 5 or more (the fake engine's two samples of a prompt are consecutive
    digits, so groups differ: parity gives every group 0.5)."""

    def reward(self, responses, meta):
        return [1.0 if r and r[0].isdigit() and int(r[0]) >= 5 else 0.0 for r in responses]


def test_reward_metrics_describe_the_trained_groups_not_those_scored_in_the_step():
    # k = 1, every group done at once: step 0 scores draws 0 and 1 (uids 0-3) and trains uids 0, 1; step 1
    # scores draw 2 (uids 4, 5) and trains 2, 3; step 2 trains 4, 5
    roles = make_roles(HighDigitTask())
    plan = fl.compile_plan(grpo_async, COLOCATED, INPUTS, ROLE_CLASSES,
                           {"group_size": 2, "max_staleness": 1, "stream": True})
    ex = fl.LocalExecutor(plan, roles)
    ex.stream.make_runner = lambda: InstantRunner(roles["rollout"])
    prompts = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=1)
    try:
        steps = [ex.run_step(step, prompts) for step in range(3)]
    finally:
        ex.close()
    assert [groups(batch) for batch, _ in steps] == [[0, 1], [2, 3], [4, 5]]
    scores = torch.cat([batch["scores"] for batch, _ in steps]).view(6, 2)  # by uid: its 2 samples' scores
    trained_mean = [scores[uids].mean().item() for uids in ([0, 1], [2, 3])]
    scored_mean = [scores[uids].mean().item() for uids in ([0, 1, 2, 3], [4, 5])]
    assert trained_mean != scored_mean  # the case tells them apart
    assert [logged["reward/mean"] for _, logged in steps[:2]] == pytest.approx(trained_mean)
    assert [logged["stream/scored/reward/mean"] for _, logged in steps[:2]] == pytest.approx(scored_mean)


def test_a_resumed_streamed_run_trains_the_prompts_an_uninterrupted_run_does(tmp_path):
    # k = 1, uid 1's samples stall until step 0's pause: step 0 trains uids 0, 2; the checkpoint after it holds
    # uids 1 and 3 drawn but untrained, which the resumed run (no stall) samples again with their first seeds
    def executor(stall):
        roles = make_roles()
        roles["rollout"].streamer = FakeStreamer(roles["rollout"].engine, stall)
        plan = fl.compile_plan(grpo_async, COLOCATED, INPUTS, ROLE_CLASSES,
                               {"group_size": 2, "max_staleness": 1, "stream": True})
        return fl.LocalExecutor(plan, roles), PromptStream(ParityTask(), FakeTokenizer(), batch_size=2, seed=1)

    def steps(ex, prompts, start, stop):
        try:
            return [ex.run_step(step, prompts)[0] for step in range(start, stop)]
        finally:
            ex.close()
    stall = lambda i: (1, 1) if i in (2, 3) else None  # noqa: E731
    straight = steps(*executor(stall), 0, 4)
    ex, prompts = executor(stall)
    first = steps(ex, prompts, 0, 1)
    where = checkpoint.save(tmp_path, 1, ex.train_engines(), {"stream": prompts.state(), "versions": ex.versions})
    assert (where / "_buffer" / "stream.pt").exists()
    ex, prompts = executor(lambda i: None)
    assert resume.restore((where, {}), ex, prompts, main=False) == 1
    resumed = steps(ex, prompts, 1, 4)
    assert [groups(b) for b in straight] == [[0, 2], [1, 3], [4, 5], [6, 7]]
    assert [groups(b) for b in first + resumed] == [groups(b) for b in straight]
    for a, b in zip(straight[1:], resumed):  # the same seeds: the fake engine's samples repeat
        assert torch.equal(a["response_ids"], b["response_ids"])


def test_a_streamed_run_on_the_tiny_model_resumes_with_the_prompts_drawn_ahead(tmp_path):
    # stopped after step 3, before its checkpoint: the run resumed from step 2's trains step 3 on the same prompts
    args = ["algorithm=grpo_async", "train.steps=3", "checkpoint.every=2", "algo.stream=true",
            "algo.max_staleness=1", "debug.dump_rollouts_every=1", "roles.rollout.max_in_flight=8"]
    train_until_crash(config(tmp_path, *args), 3)
    dump = tmp_path / "rollouts" / "step_000003.jsonl"
    straight = sorted({json.loads(line)["uid"] for line in dump.read_text().splitlines()})
    assert (tmp_path / "checkpoints" / "step_000002" / "_buffer" / "stream.pt").exists()
    assert [r["step"] for r in train(config(tmp_path, *args), progress=False)] == [3]
    assert sorted({json.loads(line)["uid"] for line in dump.read_text().splitlines()}) == straight

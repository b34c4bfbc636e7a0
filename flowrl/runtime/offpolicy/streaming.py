"""Streamed rollouts: groups complete as their samples arrive, and a step trains on the first to be ready.

`fl.buffer(batch, max_staleness=k, stream=True)` replaces the step's `rollout.generate` with a
StreamingEngine (flowrl.engines.streaming.protocol; `Rollout.streaming_engine`, made by roles.rollout.engine's config)
driven from an asyncio loop in a background thread (flowrl.runtime.offpolicy.stream_runner: in this process on the local
executor, in the rollout pool's worker on the Ray executor, flowrl.runtime.ray.streaming). Each prompt row drawn becomes n Requests (row r of the
draw seeded with the seed `generate` would give the draw's call, plus r: every sample its own seed, as vLLM's
seeded rows); up to `roles.rollout.max_in_flight` of them sample at once. When all n samples of a prompt are
done, `Rollout.streamed` builds the group's rows (the fields `generate` writes, plus `policy_version_min` /
`policy_version_max` over the tokens' versions; `policy_version` is the min) and the producers after
`generate` (reward.score) run on that group alone, while the other samples keep generating. What a group's
`generate` and producers log (`reward/mean`, `response_length/*`, their timings) is logged with the step that
trains it, so a step's reward describes its trained rows; `stream/scored/<name>` logs the groups scored during
the step (some trained later, some earlier drawn ones trained now).

Step t (the local executor):

1. syncs the followers (the weights of version v, the source's update count) and resumes the engine at v;
   prompt batches are drawn until (k + 1) x batch_size prompts are drawn but not yet trained;
2. waits for `batch_size` scored groups (deadline roles.rollout.stream_timeout_s, `stream/wait_s`) and takes
   the earliest drawn of those ready; groups still in flight (a long response) go on;
3. pauses the engine: `pause(abort=roles.rollout.partial)`: responses in flight either finish under v, or
   stop and keep their prefix, resuming from it under v + 1 at the next step's resume;
4. drops each sample whose oldest token lags v by more than k (`buffer/dropped`,
   `buffer/staleness/mean|max` over min versions) and runs the consumers (logprobs, advantages, update).
   A group that loses members keeps its survivors (verl drops per sample): its advantage baseline is then the
   survivors' mean.

On the Ray executor (`overlap`) step 3 comes after step 4: the engine samples on its own pool with its own
weights while the consumers run, and pauses once they are done, before the next step's weight sync.

Why pause while the consumers run: in one process the rollout generates with the actor's own module (the
hybrid engine), which the update changes in place; tokens sampled meanwhile would belong to no version, and
the two would share the CPU or GPU anyway. Between steps the engine stays paused, so evaluation and
checkpoints find it idle. The sampler's logprobs are kept per token, so a response spanning two versions is
corrected token by token (flowrl.rl.correction).

With k = 0 every sample of a step's batch is drawn, generated and trained within the step: the rows equal the
synchronous step's for an engine whose row r of a call seeded s is the sample of one request seeded s + r.
A checkpoint holds no sample in flight, but it holds the prompts drawn and not yet trained (in flight, or done
and waiting: `BUFFER`/stream.pt, with the draw counters). A resumed run samples them again first, each as its
draw's row (the same seed), waits for them (the uninterrupted run's were done: the pause after a step finishes
them) and then draws on, so it trains the prompts an uninterrupted run would, though the regenerated samples come
from the resumed weights (with `partial=true`, or on Ray, which groups are done at a step is timing anyway).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import concat
from flowrl.errors import PlanError
from flowrl.graph.context import StepCalls
from flowrl.graph.trace import Node
from flowrl.plan.planner import Plan
from flowrl.roles.rollout import Rollout
from flowrl.runtime.offpolicy import buffering
from flowrl.runtime.offpolicy.buffering import STEP_TIME, Run, Split, from_plain, load_plain, plain_batch
from flowrl.runtime.scheduling import fill_index
from flowrl.runtime.offpolicy.stream_runner import Group, StreamRunner

STREAM_FILE = "stream.pt"  # in the checkpoint's BUFFER folder


def make(plan: Plan, nodes: list[Node], roles: dict[str, Any], versions: Callable[[], dict[str, int]],
         world_size: int = 1) -> "Streamer | None":
    """The local executor's streamer for `plan` (None unless its buffer streams); what cannot stream is one
    PlanError line."""
    s = buffering.split(plan, nodes)
    if s is None or not s.stream:
        return None
    first = check(plan, s)
    if not isinstance(roles.get(first.role), Rollout) or getattr(type(roles[first.role]), first.method) is not \
            Rollout.generate:
        raise PlanError(f"{plan.algorithm}: fl.buffer(stream=True) streams rollout.generate, which must be the "
                        f"first node before it; got {first.name}")
    if world_size != 1:
        raise PlanError(f"{plan.algorithm}: fl.buffer(stream=True) runs in one process; got {world_size} ranks")
    return Streamer(s, lambda: StreamRunner(roles[first.role]), first, versions)


def check(plan: Plan, s: Split) -> Node:
    """The streamed generate node (the first producer); no producer or a fill is one PlanError line."""
    where = f"{plan.algorithm}: fl.buffer(stream=True)"
    if not s.producers:
        raise PlanError(f"{where} streams rollout.generate, which must be the first node before it; got none")
    if fill_index(s.producers) is not None:
        raise PlanError(f"{where}: a fill before the buffer cannot stream (groups are taken as they finish)")
    return s.producers[0]


class Streamer:
    """The streamed producers and the step that trains on them (see the module docstring). `runner` makes the
    StreamRunner (or a proxy of one in the rollout's process); `overlap`: the engine keeps sampling while the
    consumers run (it shares nothing with them) and pauses after them, before the next step's weight sync."""

    def __init__(self, s: Split, runner: Callable[[], Any], generate: Node, versions: Callable[[], dict[str, int]],
                 overlap: bool = False):
        self.split, self.make_runner, self.generate, self.versions = s, runner, generate, versions
        self.overlap = overlap
        self.after = s.producers[1:]  # run on each group as it completes
        self.runner: StreamRunner | None = None
        self.partial, self.timeout_s, self.pad_id = False, 0.0, 0
        self.ready: list[Group] = []
        self.drawn = self.trained = self.draws = 0  # prompts drawn / taken into a batch; batches drawn
        self.pending: dict[int, tuple[TensorDict, set[int]]] = {}  # draw -> its prompts, rows not yet taken
        self.requeue = False  # a checkpoint's pending prompts to start again (set by `load`)
        self.run: Run | None = None  # the executor's way to run nodes, set each step

    def step(self, step: int, prompts: Iterator[TensorDict], run: Run) -> tuple[TensorDict, dict[str, float]]:
        calls = StepCalls(step)
        with metrics.collect() as logged:
            start = time.perf_counter()
            batch = self._step(step, prompts, run, calls)
            metrics.log(STEP_TIME, time.perf_counter() - start)
        return batch, logged

    def _step(self, step: int, prompts: Iterator[TensorDict], run: Run, calls: StepCalls) -> TensorDict:
        s, version = self.split, self.versions().get(self.split.source, 0)
        self.run = run
        if self.runner is None:
            self.runner = self.make_runner()
            self.partial, self.timeout_s, self.pad_id = self.runner.settings()
        run(s.syncs, TensorDict({}, batch_size=[1]), calls)  # the syncs read no field
        self.runner.resume(version)
        if self.requeue:
            self._requeue()
        size = self._draw(prompts)
        waited = time.perf_counter()
        taken, in_flight = self._take(size)
        for group in taken:  # reward/mean, response_length/*, ...: the trained groups'
            metrics.replay(group.scored)
        metrics.log("stream/wait_s", time.perf_counter() - waited)
        metrics.log("stream/in_flight", in_flight)
        if not self.overlap:
            self.runner.pause(self.partial)
        batch = concat([g.rows for g in taken], self.pad_id)
        metrics.log("stream/aborted", sum(g.aborted for g in taken))
        metrics.log("stream/mixed_versions", (batch["policy_version_min"] < batch["policy_version_max"]).sum())
        batch, dropped = buffering.drop_stale(batch, s.version_field, version, s.max_staleness)
        for key, value in dropped.items():
            metrics.log(key, value)
        if batch.batch_size[0] == 0:
            metrics.log("buffer/skipped_step", 1.0)
        else:
            batch = run(s.consumers, batch, calls)
        if self.overlap:  # the groups that finished while the consumers ran
            metrics.log("stream/done_while_training", self.runner.pause(self.partial))
        return batch

    def _draw(self, prompts: Iterator[TensorDict]) -> int:
        """Draws prompt batches until (k + 1) batches' prompts wait untrained and submits their requests (their
        groups start together); returns the batch size."""
        size, (n, sampling) = None, self._sampling()
        while size is None or self.drawn - self.trained < (self.split.max_staleness + 1) * size:
            batch = next(prompts)
            size = size or batch.batch_size[0]
            self.runner.submit(batch, self.draws, n, sampling)
            self.pending[self.draws] = (batch, set(range(batch.batch_size[0])))
            self.drawn, self.draws = self.drawn + batch.batch_size[0], self.draws + 1
        return size

    def _sampling(self) -> tuple[int, dict[str, Any]]:
        """The traced generate call's n and its other sampling arguments."""
        return self.generate.row_multiplier(), self.generate.other_kwargs()

    def _requeue(self) -> None:
        """A resumed run: the checkpoint's drawn but untrained prompts start again, each as its draw's row, and
        finish before anything is drawn (as the uninterrupted run's had: the pause after a step finishes them)."""
        n, sampling = self._sampling()
        for draw, (batch, rows) in sorted(self.pending.items()):
            self.runner.submit(batch, draw, n, sampling, sorted(rows))
        self.requeue, wanted = False, sum(len(rows) for _, rows in self.pending.values())
        done, _ = self.runner.finished(wanted, self.timeout_s)
        self.ready += [self._score(group) for group in done]
        if len(done) < wanted:
            raise TimeoutError(f"stream: {len(done)} of the checkpoint's {wanted} untrained groups ready after "
                               f"roles.rollout.stream_timeout_s={self.timeout_s}s")

    def _take(self, size: int) -> tuple[list[Group], int]:
        """The `size` earliest drawn of the groups ready once `size` are, each scored as it arrived, and the
        samples in flight then."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            done, in_flight = self.runner.finished(size - len(self.ready), max(0.0, deadline - time.monotonic()))
            self.ready += [self._score(group) for group in done]
            if len(self.ready) >= size:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(f"stream: {len(self.ready)} of {size} groups ready after "
                                   f"roles.rollout.stream_timeout_s={self.timeout_s}s")
        self.ready.sort(key=lambda g: (g.draw, g.index))
        taken, self.ready = self.ready[:size], self.ready[size:]
        self.trained += len(taken)
        for group in taken:
            rows = self.pending[group.draw][1]
            rows.discard(group.index)
            if not rows:
                del self.pending[group.draw]
        return taken, in_flight

    def _score(self, group: Group) -> Group:
        """The producers after generate run on the group's rows (as call 1 of its draw's step); what they and
        generate logged is kept for the step that trains the group, and logged now as `stream/scored/<name>`."""
        with metrics.record() as group.scored:
            with metrics.node(self.generate.name):
                for key, value in group.logged.items():
                    metrics.log(key, value)
            if self.after:
                group.rows = self.run(self.after, group.rows, StepCalls(group.draw))
        metrics.replay(group.scored, prefix="stream/scored/")
        return group

    def save(self, path: str) -> None:
        """The drawn but untrained prompts and the counters (a checkpoint's BUFFER entry; tensors, lists and
        numbers only, so loading unpickles no object)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        pending = [{"draw": d, "untrained": sorted(rows), **plain_batch(b)} for d, (b, rows) in self.pending.items()]
        torch.save({"drawn": self.drawn, "trained": self.trained, "draws": self.draws, "pending": pending},
                   Path(path) / STREAM_FILE)

    def load(self, path: str) -> None:
        state = load_plain(Path(path) / STREAM_FILE, "a stream state")
        self.drawn, self.trained, self.draws = state["drawn"], state["trained"], state["draws"]
        self.pending = {p["draw"]: (from_plain(p), set(p["untrained"])) for p in state["pending"]}
        self.ready, self.requeue = [], True

    def close(self) -> None:
        """Closes the runner: the streaming engine, what is still in flight and its loop."""
        if self.runner is not None:
            self.runner.close()
            self.runner = None

"""StepCores (flowrl.engines.streaming.stepped) for lockstep tests: deterministic, recording every call.

- `ScriptCore`: each request's token j is a function of its prompt, seed and j (never 0), one token a step; it
  finishes after its max_new_tokens ("length").
- `GenerateCore`: each step samples every request whole with the batch engine's `generate` on that one row and
  its seed, as ThreadedStreamer(max_batch=1) does, so a replica of these steps the samples of rank_parity's
  SampleSeededRollout.

`calls` lists each ("add", id, prompt, params, seed), ("abort", ids) and ("step",) in order: on a follower rank,
what it received; on the leader, what it did.
"""

from __future__ import annotations

import torch

from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.streaming.stepped import Delta, Refused, StepCore


class RecordingCore(StepCore):
    def __init__(self):
        self.calls: list[tuple] = []
        self.live: dict[str, tuple[list[int], SamplingParams, int | None, int]] = {}  # prompt, params, seed, done

    def add(self, request_id: str, prompt: list[int], params: SamplingParams, seed: int | None) -> None:
        if len(prompt) > 1000:
            raise Refused(ValueError(f"prompt of {len(prompt)} tokens is past the context"))
        self.calls.append(("add", request_id, tuple(prompt), params, seed))
        self.live[request_id] = (list(prompt), params, seed, 0)

    def abort(self, request_ids: list[str]) -> None:
        self.calls.append(("abort", tuple(request_ids)))
        for request_id in request_ids:
            self.live.pop(request_id, None)


class ScriptCore(RecordingCore):
    def __init__(self, vocab: int = 50):
        super().__init__()
        self.vocab = vocab

    def token(self, prompt: list[int], seed: int | None, j: int) -> int:
        return 1 + (sum(prompt) * 31 + (seed or 0) * 7 + j * 13) % (self.vocab - 1)

    def step(self) -> list[Delta]:
        self.calls.append(("step",))
        out = []
        for request_id, (prompt, params, seed, done) in list(self.live.items()):
            token = self.token(prompt, seed, done)
            finish = "length" if done + 1 == params.max_new_tokens else None
            out.append(Delta(request_id, [token], [-0.01 * (token + 1)], finish))
            if finish is None:
                self.live[request_id] = (prompt, params, seed, done + 1)
            else:
                del self.live[request_id]
        return out


class GenerateCore(RecordingCore):
    def __init__(self, engine):
        super().__init__()
        self.engine = engine

    def step(self) -> list[Delta]:
        self.calls.append(("step",))
        out = []
        for request_id, (prompt, params, seed, _) in list(self.live.items()):
            ids = torch.tensor([prompt])
            sample = self.engine.generate(ids, torch.ones_like(ids), params, seed=seed)
            length = int(sample["response_mask"].sum())
            stop = sample["finish_reason"].tolist()[0] == FinishReason.STOP
            out.append(Delta(request_id, sample["response_ids"][0, :length].tolist(),
                             sample["rollout_logprobs"][0, :length].tolist(), "stop" if stop else "length"))
        self.live.clear()
        return out

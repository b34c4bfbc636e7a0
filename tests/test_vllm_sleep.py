"""free_cache_engine: which of vLLM's memory tags the engine wakes, against a stand-in for vLLM's LLM that, like
vLLM's CuMem allocator, fails when an awake tag is woken (it would map that memory again)."""

import pytest
import torch

pytest.importorskip("vllm")

from flowrl.engines.protocols import SamplingParams  # noqa: E402
from flowrl.engines.vllm.rollout import VLLMRolloutConfig, VLLMRolloutEngine  # noqa: E402


class SleepyLLM:
    """Records sleep, wake_up and weight loads; waking an awake tag is an error."""

    def __init__(self):
        self.asleep: set[str] = set()
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.asleep = {"weights", "kv_cache"}
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = ["weights", "kv_cache"] if tags is None else tags
        if not set(tags) <= self.asleep:
            raise RuntimeError(f"wake_up{tags}: {set(tags) - self.asleep} already awake")
        self.asleep -= set(tags)
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        if "weights" in self.asleep:
            raise RuntimeError("weights loaded while asleep")
        self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))

    def reset_prefix_cache(self) -> None:
        pass

    @property
    def llm_engine(self):
        return self

    @property
    def engine_core(self):
        return self

    def shutdown(self) -> None:
        """Frees vLLM's memory: like the CuMem allocator's unmap, it fails on memory asleep (unmapped)."""
        if self.asleep:
            raise RuntimeError(f"cuMemUnmap: invalid argument ({sorted(self.asleep)} asleep)")
        self.calls.append(("shutdown",))


class Source:
    def named_full_tensors(self):
        yield "w", torch.ones(2)


def sleepy_engine(level: int) -> VLLMRolloutEngine:
    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)  # no vLLM engine: its LLM is the stand-in
    engine.config, engine.llm, engine.cuda, engine.source = VLLMRolloutConfig(free_cache_engine=level), \
        SleepyLLM(), False, Source()
    engine.sleeping, engine.weights_fresh, engine.closed = set(), True, False
    return engine


@pytest.mark.parametrize("level", [1, 2])
def test_a_sync_into_a_sleeping_engine_wakes_the_weights_then_generation_the_cache(level):
    engine = sleepy_engine(level)
    engine._sleep()
    engine.load_weight_stream(Source().named_full_tensors())
    engine._wake()
    assert engine.llm.calls == [("sleep", level), ("wake_up", ("weights",)), ("reload_weights", ["w"]),
                                ("wake_up", ("kv_cache",))]
    assert not engine.llm.asleep and not engine.sleeping


def test_level_two_without_a_sync_resends_the_weights_before_waking_the_cache():
    engine = sleepy_engine(2)
    engine._sleep()
    engine._wake()
    assert engine.llm.calls == [("sleep", 2), ("wake_up", ("weights",)), ("reload_weights", ["w"]),
                                ("wake_up", ("kv_cache",))]


def test_level_one_without_a_sync_wakes_both_at_once():
    engine = sleepy_engine(1)
    engine._sleep()
    engine._wake()
    assert engine.llm.calls == [("sleep", 1), ("wake_up", ("weights", "kv_cache"))]


class Sample:
    def __init__(self, tokens: list[int]):
        self.token_ids, self.logprobs = tokens, [{t: type("L", (), {"logprob": -1.0})()} for t in tokens]


class RecordingLLM(SleepyLLM):
    """Answers generate with one token a row and keeps the sampling parameters it got."""

    def generate(self, prompts, params, use_tqdm, lora_request):
        self.params = params
        return [type("Out", (), {"outputs": [Sample([5])]})() for _ in prompts]


@pytest.mark.parametrize("level", [1, 2])
def test_closing_a_sleeping_engine_wakes_its_memory_before_freeing_it_once(level):
    engine = sleepy_engine(level)
    engine._sleep()
    engine.close()
    engine.close()  # again (and at exit): nothing more
    assert engine.llm.calls == [("sleep", level), ("wake_up", ("weights", "kv_cache")), ("shutdown",)]


@pytest.mark.parametrize("seed_rows", [True, False])
def test_seed_rows_gives_each_row_its_own_seed_or_none(seed_rows):
    engine = sleepy_engine(0)
    engine.config = VLLMRolloutConfig(seed_rows=seed_rows)
    engine.llm, engine.tp_ranks, engine.tp_group, engine.lora = RecordingLLM(), 1, None, None
    engine.eos_id, engine.pad_id = 1, 0
    ids, mask = torch.tensor([[3, 4], [0, 4], [3, 3]]), torch.tensor([[1, 1], [0, 1], [1, 1]])
    out = engine.generate(ids, mask, SamplingParams(max_new_tokens=2), seed=7)
    seeds = [p.seed for p in engine.llm.params]
    assert out["response_ids"].tolist() == [[5]] * 3
    assert (len(set(seeds)) == 3 and None not in seeds) if seed_rows else seeds == [None] * 3

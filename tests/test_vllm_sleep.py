"""free_cache_engine: which of vLLM's memory tags the engine wakes, against a stand-in for vLLM's LLM that, like
vLLM's CuMem allocator, fails when an awake tag is woken (it would map that memory again)."""

import pytest
import torch

pytest.importorskip("vllm")

from flowrl.engines.vllm_rollout import VLLMRolloutConfig, VLLMRolloutEngine  # noqa: E402


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


class Source:
    def named_full_tensors(self):
        yield "w", torch.ones(2)


def sleepy_engine(level: int) -> VLLMRolloutEngine:
    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)  # no vLLM engine: its LLM is the stand-in
    engine.config, engine.llm, engine.cuda, engine.source = VLLMRolloutConfig(free_cache_engine=level), \
        SleepyLLM(), False, Source()
    engine.sleeping, engine.weights_fresh = set(), True
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

"""Engine configs: each engine is chosen by name and builds itself from its own pydantic config.

`roles.actor.engine`, `roles.critic.engine` and `roles.rollout.engine` name an entry
of TRAIN_ENGINES or ROLLOUT_ENGINES (flowrl.roles.configs: a role's section
holds its engine); validating an engine's dict picks that
entry's config class, so each engine adds its own options (and their
documentation) without touching the run config. Entries may be registered
lazily as "module:Class", so an engine's imports cost nothing until chosen:

    ROLLOUT_ENGINES.register("vllm", "flowrl.engines.vllm.rollout:VLLMRolloutConfig")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowrl.engines import memory
from flowrl.engines.memory import ModelShape, RankLoad
from flowrl.engines.protocols import RolloutEngine, SamplingParams, TrainEngine
from flowrl.engines.streaming.protocol import StreamingEngine
from flowrl.graph.registry import Registry

Head = Literal["actor", "critic", "reward"]  # what the model outputs: logprobs, values, or a scalar score


@dataclass(frozen=True)
class ModelSource:
    """Where an engine loads its model from, and how."""

    path: Path
    dtype: Literal["float32", "bfloat16"] = "float32"
    gradient_checkpointing: bool = False


class EngineConfig(BaseModel):
    """Base of engine configs; validating a dict against the base picks the registered class by `engine`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)
    registry: ClassVar[Registry[type["EngineConfig"]]]
    SECTION: ClassVar[str | None] = None  # the one role section this engine serves (`flowrl config` shows it there)
    engine: str = Field("hf", description="Engine, by registered name.")

    @model_validator(mode="wrap")
    @classmethod
    def _dispatch(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, dict) and cls.__dict__.get("registry") is not None:  # a base class: pick the engine
            chosen = cls.registry.get(data.get("engine", "hf"))
            if not (isinstance(chosen, type) and issubclass(chosen, cls)):
                raise ValueError(f"engine {data.get('engine')!r} is registered with {chosen!r}, not a {cls.__name__}")
            return chosen.model_validate(data)
        return handler(data)

    def runs_on_pinned_cpu_kernels(self) -> bool:
        """Whether this engine runs right under the CPU kernels the quick start pins (flowrl.runtime.threads:
        ATen's AVX2 kernels on an AVX-512 CPU); where an engine does not, the quick start leaves them unpinned."""
        return True


class TrainEngineConfig(EngineConfig):
    registry: ClassVar[Registry[type[EngineConfig]]] = Registry("train engine")

    def build(self, source: ModelSource, *, head: Head, device: str, trainable: bool = True,
              base_of: TrainEngine | None = None) -> TrainEngine:
        """The engine; a frozen one (`trainable`=False) may read its weights from `base_of`, a trained engine in
        this process starting from the same model (the reference policy of a LoRA actor)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def estimate_memory(self, shape: ModelShape, load: RankLoad, *, trainable: bool = True,
                        base_lent: bool = False) -> dict[str, int]:
        """Bytes per GPU by component (flowrl.engines.memory) of this engine built `trainable`, or frozen; a
        frozen one whose `base_of` engine on its pool lends its module (`lends_base`) loads no weights."""
        return memory.trained(shape, load) if trainable else memory.frozen(shape, load, not base_lent)

    def lends_base(self) -> bool:
        """Whether a frozen engine built with this trained one as `base_of` reads its module (no own weights)."""
        return False

    def closer(self, engine: TrainEngine) -> Callable[[], None]:
        """What the run's end calls to release `engine` (built by this config) beyond plain tensors: nothing,
        but for an inference server's process state (roles.teacher.engine=vllm)."""
        return lambda: None


class RolloutEngineConfig(EngineConfig):
    """Sampling options every rollout engine honours; engines add their own."""

    registry: ClassVar[Registry[type[EngineConfig]]] = Registry("rollout engine")
    STREAMER: ClassVar[str] = "thread"  # its engines stream through this STREAMERS entry
    # one pool rank runs a replica that is a process of its own spanning the config's tensor_parallel_size GPUs
    # (vllm_server): the plan gives that rank's bundle those GPUs
    # (flowrl.runtime.layout.planning.tensor_parallel_ranks)
    RANK_SPANS_GPUS: ClassVar[bool] = False
    max_new_tokens: int = Field(2, ge=1, description="Longest response, in tokens.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; logprobs use the same one.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 is off.")
    ignore_eos: bool = Field(False, description="Never stop at eos: every response is max_new_tokens long "
                                                "(for benchmarks).")
    def sampling(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, ignore_eos=self.ignore_eos)

    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> RolloutEngine:
        """The engine; with `share` (a train engine in this process) it generates with that engine's weights."""
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def tensor_ranks(self) -> int:
        """The ranks (GPUs) one replica of this engine spans: its tensor_parallel_size, where it has one."""
        return 1

    def streamer(self, engine: RolloutEngine) -> StreamingEngine:
        """`engine` (built by this config) as a StreamingEngine, for streamed rollouts (fl.buffer(stream=True)):
        the STREAMERS entry its class names in STREAMER."""
        return STREAMERS.get(self.STREAMER)(engine)

    def estimate_memory(self, shape: ModelShape, load: RankLoad, *, shares_weights: bool = False) -> dict[str, int]:
        """Bytes per GPU: its own copy of the weights unless it `shares_weights` with its source's module, and
        the KV cache of its rows at full length."""
        return {"weights": 0 if shares_weights else shape.weight_bytes, "kv_cache": memory.kv_cache(shape, load)}


TRAIN_ENGINES = TrainEngineConfig.registry
ROLLOUT_ENGINES = RolloutEngineConfig.registry
TRAIN_ENGINES.register("hf", "flowrl.engines.hf.configs:HFTrainConfig")
TRAIN_ENGINES.register("vllm", "flowrl.engines.vllm.teacher:VLLMTeacherConfig")  # scoring only: the teacher
ROLLOUT_ENGINES.register("hf", "flowrl.engines.hf.configs:HFRolloutConfig")
ROLLOUT_ENGINES.register("hf_static", "flowrl.engines.hf.configs:HFStaticRolloutConfig")
ROLLOUT_ENGINES.register("vllm", "flowrl.engines.vllm.rollout:VLLMRolloutConfig")
ROLLOUT_ENGINES.register("vllm_server", "flowrl.engines.vllm.server:VLLMServerConfig")  # vLLM's own server process
# How a rollout engine becomes a StreamingEngine (flowrl.engines.streaming.protocol), in one place: a worker thread over
# any batch `generate`, or vLLM's own scheduler (a config picks one by its STREAMER)
STREAMERS: Registry[Callable[[RolloutEngine], StreamingEngine]] = Registry("streaming engine")
STREAMERS.register("thread", "flowrl.engines.streaming.thread_streamer:ThreadedStreamer")
STREAMERS.register("vllm", "flowrl.engines.vllm.streamer:make_streamer")
STREAMERS.register("vllm_server", "flowrl.engines.vllm.server:VLLMServerStreamer")

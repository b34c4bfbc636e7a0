"""The built-in roles' sections of the run config, `roles.<name>`: each holds the role's engine and options
and builds the role.

A section is flat: the role's own options (the rollout's environment) and its engine's options sit side by
side, `roles.actor.lr=1e-6`, `roles.rollout.engine=vllm`, `roles.rollout.env=calculator`; the engine is
chosen by `engine`, a name in TRAIN_ENGINES or ROLLOUT_ENGINES, and its config class adds its options. A role
registered as building on another role's engine (`@role(engines=("actor",))`: the reference, the reward
models) starts from that section's engine values, so `roles.actor.compile=true` compiles the reference too
and `roles.ref.compile=false` sets the reference apart (flowrl.config.RunConfig.section).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from pydantic import BaseModel, Field, SerializeAsAny, field_validator, model_serializer, model_validator

from flowrl.data.multiturn.envs import EnvSpec, load_env
from flowrl.roles.agents import AgentSpec
from flowrl.roles.context import UpdateSettings
from flowrl.engines.configs import EngineConfig, Head, RolloutEngineConfig, TrainEngineConfig
from flowrl.graph.role_config import RoleConfig


class EngineRoleConfig(RoleConfig):
    """A role section holding an engine config beside the role's options (flat, see the module's doc)."""

    ENGINE_DEFAULTS: ClassVar[dict[str, Any]] = {}  # engine values this role's section starts from
    FLAT: ClassVar[tuple[str, ...]] = ("engine",)
    POLICY: ClassVar[bool] = False  # the policy's own roles (actor, rollout): their model is model.path
    engine: SerializeAsAny[EngineConfig]
    model: str | None = Field(None, description="Hugging Face model folder this role loads; None: the run's "
                                                "(model.path, or model.reward_path for a reward model or judge).")

    @field_validator("model")
    @classmethod
    def _a_folder_name(cls, model: str | None) -> str | None:
        if model is not None and not model.strip():
            raise ValueError("an empty path; give a model folder, or leave it unset for the run's model")
        if model is not None and cls.POLICY:
            raise ValueError("the policy's folder is model.path (the actor, its rollout and its reference start "
                             "from it)")
        return model

    @classmethod
    def starting_from(cls, source: RoleConfig, values: dict[str, Any]) -> dict[str, Any]:
        """The source section's engine values under this section's own (unless it picks another engine)."""
        own, engine = cls.split(values)
        base = getattr(source, "engine", None)
        if isinstance(base, EngineConfig) and engine.get("engine", base.engine) == base.engine:
            engine = {**base.model_dump(), **engine}
        return {**own, "engine": engine}

    @classmethod
    def split(cls, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A flat section's values as (the role's own, its engine's)."""
        own = set(cls.model_fields) - {"engine"}
        nested = values.get("engine")
        engine = dict(nested) if isinstance(nested, dict) else {k: v for k, v in values.items() if k not in own}
        return {k: v for k, v in values.items() if k in own}, {**cls.ENGINE_DEFAULTS, **engine}

    @model_validator(mode="before")
    @classmethod
    def _nest_the_engine(cls, data: Any) -> Any:
        if not isinstance(data, dict) or isinstance(data.get("engine"), BaseModel):
            return data
        own, engine = cls.split(data)
        return {**own, "engine": engine}

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any) -> dict[str, Any]:
        values = handler(self)
        return {**values, **values.pop("engine")}


UPDATE_SIZES = ("mini_batch_size", "micro_batch_size", "forward_micro_batch_size", "epochs")
"""The options sizing a train engine's passes, on the section of the role whose passes they size (verl's
actor.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu, ref.log_prob_micro_batch_size_per_gpu, ...)."""


class TrainRoleConfig(EngineRoleConfig):
    """A role holding a TrainEngine: `roles.actor`, `roles.critic`, `roles.ref`, `roles.reward_model`, ...; the
    sizes of its passes are its own (UPDATE_SIZES), and a section starting from another role's (the reference
    from the actor's) starts from that role's sizes too."""

    HEAD: ClassVar[Head] = "actor"
    engine: SerializeAsAny[TrainEngineConfig] = Field(default_factory=lambda: TrainEngineConfig.model_validate({}),
                                                      description="The train engine (a name in "
                                                                  "flowrl.engines.TRAIN_ENGINES) and its options.")
    micro_batch_size: int = Field(64, ge=1, description="Responses per forward/backward pass of this role's "
                                  "engine, over all ranks of its pool (each rank takes 1/world_size; verl's "
                                  "ppo_micro_batch_size_per_gpu x GPUs).")
    forward_micro_batch_size: int = Field(0, ge=0, description="Responses per no-grad forward pass of this "
                                          "role's engine (old or reference logprobs, values, scores), over all "
                                          "ranks of its pool (verl's log_prob_micro_batch_size_per_gpu x GPUs); "
                                          "0: its micro_batch_size.")

    @classmethod
    def starting_from(cls, source: RoleConfig, values: dict[str, Any]) -> dict[str, Any]:
        """The source's engine values and its update sizes (those this section has) under this section's own."""
        sizes = {key: getattr(source, key) for key in UPDATE_SIZES
                 if key in cls.model_fields and key in type(source).model_fields}
        return super().starting_from(source, {**sizes, **values})

    def update_settings(self, balance_batch: bool) -> UpdateSettings:
        """The sizes of this role's engine passes (global: flowrl.runtime.factory shares them over a pool)."""
        return UpdateSettings(micro_batch_size=self.micro_batch_size,
                              forward_micro_batch_size=self.forward_micro_batch_size, balance_batch=balance_batch)

    def build(self, cls: type, ctx: Any) -> Any:
        return cls(self.engine.build(ctx.model, head=self.HEAD, device=ctx.device), ctx.settings)


class TrainedRoleConfig(TrainRoleConfig):
    """A role whose engine the run trains (registered `trainable`: actor, critic, learned_reward): the sizes of
    its updates besides those of its passes."""

    mini_batch_size: int = Field(128, ge=1, description="Responses per optimizer step of this role, over all "
                                 "ranks of its pool (each rank takes 1/world_size, as verl's ppo_mini_batch_size).")
    epochs: int = Field(1, ge=1, description="Passes of this role's update over each step's batch (verl's "
                                             "ppo_epochs).")

    def update_settings(self, balance_batch: bool) -> UpdateSettings:
        return replace(super().update_settings(balance_batch), mini_batch_size=self.mini_batch_size,
                       epochs=self.epochs)


class ActorConfig(TrainedRoleConfig):
    POLICY: ClassVar[bool] = True


class CriticConfig(TrainedRoleConfig):
    HEAD: ClassVar[Head] = "critic"
    ENGINE_DEFAULTS: ClassVar[dict[str, Any]] = {"lr": 5e-3}


class ScoreHeadConfig(TrainedRoleConfig):
    HEAD: ClassVar[Head] = "reward"


class RefConfig(TrainRoleConfig):
    def build(self, cls: type, ctx: Any) -> Any:
        """The actor's starting weights, frozen; under LoRA, the actor's own module with its adapters disabled
        when the actor lives in this process."""
        actor = ctx.roles.get("actor") if self.model is None else None  # a model of its own: not the actor's
        engine = self.engine.build(ctx.model, head="actor", device=ctx.device, trainable=False,
                                   base_of=actor.engine if actor is not None else None)
        return cls(engine, ctx.settings)


class TeacherConfig(TrainRoleConfig):
    """`roles.teacher.*` (on-policy distillation): the teacher's model folder, `roles.teacher.model`, required,
    and its engine's options (starting from the actor's, as the reference's; `roles.teacher.engine=vllm`: the
    teacher in vLLM, flowrl.engines.vllm.teacher)."""

    def build(self, cls: type, ctx: Any) -> Any:
        if self.model is None:
            raise ValueError("roles.teacher.model: give the teacher's model folder (a teacher is not the "
                             "student's own starting weights)")
        engine = self.engine.build(ctx.model, head="actor", device=ctx.device, trainable=False)
        return cls(engine, ctx.settings, release=self.engine.closer(engine))


class GeneratorConfig(EngineRoleConfig):
    """A role generating on a rollout engine of its own (the generative judge)."""

    engine: SerializeAsAny[RolloutEngineConfig] = Field(
        default_factory=lambda: RolloutEngineConfig.model_validate({}),
        description="The rollout engine (a name in flowrl.engines.ROLLOUT_ENGINES) and its options.")


class RolloutConfig(GeneratorConfig):
    """The rollout: its engine (sampling options and the engine's own) and the environment of `interact`."""

    POLICY: ClassVar[bool] = True
    env: str | None = Field(None, description="The environment `rollout.interact` plays episodes in: 'calculator', "
                                              "'python', 'chat_tools' (built in) or 'module:attribute' "
                                              "(flowrl.data.multiturn.envs); max_new_tokens is then per turn.")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment's "
                                        "factory, e.g. {'timeout_s': 1.0} for the sandboxed tools.")
    max_turns: int = Field(4, ge=1, description="Most model turns per episode (finish_reason MAX_TURNS).")
    max_total_tokens: int = Field(32, ge=1, description="Most response tokens per episode, turns and observations "
                                                        "together (finish_reason MAX_TOKENS).")
    env_workers: int = Field(8, ge=0, description="Threads stepping a turn's environments at once (tools wait on "
                                                  "subprocesses); 0 steps them one by one.")
    async_episodes: bool = Field(False, description="Each episode of `interact` a coroutine of its own over the "
                                 "engine as a StreamingEngine (flowrl.engines.agents.async_loop): tools run while "
                                 "other episodes generate; False plays all episodes turn by turn.")
    env_step_timeout_s: float | None = Field(60.0, gt=0, description="Deadline of one environment step: a step "
                                             "past it ends its episode with reward 0 and a tool_error, counted in "
                                             "env/timed_out (its thread is abandoned); None waits for ever.")
    max_in_flight: int = Field(64, ge=1, description="Streamed rollouts (fl.buffer(stream=True)): responses "
                                                     "sampled at once, one request each.")
    partial: bool = Field(False, description="Streamed rollouts: a weight update aborts the responses in flight, "
                                             "which resume from their prefix under the new weights (one response "
                                             "then holds tokens of two versions); False lets them finish first.")
    stream_timeout_s: float = Field(600.0, gt=0, description="Streamed rollouts: deadline of a step's wait for "
                                    "train.batch_size finished groups, and of a pause; async_episodes: deadline of "
                                    "one turn's sample (past it the run fails in one line).")

    agent: str | None = Field(None, description="The agent program `rollout.agents` runs per episode, as "
                              "'module:function' or 'file.py:function' (flowrl.engines.service.black_box_agents): "
                              "called with the episode's OpenAI base_url, it returns the episode's reward.")
    agent_command: list[str] | None = Field(None, description="Or a program started per episode with "
                                            "FLOWRL_BASE_URL, FLOWRL_API_KEY, FLOWRL_PROMPT and FLOWRL_META set; "
                                            "the last line it prints is the reward.")
    agent_timeout_s: float = Field(300.0, gt=0, description="Deadline of one agent episode: past it the episode "
                                   "ends with reward 0 (agent/timed_out), its later calls are refused.")
    agent_workers: int = Field(8, ge=1, description="Agent episodes played at once.")
    endpoint_host: str = Field("127.0.0.1", description="Where the rollout's OpenAI-compatible endpoint listens; "
                               "any host but loopback needs endpoint_token.")
    endpoint_port: int = Field(0, ge=0, le=65535, description="Its port (0: any free one).")
    endpoint_token: str | None = Field(None, description="A bearer token every call to the endpoint must carry.")
    chat_template: str | None = Field(None, description="A Jinja chat template for the endpoint's chat "
                                      "completions (None: the tokenizer's own).")

    @field_validator("env")
    @classmethod
    def _loadable(cls, env: str | None) -> str | None:
        if env is not None:
            load_env(env, where="")  # an unknown name fails at load, before any model does
        return env

    def env_spec(self) -> EnvSpec | None:
        """How `rollout.interact` makes and bounds episodes; None without `env`."""
        if self.env is None:
            return None
        return EnvSpec(self.env, dict(self.env_options), self.max_turns, self.max_total_tokens, self.env_workers,
                       self.env_step_timeout_s, self.async_episodes)

    def agent_spec(self) -> AgentSpec | None:
        """Who plays `rollout.agents` episodes and the endpoint they call; None without an agent."""
        if self.agent is None and not self.agent_command:
            return None
        if self.agent is not None and self.agent_command:
            raise ValueError("roles.rollout.agent and roles.rollout.agent_command: set one of them")
        return AgentSpec(self.agent, tuple(self.agent_command or ()), self.agent_timeout_s, self.agent_workers,
                         self.max_total_tokens, self.endpoint_host, self.endpoint_port, self.endpoint_token,
                         self.chat_template)

    def build(self, cls: type, ctx: Any) -> Any:
        source = ctx.roles.get("actor")
        share = source.engine if source is not None and ctx.name in ctx.shared else None
        engine = self.engine.build(ctx.model, tokenizer=ctx.tokenizer, device=ctx.device, share=share)
        try:  # an engine that started a process (a vLLM server) stops it when the role cannot be built
            sync = engine.weight_sync(source.engine, ctx.sync_timeout_s) if source is not None else None
            env, agent = self.env_spec(), self.agent_spec()
        except BaseException:
            getattr(engine, "close", lambda: None)()
            raise
        return cls(engine=engine, params=self.engine.sampling(), source=source, weight_sync=sync, seed=ctx.seed,
                   env=env, tokenizer=ctx.tokenizer if env or agent else None, agent=agent,
                   meta_keys=tuple(ctx.task.meta_keys) if (env or agent) and ctx.task is not None else (),
                   pad_id=ctx.tokenizer.pad_token_id,
                   max_in_flight=self.max_in_flight, partial=self.partial, stream_timeout_s=self.stream_timeout_s,
                   make_streamer=self.engine.streamer)

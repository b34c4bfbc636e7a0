"""Run configuration: flat pydantic sections, each default documented once.

Bad values fail at load with the dotted field name (`train.batch_size: ...`).
The defaults run the embedded job: the built-in tiny model on the built-in
arithmetic task, on CPU, in a few minutes.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from flowrl.engines.transports import TransportConfig
import flowrl.roles  # noqa: F401 (registers the built-in roles the role sections name)
from flowrl.graph.role import ROLES, RoleSpec
from flowrl.graph.role_config import RoleConfig, SectionError, engine_source, section, sections
from flowrl.plan.placement import Placement


class Section(BaseModel):
    """Strict: `train.steps=true` or `train.steps="3"` is refused, not coerced."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


def _a_path(value: Any) -> Any:
    """A path field may be unset (None) where it allows it, never an empty or blank string."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and not item.strip():
            raise ValueError("an empty path; give a file or folder name")
    return value


class ModelConfig(Section):
    path: str | None = Field(None, description="Local Hugging Face model folder; None builds the tiny built-in "
                                               "model under train.output_dir.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype of every model role.")
    reward_path: str | None = Field(None, description="Local reward model folder (a num_labels=1 classification "
                                                      "checkpoint sharing the policy's tokenizer); None scores "
                                                      "with the task's reward function.")
    _paths = field_validator("path", "reward_path")(_a_path)
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (actor, critic): "
                                                           "less memory, about a third more compute.")
    tiny_hidden_size: int = Field(64, ge=8, description="Hidden size of the built-in tiny model.")
    tiny_num_layers: int = Field(2, ge=1, description="Decoder layers of the built-in tiny model.")


class TrainConfig(Section):
    steps: int = Field(50, ge=1, description="Training steps (one batch of prompts each).")
    batch_size: int = Field(32, ge=1, description="Prompts per step (groups, once sampled), over all ranks.")
    mini_batch_size: int = Field(128, ge=1, description="Responses per optimizer step, over all ranks of the "
                                                        "pool (each rank takes 1/world_size, as verl's "
                                                        "ppo_mini_batch_size).")
    micro_batch_size: int = Field(64, ge=1, description="Responses per forward/backward pass, over all ranks "
                                                        "of the pool (each rank takes 1/world_size).")
    forward_micro_batch_size: int = Field(0, ge=0, description="Responses per no-grad forward pass (old and "
                                                               "reference logprobs, values, scores), over all "
                                                               "ranks of the pool (each rank takes "
                                                               "1/world_size); 0: train.micro_batch_size.")
    epochs: int = Field(1, ge=1, description="Passes over each step's batch per update.")
    balance_batch: bool = Field(False, description="Before each train engine pass (update, old and reference "
                                "logprobs, values) on a pool of several ranks, move rows between the ranks so "
                                "each holds as many rows and near-equal tokens (verl's trainer.balance_batch; "
                                "flowrl.engines.rank_balance): an update's optimizer steps keep their rows, so "
                                "the weights are the same. Off by default, so recorded runs are unchanged.")
    seed: int = Field(0, description="Seed of data order, sampling and the tiny model.")
    output_dir: str = Field("runs/flowrl", description="Checkpoints, metrics.jsonl and the tiny model go here.")
    save_every: int = Field(10, ge=0, description="Checkpoint every this many steps (0: only at the end).")
    rendezvous_timeout_s: float = Field(300.0, gt=0, description="torchrun: a rank whose master "
                                        "(MASTER_ADDR:MASTER_PORT) has not answered after this many seconds stops "
                                        "with a line naming it.")
    shutdown_timeout_s: float = Field(25.0, gt=0, description="After SIGTERM or SIGINT the run stops at the end "
                                      "of its step with a checkpoint; if that takes longer than this, it exits "
                                      "without one (the last is intact). Below the scheduler's grace period.")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    eval_every: int = Field(10, ge=0, description="Greedy evaluation on fixed prompts every this many steps, "
                                                   "before the first step and after the last (0: off).")
    eval_prompts: int = Field(64, ge=1, description="Prompts in the evaluation set.")
    eval_samples: int = Field(0, ge=0, description="Also sample this many responses per evaluation prompt (at "
                                                   "roles.rollout.temperature) for mean@k and pass@k (0: greedy only).")
    export: bool = Field(True, description="At the end, write the actor as a Hugging Face model folder "
                                           "to output_dir/final (loadable with from_pretrained).")
    resume: bool = Field(True, description="Continue from the newest checkpoint in output_dir if there is one.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Device of the local pools; cuda also picks the "
                                           "fast engines' options the run leaves unset "
                                           "(flowrl.engines.hf_configs.CUDA_DEFAULTS).")
    cpu_threads: int = Field(0, ge=0, description="Threads of torch's CPU ops in each process (torchrun rank, "
                             "Ray worker); 0: OMP_NUM_THREADS if set, else 1 for the built-in tiny model, else "
                             "the cores of the process's CPU affinity shared among the ranks on its node "
                             "(see flowrl.runtime.threads).")
    executor: str = Field("local", description="A registered name (flowrl.runtime.executors.EXECUTORS): "
                          "'local': every role in this process (one rank, or one per torchrun rank); 'ray': one "
                          "Ray actor per rank of each placement pool, started from this one process (needs the "
                          "`ray` extra).")
    node_timeout_s: float | None = Field(None, gt=0, description="Ray executor: a node whose workers have not "
                                         "finished this many seconds after it started is an error naming the "
                                         "node, its pool and the ranks still running (None: wait forever); "
                                         "under torchrun: a collective (FSDP's gathers, the weight sync) some "
                                         "rank has not joined within it fails (None: torch's 10 minutes).")
    ship_files: bool = Field(True, description="Ray executor: model folders reach the workers through Ray's "
                             "object store, and checkpoints and exports come back to this process's disk, so no "
                             "node needs to see it (False: every node reads and writes the paths as given, e.g. "
                             "on a shared filesystem; better for models of many GB).")
    placement_timeout_s: float = Field(60.0, gt=0, description="Ray executor: a pool Ray has not placed on the "
                                       "cluster's nodes after this many seconds is an error naming it.")
    rollout_share: float | None = Field(None, gt=0, lt=1, description="placement 'auto' on a Ray cluster's "
                                        "GPUs: this fraction of them for the roles that follow weights (the "
                                        "rollout), the rest for training; None: every role on every GPU.")
    memory_check: bool = Field(True, description="On CUDA, refuse before anything loads a plan whose memory "
                               "estimate per GPU (as `flowrl plan --gpus N` prints it) exceeds one GPU's memory; "
                               "the estimate leans high, so False lets a tight run try.")
    dump_rollouts_every: int = Field(0, ge=0, description="Write every this many steps' rows (prompt, response, "
                                     "reward, advantages, policy_version, step) to output_dir/rollouts/ as "
                                     "jsonl (flowrl.runtime.dumps; 0: off).")
    dump_eval: bool = Field(False, description="Write each evaluation's rows to output_dir/eval/ as jsonl.")
    dump_max_rows: int = Field(1024, ge=1, description="Rows per dump file at most; the rest are left out "
                                                       "(logged).")
    dump_max_bytes: int = Field(8_000_000, ge=1, description="Bytes per dump file at most.")
    profile_steps: list[int] = Field(default_factory=list, description="[a, b]: run steps a..b (1-based) "
                                     "under the torch profiler; output_dir/profile/ gets a Chrome trace, the "
                                     "operator table and a per-node time table (flowrl.runtime.profiling); "
                                     "[]: off.")
    loggers: list[Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["console", "jsonl"], description="Where step metrics go: console (the step "
        "line), jsonl (metrics.jsonl), tensorboard, wandb (offline unless WANDB_MODE says otherwise), mlflow "
        "(local store); see flowrl.runtime.loggers.")

    @field_validator("profile_steps")
    @classmethod
    def _a_step_range(cls, value: list[int]) -> list[int]:
        if value and (len(value) != 2 or not 1 <= value[0] <= value[1]):
            raise ValueError(f"expected [first, last] steps with 1 <= first <= last, or [], got {value}")
        return value

    @field_validator("loggers", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return [name.strip() for name in value.split(",")] if isinstance(value, str) else value

    _paths = field_validator("output_dir")(_a_path)


class TaskConfig(Section):
    name: str = Field("arithmetic", description="'arithmetic', 'calculator' (built in; see flowrl.data.calculator) "
                                                "or your own task: 'module:attribute' (a module beside you needs no "
                                                "PYTHONPATH) or 'path/to/file.py:attribute' (see flowrl.data.tasks).")
    max_operand: int = Field(4, ge=1, le=99, description="Arithmetic and calculator tasks: operands are drawn from "
                                                         "0..max_operand.")
    chat_template: bool = Field(False, description="Wrap each prompt as a user turn with the tokenizer's chat "
                                                   "template (for instruct models).")


class DataConfig(Section):
    train_files: list[str] = Field(default_factory=list, description="Training data in verl's schema: .parquet, "
                                   ".jsonl or saved `datasets` folders (see flowrl.data.dataset); empty: task.name.")
    val_files: list[str] = Field(default_factory=list, description="Validation data (same schema) for the "
                                 "evaluation pass; empty: prompts drawn from the training task.")
    max_prompt_length: int | None = Field(None, ge=1, description="Prompts longer than this many tokens are "
                                          "handled by data.truncation; None: no limit.")
    truncation: Literal["drop", "error"] = Field("drop", description="Over-long prompts: 'drop' them (the count "
                                                 "is logged) or stop with an 'error' naming the row.")
    shuffle: bool = Field(True, description="Shuffle the training rows each epoch (by train.seed and epoch).")
    reward: str = Field("auto", description="'auto' scores each row by its data_source (gsm8k, math); or a "
                                            "scorer: gsm8k, gsm8k_format, gsm8k_flexible, math, exact_match, "
                                            "module:function, file.py:function, or an http(s):// reward server "
                                            "(flowrl.data.http_reward).")
    val_reward: str | None = Field(None, description="The evaluation's scorer for data.val_files (the names of "
                                   "data.reward, no reward server); None: data.reward. A training reward with "
                                   "format credit (gsm8k_format) is not an accuracy: evaluate with gsm8k.")
    reward_workers: int = Field(4, ge=0, description="Processes scoring responses (0: in the driver, no timeout); "
                                                     "with a reward server, batches in flight at once.")
    reward_timeout_s: float = Field(10.0, gt=0, description="A response scored longer than this scores 0.0 "
                                    "(its scoring process is killed; reward_workers=0 has no timeout).")
    reward_fn_timeout_s: float = Field(600.0, gt=0, description="A task's reward function (task.name's, called "
                                       "on the driver with a whole batch) that has not returned after this many "
                                       "seconds stops the run in one line (resumable); data sets' scorers have "
                                       "data.reward_timeout_s per response instead.")
    max_length: int | None = Field(None, ge=2, description="SFT and preference rows (flowrl.data.conversations) "
                                   "longer than this many tokens are cut to it; None: no limit.")

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    _paths = field_validator("train_files", "val_files")(_a_path)


class RunConfig(Section):
    algorithm: str = Field("grpo", description="A registered name (flowrl.graph.algorithm.ALGORITHMS: the prebuilt ones) "
                                                  "or 'module:attribute'.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    sync: SerializeAsAny[TransportConfig] = Field(
        default_factory=lambda: TransportConfig.model_validate({}), description="The weight transport "
        "(`sync.transport`, a name in flowrl.engines.transports.TRANSPORTS) and its options.")
    placement: Placement | Literal["auto"] = Field("auto", description="Resource pools, or 'auto': every model "
                                                   "role on one pool (the hybrid engine) of one rank per torchrun "
                                                   "rank, or with train.executor=ray on CUDA, of every GPU of the "
                                                   "Ray cluster (split by train.rollout_share).")
    algo: dict[str, Any] = Field(default_factory=dict, description="The algorithm's own options, validated "
                                                                   "by its config class.")
    roles: dict[str, Any] = Field(default_factory=dict, description="Each role's own section, roles.<name>: "
                                  "its engine and options (roles.actor.lr, roles.rollout.engine, roles.rollout.env, "
                                  "roles.judge.<option>), validated by the role's config class; `use` (or "
                                  "roles.<name>=<role>) binds the name to another registered role class, e.g. "
                                  "roles.reward=llm_judge. `flowrl config ALGO` lists the sections of its roles.")

    @model_validator(mode="before")
    @classmethod
    def _legacy_sections(cls, data: Any) -> Any:
        return move_legacy_sections(data) if isinstance(data, dict) else data

    @field_validator("placement", mode="wrap")
    @classmethod
    def _auto_or_pools(cls, value: Any, handler: Any) -> Any:
        """One error naming the bad pool field, not one per kind of placement."""
        if value == "auto" or isinstance(value, Placement):
            return value
        if isinstance(value, str):
            raise ValueError(f"expected 'auto' or pools ({{\"pools\": [...]}}), got {value!r}")
        return Placement.model_validate(value)

    @field_validator("roles", mode="before")
    @classmethod
    def _sections(cls, roles: Any) -> dict[str, Any]:
        return sections(roles, _registered)

    @property
    def actor(self) -> Any:
        """The actor's engine config (roles.actor)."""
        return self.section("actor").engine

    @property
    def critic(self) -> Any:
        return self.section("critic").engine

    @property
    def rollout(self) -> Any:
        """The rollout's engine config (roles.rollout; its environment options are the section's own)."""
        return self.section("rollout").engine

    def section(self, name: str, spec: RoleSpec | None = None) -> RoleConfig:
        """Role `name`'s section, roles.<name> (its defaults when the run sets none), as `spec`'s config class
        (default: the class bound to the name)."""
        spec = spec or ROLES.get(self._bound(name))
        source = engine_source(name, spec)
        return section(name, self.roles.get(name, {}), spec, self.section(source) if source else None)

    def _bound(self, name: str) -> str:
        value = self.roles.get(name, {})
        return (value.get("use") if isinstance(value, dict) else getattr(value, "use", "")) or name

    def role_classes(self, algorithm_roles: tuple[str, ...] = ()) -> dict[str, type]:
        """The classes bound to role names for this run (every other role keeps its registered class).

        model.reward_path alone scores the `reward` role with the learned reward model, unless the algorithm
        uses the `reward_model` role itself (then `reward` stays the task's reward function).
        """
        bindings = {name: self._bound(name) for name in self.roles if self._bound(name) != name}
        if self.model.reward_path is not None and "reward_model" not in algorithm_roles:
            bindings.setdefault("reward", "reward_model")
        return {name: ROLES.get(impl).cls for name, impl in bindings.items()}

    def check_roles(self, specs: dict[str, RoleSpec]) -> None:
        """Each section of a role the run builds (`specs`), checked by that role's config; a section naming no
        registered role is an error in one line."""
        for name in self.roles:
            if name in specs:
                self.section(name, specs[name])
            elif self._bound(name) not in ROLES:
                raise SectionError(f"roles.{name}: no role {name!r} is registered; registered roles are "
                                   f"{ROLES.names()}")


LEGACY_SECTIONS = ("actor", "critic", "rollout")
"""The engine sections of the run config before each role had its own (issue 24): `actor.lr` is roles.actor.lr."""


LEGACY_JUDGE = {"judge_template": "template", "judge_max_score": "max_score",
                "judge_max_new_tokens": "answer_tokens"}
"""The generative judge's options that were data.* keys: now its section's (flowrl.roles.judge.JudgeConfig)."""


def move_legacy_sections(values: dict[str, Any]) -> dict[str, Any]:
    """`actor.*`, `critic.*` and `rollout.*` moved under roles.<name>, and data.judge_* under the judge's
    section (what roles.<name> sets wins); each key used says once that it is deprecated."""
    legacy = [name for name in LEGACY_SECTIONS if name in values]
    roles = values.get("roles", {})
    if not isinstance(roles, dict):
        return values
    values, roles = dict(values), dict(roles)
    _move_judge_options(values, roles)
    for name in legacy:
        old, new = (_as_values(values.pop(name), name), _as_values(roles.get(name, {}), f"roles.{name}"))
        roles[name] = {**old, **new}
        for key in old:
            warnings.warn(f"{name}.{key} is deprecated; use roles.{name}.{key}", FutureWarning, stacklevel=2)
    values["roles"] = roles
    return values


def _move_judge_options(values: dict[str, Any], roles: dict[str, Any]) -> None:
    """data.judge_* into the section of each role name bound to llm_judge (llm_judge's own if none is)."""
    data = values.get("data")
    moved = {key: data[key] for key in LEGACY_JUDGE if key in data} if isinstance(data, dict) else {}
    if not moved:
        return
    values["data"] = {k: v for k, v in data.items() if k not in moved}
    bound = [name for name, section in roles.items() if _as_values(section, name).get("use") == "llm_judge"]
    for name in bound or ["llm_judge"]:
        section = _as_values(roles.get(name, {}), f"roles.{name}")
        roles[name] = {**{LEGACY_JUDGE[key]: value for key, value in moved.items()}, **section}
        for key in moved:
            warnings.warn(f"data.{key} is deprecated; use roles.{name}.{LEGACY_JUDGE[key]}", FutureWarning,
                          stacklevel=3)


def _as_values(section: Any, where: str) -> dict[str, Any]:
    if isinstance(section, BaseModel):
        return section.model_dump()
    if isinstance(section, str):
        return {"use": section}
    if not isinstance(section, dict):
        raise SectionError(f"{where}: expected a section (a mapping of options), got {section!r}")
    return section


def _registered(name: str) -> RoleSpec | None:
    return ROLES.get(name) if name in ROLES else None


def format_error(err: ValidationError, prefix: str = "") -> str:
    parts = []
    for e in err.errors():
        if isinstance(e.get("ctx", {}).get("error"), SectionError):  # a role section's: already one dotted line
            parts.append(str(e["ctx"]["error"]))
            continue
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def validate(model: type[BaseModel], values: dict[str, Any], prefix: str = "", strict: bool | None = None) -> Any:
    """Build `model` from values, raising ValueError that names each bad field; `strict` refuses coercion
    ("4" or 4.0 for an int) in a model not strict itself. No float anywhere in it may be inf or nan."""
    try:
        built = model.model_validate(values, strict=strict)
    except ValidationError as err:
        raise ValueError(f"invalid config: {format_error(err, prefix)}") from None
    bad = next(non_finite(built.model_dump(), prefix), None)
    if bad is not None:
        raise ValueError(f"invalid config: {bad[0]}: {bad[1]} is not a finite number")
    return built


def non_finite(value: Any, where: str = "") -> Iterator[tuple[str, float]]:
    """(dotted name, value) of every inf or nan float in nested dicts and lists."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from non_finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from non_finite(item, f"{where}[{i}]")


def set_dotted(values: dict[str, Any], key: str, raw: str) -> None:
    """Apply one `a.b=value` override; the value is parsed as JSON when it can be."""
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    *parents, leaf = key.split(".")
    node = values
    for part in parents:
        if isinstance(node.get(part), str) and node is values.get("roles"):
            node[part] = {"use": node[part]}  # roles.<name>=<class> is roles.<name>.use, beside its options
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {key}: {part!r} is not a section")
    if isinstance(value, str) and isinstance(node.get(leaf), dict) and node is values.get("roles"):
        node[leaf]["use"] = value
    else:
        node[leaf] = value


def load_run_config(path: str | None = None, overrides: list[str] = ()) -> RunConfig:
    values: dict[str, Any] = read_config_file(path) if path else {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected key=value")
        set_dotted(values, key.strip(), raw.strip())
    from flowrl.engines.hf_configs import device_defaults  # torch and transformers: imported when needed

    values = move_legacy_sections(values)
    device_defaults(values, frozenset(ROLES.get("rollout").config.model_fields) - {"engine"})
    return validate(RunConfig, values)


def read_config_file(path: str) -> dict[str, Any]:
    """A JSON, YAML or TOML file of RunConfig values (by suffix); every problem is one line naming the file."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--config {path}: no such file")
    text = file.read_text(errors="replace")
    suffix = file.suffix.lower()
    try:
        if suffix == ".json":
            values = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml  # optional: JSON and TOML configs need nothing extra

            values = yaml.safe_load(text)
        elif suffix == ".toml":
            import tomllib

            values = tomllib.loads(text)
        else:
            raise ValueError(f"--config {path}: unknown format {suffix or '(no suffix)'!r}; use .json, .yaml or .toml")
    except ValueError as err:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        if str(err).startswith("--config"):
            raise
        raise ValueError(f"--config {path}: not valid {suffix[1:].upper()}: {err}") from None
    except Exception as err:  # yaml's errors
        raise ValueError(f"--config {path}: not valid YAML: {' '.join(str(err).split())}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a mapping of sections, got {type(values).__name__}")
    return values


def used_sections(specs: dict[str, RoleSpec]) -> set[str]:
    """The role sections a run of these roles reads: their own, and those their engines start from."""
    return {*specs, *(section for spec in specs.values() for section in spec.engines)}


def warn_no_effect(cfg: RunConfig, used_sections: set[str]) -> None:
    """Warn for each value set away from its default that this run ignores. `used_sections`: the role sections
    the run's roles read (their own, and those their engines start from: flowrl.graph.role_config)."""
    default = RunConfig()
    if cfg.model.path is not None:
        for key in ("tiny_hidden_size", "tiny_num_layers"):
            if getattr(cfg.model, key) != getattr(default.model, key):
                warnings.warn(f"model.{key} has no effect: model.path is set", stacklevel=2)
    t = cfg.train
    if t.micro_batch_size > t.mini_batch_size:
        warnings.warn(f"train.micro_batch_size={t.micro_batch_size} above train.mini_batch_size={t.mini_batch_size} "
                      f"has no effect: micro-batches never exceed a mini-batch", stacklevel=2)
    budgets = {name: cfg.section(name).engine.model_dump().get("max_tokens_per_micro_batch", 0)
               for name in ("actor", "critic") if name in used_sections}
    if t.micro_batch_size != default.train.micro_batch_size and budgets and all(budgets.values()):
        named = ", ".join(f"roles.{name}.max_tokens_per_micro_batch={budget}" for name, budget in budgets.items())
        warnings.warn(f"train.micro_batch_size has no effect: {named} groups micro-batches by tokens", stacklevel=2)
    if cfg.task.name not in ("arithmetic", "calculator") and cfg.task.max_operand != default.task.max_operand:
        warnings.warn("task.max_operand has no effect: task.name is neither 'arithmetic' nor 'calculator'",
                      stacklevel=2)
    if t.memory_check is not default.train.memory_check and t.device != "cuda":
        warnings.warn("train.memory_check has no effect: train.device is not 'cuda'", stacklevel=2)
    for name in cfg.roles:
        if name not in used_sections:
            warnings.warn(f"roles.{name}.* has no effect: no role of the algorithm builds on it", stacklevel=2)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks (vLLM 0.26)


def refuse_contradictions(cfg: RunConfig) -> None:
    """Options of two sections that cannot hold together, refused in one line before anything starts (they
    failed after the first step, or in vLLM's start-up)."""
    served = cfg.rollout.model_dump().get("max_lora_rank", 0)  # only engines that serve adapters have it
    trained = cfg.actor.model_dump().get("lora_rank", 0)
    if served and served not in VLLM_LORA_RANKS:
        raise ValueError(f"roles.rollout.max_lora_rank={served}: vLLM takes one of {VLLM_LORA_RANKS}")
    if served and not trained:
        raise ValueError(f"roles.rollout.max_lora_rank={served} serves the actor's LoRA adapter, but "
                         f"roles.actor.lora_rank is 0 (no adapter): set roles.actor.lora_rank, or "
                         f"roles.rollout.max_lora_rank=0 to stream the weights")
    if served and trained > served:
        raise ValueError(f"roles.actor.lora_rank={trained} is above roles.rollout.max_lora_rank={served}: vLLM could "
                         f"not load the adapter; set roles.rollout.max_lora_rank to at least {trained}")


def config_lines(model: type[BaseModel], prefix: str = "", values: BaseModel | None = None) -> Iterator[str]:
    """One line per leaf field with its default and description (the one place they are documented);
    `values` (an instance) supplies defaults set by a parent's default_factory."""
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        default: Any = getattr(values, name) if values is not None else info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):  # a role section's engine shows at the section's level (FLAT)
            yield from config_lines(type(default), prefix if name in getattr(model, "FLAT", ()) else f"{key}.", default)
            continue
        yield f"{key:32s} {default!r:>14}  {info.description or ''}"


def section_lines(cfg: RunConfig, names: Iterator[str] | tuple[str, ...]) -> list[str]:
    """The options of each named role's section, roles.<name>.* (`use` is described once, under `roles`)."""
    lines = []
    for name in names:
        section = cfg.section(name)
        lines += [line for line in config_lines(type(section), f"roles.{name}.", section)
                  if not line.startswith(f"roles.{name}.use ")]
    return lines

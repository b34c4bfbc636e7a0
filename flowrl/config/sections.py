"""The run config's flat sections (model, train, task, data): strict pydantic models, each default
documented once in its field's description."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


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
    balance_batch: bool = Field(False, description="Before each train engine pass (update, old and reference "
                                "logprobs, values) on a pool of several ranks, move rows between the ranks so "
                                "each holds as many rows and near-equal tokens (verl's trainer.balance_batch; "
                                "flowrl.engines.train.rank_balance): an update's optimizer steps keep their rows, so "
                                "the weights are the same. Off by default, so recorded runs are unchanged.")
    seed: int = Field(0, description="Seed of data order, sampling and the tiny model.")
    output_dir: str = Field("runs/flowrl", description="Checkpoints, metrics.jsonl and the tiny model go here.")
    memory_check: bool = Field(True, description="On CUDA, refuse before anything loads a layout an engine "
                               "would refuse, or whose peak per GPU in the planner's memory model (as `flowrl "
                               "plan --gpus N` prints it) passes 95% of one GPU's memory; False lets a tight run "
                               "try.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Device of the local pools; cuda also picks the "
                                           "fast engines' options the run leaves unset "
                                           "(the preset `cuda`: flowrl.config.presets, printed by `flowrl config`).")
    loggers: list[Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["console", "jsonl"], description="Where step metrics go: console (the step "
        "line), jsonl (metrics.jsonl), tensorboard, wandb (offline unless WANDB_MODE says otherwise), mlflow "
        "(local store); see flowrl.runtime.observe.loggers.")

    @field_validator("loggers", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return [name.strip() for name in value.split(",")] if isinstance(value, str) else value

    _paths = field_validator("output_dir")(_a_path)


class CheckpointConfig(Section):
    """Checkpoints, resuming from them, the final export, and the stop on a signal."""

    every: int = Field(10, ge=0, description="Checkpoint every this many steps (0: only at the end).")
    keep: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    resume: bool = Field(True, description="Continue from the newest checkpoint in train.output_dir if there is one.")
    export: bool = Field(True, description="At the end, write the exported policy as a Hugging Face model folder "
                                           "to train.output_dir/final (loadable with from_pretrained).")
    shutdown_timeout_s: float = Field(25.0, gt=0, description="After SIGTERM or SIGINT the run stops at the end "
                                      "of its step with a checkpoint; if that takes longer than this, it exits "
                                      "without one (the last is intact). Below the scheduler's grace period.")


class EvalConfig(Section):
    """The greedy (and sampled) evaluation on fixed prompts."""

    every: int = Field(10, ge=0, description="Greedy evaluation on fixed prompts every this many steps, "
                                             "before the first step and after the last (0: off).")
    prompts: int = Field(64, ge=1, description="Prompts in the evaluation set.")
    samples: int = Field(0, ge=0, description="Also sample this many responses per evaluation prompt (at "
                                              "roles.rollout.temperature) for mean@k and pass@k (0: greedy only).")


class ExecutorSection(Section):
    """Which executor runs the plan (flowrl.runtime.executor_configs.EXECUTORS) and how its processes start and wait."""

    name: str = Field("local", description="A registered name (flowrl.runtime.executor_configs.EXECUTORS): "
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
    rendezvous_timeout_s: float = Field(300.0, gt=0, description="torchrun: a rank whose master "
                                        "(MASTER_ADDR:MASTER_PORT) has not answered after this many seconds stops "
                                        "with a line naming it.")
    gc_freeze: bool = Field(True, description="After the first step, collect garbage once and freeze what is "
                            "left (gc.freeze; in each Ray worker too), so later collections skip the run's "
                            "long-lived objects (models, compiled graphs, vLLM's engine), as vLLM does after its "
                            "start: on an H200 a GRPO step of the 0.5B shape took 2.92 s against 3.19 s without it "
                            "(flowrl.runtime.observe.gc_heap). timing_s/gc/<node> logs the collector's seconds either way.")
    cpu_threads: int = Field(0, ge=0, description="Threads of torch's CPU ops in each process (torchrun rank, "
                             "Ray worker); 0: OMP_NUM_THREADS if set, else 1 for the built-in tiny model, else "
                             "the cores of the process's CPU affinity shared among the ranks on its node "
                             "(see flowrl.runtime.threads).")

    @model_validator(mode="before")
    @classmethod
    def _a_name(cls, value: Any) -> Any:
        """`executor=ray` is executor.name=ray."""
        return {"name": value} if isinstance(value, str) else value


class DebugConfig(Section):
    """What a run writes to look into it: rows dumped as jsonl, and profiled steps."""

    dump_rollouts_every: int = Field(0, ge=0, description="Write every this many steps' rows (prompt, response, "
                                     "reward, advantages, policy_version, step) to train.output_dir/rollouts/ as "
                                     "jsonl (flowrl.runtime.store.dumps; 0: off).")
    dump_eval: bool = Field(False, description="Write each evaluation's rows to train.output_dir/eval/ as jsonl.")
    dump_max_rows: int = Field(1024, ge=1, description="Rows per dump file at most; the rest are left out "
                                                       "(logged).")
    dump_max_bytes: int = Field(8_000_000, ge=1, description="Bytes per dump file at most.")
    profile_steps: list[int] = Field(default_factory=list, description="[a, b]: run steps a..b (1-based) "
                                     "under the torch profiler; train.output_dir/profile/ gets a Chrome trace, the "
                                     "operator table and a per-node time table (flowrl.runtime.observe.profiling); "
                                     "[]: off.")

    @field_validator("profile_steps")
    @classmethod
    def _a_step_range(cls, value: list[int]) -> list[int]:
        if value and (len(value) != 2 or not 1 <= value[0] <= value[1]):
            raise ValueError(f"expected [first, last] steps with 1 <= first <= last, or [], got {value}")
        return value


class TaskConfig(Section):
    name: str = Field("arithmetic", description="'arithmetic', 'calculator' (built in; see flowrl.data.builtin.calculator) "
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
                                            "(flowrl.data.scoring.http_reward).")
    val_reward: str | None = Field(None, description="The evaluation's scorer for data.val_files (the names of "
                                   "data.reward, no reward server); None: data.reward. A training reward with "
                                   "format credit (gsm8k_format) is not an accuracy: evaluate with gsm8k.")
    reward_workers: int = Field(4, ge=0, description="Processes scoring responses (0: in the driver, no timeout); "
                                                     "with a reward server, batches in flight at once.")
    reward_timeout_s: float = Field(10.0, gt=0, description="A response scored longer than this scores 0.0 "
                                    "(its scoring process is killed; reward_workers=0 has no timeout).")
    reward_fn_timeout_s: float = Field(600.0, gt=0, description="A task's reward function (task.name's, called "
                                       "on the driver with a whole batch), or its example() over a batch of "
                                       "prompts, that has not returned after this many seconds stops the run in "
                                       "one line (resumable); data sets' scorers have "
                                       "data.reward_timeout_s per response instead.")
    max_length: int | None = Field(None, ge=2, description="SFT and preference rows (flowrl.data.conversations) "
                                   "longer than this many tokens are cut to it; None: no limit.")

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    _paths = field_validator("train_files", "val_files")(_a_path)

"""The run's task from its config: data.train_files (a DatasetTask) or task.name, and its validation rows."""

from __future__ import annotations

import warnings
from typing import Any

from flowrl.config import RunConfig
from flowrl.data.conversations import ConversationTask, table_kind
from flowrl.data.dataset import DatasetTask, load_rows, prompt_text
from flowrl.data.scoring.http_reward import HttpScorer, is_url
from flowrl.data.prompts import encode_prompt
from flowrl.data.scoring.pool import ScoringPool
from flowrl.data.tasks import make_task


def run_task(cfg: RunConfig) -> Any:
    """A DatasetTask over data.train_files (its `val` over data.val_files, or None), else task.name's task."""
    d = cfg.data
    if not d.train_files:
        for key in ("val_files", "max_prompt_length"):
            if getattr(d, key):
                warnings.warn(f"data.{key} has no effect: data.train_files is empty", stacklevel=2)
        return make_task(cfg.task.name, cfg.task.max_operand)
    if cfg.task.name != "arithmetic":
        warnings.warn("task.name has no effect: data.train_files is set", stacklevel=2)
    kind = table_kind(d.train_files, "data.train_files")
    if kind != "prompts":  # SFT conversations or preference pairs (flowrl.data.conversations)
        return conversation_task(cfg, kind)
    if is_url(d.reward):  # a reward server: reward_workers batches in flight at once
        pool = HttpScorer(d.reward, d.reward_timeout_s, num_parallel=d.reward_workers)
    else:
        pool = ScoringPool(d.reward_workers, d.reward_timeout_s)
    options = dict(reward=d.reward, chat_template=cfg.task.chat_template, pool=pool)
    task = DatasetTask(load_rows(d.train_files, "data.train_files"), shuffle=d.shuffle, **options)
    if d.val_reward is not None and (not d.val_files or is_url(d.reward) or is_url(d.val_reward)):
        raise ValueError("data.val_reward: " + ("it scores data.val_files, which is empty" if not d.val_files else
                         "a reward server scores every row; use scorer names in data.reward and data.val_reward"))
    val_options = {**options, "reward": d.val_reward or d.reward}
    task.val = DatasetTask(load_rows(d.val_files, "data.val_files"), shuffle=False, **val_options) \
        if d.val_files else None
    if task.val is not None:  # the tiny model's alphabet covers the validation rows too
        task.extra_chars = task.val.chars
    return task


def conversation_task(cfg: RunConfig, kind: str) -> ConversationTask:
    """The SFT or pair rows of data.train_files (and data.val_files as its `val`)."""
    d = cfg.data
    task = ConversationTask.load(d.train_files, "data.train_files", kind, shuffle=d.shuffle, max_length=d.max_length)
    if d.val_files:
        task.val = ConversationTask.load(d.val_files, "data.val_files", kind, shuffle=False, max_length=d.max_length)
    return task


def fit_prompts(cfg: RunConfig, tokenizer: Any, task: Any, context: int | None = None) -> None:
    """Apply data.max_prompt_length to a DatasetTask's rows (and its validation rows) with the run's tokenizer;
    without it, refuse rows none of which fits the model's `context` (max_position_embeddings) with the response."""
    limit = cfg.data.max_prompt_length
    if context is not None and cfg.rollout.max_new_tokens >= context:
        raise ValueError(f"roles.rollout.max_new_tokens={cfg.rollout.max_new_tokens} leaves no room for a prompt in "
                         f"the model's context of {context} tokens (max_position_embeddings); set it below {context}")
    if not isinstance(task, DatasetTask):
        return
    if limit is None:
        if context is not None:
            _some_prompt_fits(cfg, tokenizer, task, context - cfg.rollout.max_new_tokens)
        return
    for t in (task, task.val):
        if t is not None:
            t.limit_prompt_length(lambda p: encode_prompt(tokenizer, p, cfg.task.chat_template), limit,
                                  cfg.data.truncation)


def _some_prompt_fits(cfg: RunConfig, tokenizer: Any, task: DatasetTask, room: int) -> None:
    """One line when every prompt is longer than `room` tokens (the first that fits ends the search)."""
    encode = lambda p: encode_prompt(tokenizer, p, cfg.task.chat_template)  # noqa: E731
    if not any(len(encode(row["prompt"] if task.chat_template else prompt_text(row["prompt"]))) <= room
               for row in task.rows):
        raise ValueError(f"data.train_files: all {len(task.rows)} prompts are longer than the {room} tokens the "
                         f"model's context leaves (max_position_embeddings less roles.rollout.max_new_tokens="
                         f"{cfg.rollout.max_new_tokens}); use shorter prompts or a longer-context model")


def eval_task(task: Any, prompts_per_rank: int, world: int) -> tuple[Any, int]:
    """The task the evaluation draws its fixed prompts from, and how many per rank (the validation rows,
    each once, when there are any)."""
    val = task.val if isinstance(task, (DatasetTask, ConversationTask)) else None
    if val is None:
        return task, prompts_per_rank
    return val, max(1, min(prompts_per_rank, len(val) // world))

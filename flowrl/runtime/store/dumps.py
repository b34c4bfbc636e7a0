"""Generation dumps: the rows a step trained on, or an evaluation scored, as JSON lines (verl's rollout and
validation data dirs).

`debug.dump_rollouts_every = k` writes every k-th step's batch to `output_dir/rollouts/step_NNNNNN.jsonl`,
`debug.dump_eval` each evaluation's to `output_dir/eval/step_NNNNNN.jsonl` (under torchrun every rank
writes its own rows, `.rankR` before the suffix). One row per line: `prompt` and `response` (decoded,
special tokens dropped), `reward` (the row's score, or null), `advantages` (the advantage of each
response token, or null), `policy_version` (the oldest weights that sampled it), `trained_version` (the weights
it trained, behind fl.buffer; else null), `step` and `uid`; `datasets.Dataset.from_json` reads a file
back. A file stops at `debug.dump_max_rows` rows or `debug.dump_max_bytes` bytes, whichever comes first;
the rows left out are logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from tensordict import TensorDict

from flowrl.config import DebugConfig
from flowrl.engines.models.folders import load_tokenizer
from flowrl.roles.reward import decode_responses

log = logging.getLogger(__name__)


def rows(batch: TensorDict, tokenizer: Any, step: int) -> list[dict[str, Any]]:
    """The batch as dump rows (see the module doc)."""
    keys = set(batch.keys())
    prompts = [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
               for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"])]
    responses = decode_responses(tokenizer, batch) if "response_ids" in keys else [None] * len(prompts)
    rewards = batch["scores"].tolist() if "scores" in keys else [None] * len(prompts)
    versions = batch["policy_version"].tolist() if "policy_version" in keys else [None] * len(prompts)
    advantages: list[Any] = [None] * len(prompts)
    if "advantages" in keys:
        mask = batch["response_mask"].bool()
        advantages = [[round(a, 6) for a in row[m].tolist()] for row, m in zip(batch["advantages"], mask)]
    uids = batch["uid"].tolist() if "uid" in keys else [None] * len(prompts)
    trained = batch["trained_version"].tolist() if "trained_version" in keys else [None] * len(prompts)
    return [dict(prompt=p, response=r, reward=w, advantages=a, policy_version=v, trained_version=t, step=step, uid=u)
            for p, r, w, a, v, t, u in zip(prompts, responses, rewards, advantages, versions, trained, uids)]


@dataclass
class Dumps:
    """Writes dump files under `folder` (see the module doc); `tokenizer` decodes the rows."""

    folder: Path
    tokenizer: Any
    max_rows: int = 1024
    max_bytes: int = 8_000_000

    def write(self, kind: str, batch: TensorDict, step: int) -> Path:
        """`kind`/step_NNNNNN.jsonl with the batch's rows, bounded; returns its path."""
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        path = self.folder / kind / f"step_{step:06d}{f'.rank{rank}' if rank else ''}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines, size = [], 0
        all_rows = rows(batch, self.tokenizer, step)
        for row in all_rows[:self.max_rows]:
            line = json.dumps(row, ensure_ascii=False) + "\n"
            if size + len(line.encode()) > self.max_bytes:
                break
            lines.append(line)
            size += len(line.encode())
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(lines))
        tmp.replace(path)
        if len(lines) < len(all_rows):
            log.warning("dump %s: wrote %d of %d rows (debug.dump_max_rows=%d, debug.dump_max_bytes=%d)", path,
                        len(lines), len(all_rows), self.max_rows, self.max_bytes)
        return path


def rollouts(dumper: Dumps | None, debug: DebugConfig, batch: TensorDict, step: int) -> None:
    """After step `step`: its batch to rollouts/ when debug.dump_rollouts_every says so."""
    every = debug.dump_rollouts_every
    if dumper is not None and every and step % every == 0:
        dumper.write("rollouts", batch, step)


def from_config(debug: DebugConfig, output_dir: Path, model_path: Path) -> Dumps | None:
    """The run's dump writer into `output_dir`, or None when it dumps nothing."""
    if not debug.dump_rollouts_every and not debug.dump_eval:
        return None
    return Dumps(output_dir, load_tokenizer(model_path), debug.dump_max_rows, debug.dump_max_bytes)

"""Prompt streams: endless, deterministic, resumable batches of task prompts."""

from __future__ import annotations

from typing import Any, Iterator

from tensordict import TensorDict

from flowrl.data.batch import prompt_batch
from flowrl.data.scoring.pool import call_with_deadline


class PromptStream(Iterator[TensorDict]):
    """Yields prompt batches; prompt i is task.example(seed, i), its uid is i.

    With several ranks each takes every world_size-th prompt, so groups never
    straddle ranks. `state()`/`restore()` carry the position across a resume.
    """

    def __init__(self, task: Any, tokenizer: Any, batch_size: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1, chat_template: bool = False,
                 example_timeout_s: float | None = None):
        if batch_size < 1:
            raise ValueError(f"train.batch_size must be >= 1, got {batch_size}")
        self.task, self.tokenizer, self.batch_size = task, tokenizer, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.next_index = 0
        self.chat_template, self.example_timeout_s = chat_template, example_timeout_s
        if chat_template and not tokenizer.chat_template:
            raise ValueError("task.chat_template: the tokenizer has no chat template")

    def __next__(self) -> TensorDict:
        start = self.next_index
        uids = [(start + i) * self.world_size + self.rank for i in range(self.batch_size)]
        self.next_index += self.batch_size
        examples = self._examples(uids)
        ids = [self._encode_row(uid, text) for uid, (text, _) in zip(uids, examples)]
        meta = {key: [m[key] for _, m in examples] for key in self.task.meta_keys}
        return prompt_batch(ids, self.tokenizer.pad_token_id, uids, meta)

    def _examples(self, uids: list[int]) -> list[tuple[Any, dict[str, Any]]]:
        """task.example for each uid, under one deadline (example_timeout_s, the reward's): a task that never
        returns, or raises, stops the run in one line naming the task and the row."""
        task, current = f"{type(self.task).__module__}:{type(self.task).__qualname__}", {"uid": uids[0]}

        def run() -> list[tuple[Any, dict[str, Any]]]:
            out = []
            for uid in uids:
                current["uid"] = uid
                try:
                    out.append(self.task.example(self.seed, uid))
                except Exception as err:  # the user's task: name it and the row, in one line
                    raise ValueError(f"task {task}: example(seed={self.seed}, index={uid}) raised "
                                     f"{type(err).__name__}: {err}") from None
            return out

        try:
            return call_with_deadline(run, (), self.example_timeout_s, "")
        except TimeoutError:
            raise TimeoutError(f"task {task}: example(seed={self.seed}, index={current['uid']}) did not return "
                               f"within {self.example_timeout_s:g} s (data.reward_fn_timeout_s); the run stops "
                               f"here") from None

    def _encode_row(self, uid: int, prompt: str | list[dict[str, str]]) -> list[int]:
        """The prompt's tokens; one line naming the row when the tokenizer cannot encode it."""
        try:
            ids = self._encode(prompt)
        except Exception as err:  # tokenizers raise their own exception types
            raise ValueError(f"prompt {uid} ({str(prompt)[:80]!r}): the tokenizer cannot encode it: "
                             f"{' '.join(str(err).split())}") from None
        if not ids and getattr(self.task, "needs_prompt_tokens", True):
            raise ValueError(f"prompt {uid} of task {type(self.task).__module__}:{type(self.task).__qualname__} "
                             f"({str(prompt)[:80]!r}) encodes to no tokens; a prompt needs at least one")
        return ids

    def _encode(self, prompt: str | list[dict[str, str]]) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    def state(self) -> dict[str, int]:
        return {"next_index": self.next_index}

    def restore(self, state: dict[str, int]) -> None:
        self.next_index = int(state["next_index"])


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, str]], chat_template: bool) -> list[int]:
    """Token ids of a prompt: text as is, or (chat_template) chat messages, a text being one user turn,
    ending where the assistant's reply starts."""
    if chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                  return_dict=False))
    if not isinstance(prompt, str):
        raise ValueError("task.chat_template: a prompt of chat messages needs task.chat_template=true")
    return tokenizer.encode(prompt, add_special_tokens=False)

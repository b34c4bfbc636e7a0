"""Conversation data for SFT and preference pairs for reward-model training, in verl's schemas.

SFT rows (verl's SFT datasets): a `messages` column of chat messages ({role, content}; the multi-turn
dataset), or `prompt` and `response` columns (strings, or a prompt of messages; the single-turn one).
Pair rows: `chosen` and `rejected` responses (strings or messages) with an optional `prompt`.

`encode_conversation` turns messages into token ids and a mask that is 1 on the assistant's tokens
only: with the tokenizer's chat template, the conversation is rendered prefix by prefix (verl's
multi-turn SFT dataset does the same), so an assistant turn's tokens are those its message adds after
the generation prompt (its end-of-turn token included); without a template (the tiny model) the
contents are joined, each assistant turn followed by eos. Prompt index i of a PromptStream is row
i mod len(rows), shuffled per epoch as flowrl.data.dataset does.
"""

from __future__ import annotations

import json
import random
from typing import Any

from flowrl.data.dataset import read_table, table_rows

Messages = list[dict[str, str]]


def as_messages(value: Any, role: str, where: str) -> Messages:
    """A string as one message of `role`, or checked chat messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m and "content" in m
                                                 for m in value):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    raise ValueError(f"{where}: expected a string or a list of chat messages with 'role' and 'content'")


def sft_messages(raw: dict[str, Any], where: str) -> Messages:
    """An SFT row's conversation: its `messages`, or `prompt` then `response` as the assistant's turn."""
    if raw.get("messages") is not None:
        messages = as_messages(raw["messages"], "user", f"{where}: 'messages'")
    elif raw.get("prompt") is not None and raw.get("response") is not None:
        messages = as_messages(raw["prompt"], "user", f"{where}: 'prompt'") + \
            as_messages(raw["response"], "assistant", f"{where}: 'response'")
    else:
        raise ValueError(f"{where}: an SFT row needs 'messages', or 'prompt' and 'response'")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: the conversation has no assistant turn to train on")
    return messages


def pair_messages(raw: dict[str, Any], where: str) -> tuple[Messages, Messages, Messages]:
    """A preference row's (prompt, chosen, rejected) messages; the responses are assistant turns."""
    for key in ("chosen", "rejected"):
        if raw.get(key) is None:
            raise ValueError(f"{where}: a preference row needs 'chosen' and 'rejected'")
    prompt = [] if raw.get("prompt") is None else as_messages(raw["prompt"], "user", f"{where}: 'prompt'")
    return (prompt, as_messages(raw["chosen"], "assistant", f"{where}: 'chosen'"),
            as_messages(raw["rejected"], "assistant", f"{where}: 'rejected'"))


def table_kind(files: list[str], field: str) -> str:
    """'sft', 'pairs' or 'prompts' (verl's RL schema) by the first file's columns."""
    columns = set(read_table(files[0], field).column_names)
    if {"chosen", "rejected"} <= columns:
        return "pairs"
    if "messages" in columns or ({"prompt", "response"} <= columns and "reward_model" not in columns):
        return "sft"
    return "prompts"


class ConversationTask:
    """SFT conversations or preference pairs as a task: each prompt row carries its data as JSON metadata
    (`conversation`, or `pair`), which the `conversations` role encodes; there is nothing to reward."""

    needs_prompt_tokens = False  # the prompt rows are empty: nothing is generated from them

    def __init__(self, rows: list[Any], kind: str, shuffle: bool = True, max_length: int | None = None):
        if kind not in ("sft", "pairs"):
            raise ValueError(f"kind must be 'sft' or 'pairs', got {kind!r}")
        if not rows:
            raise ValueError("a conversation task needs at least one row")
        self.rows, self.kind, self.shuffle, self.max_length = rows, kind, shuffle, max_length
        self.meta_keys = ("conversation",) if kind == "sft" else ("pair",)
        self.val: ConversationTask | None = None
        self._order: tuple[tuple[int, int], list[int]] | None = None

    @classmethod
    def load(cls, files: list[str], field: str, kind: str, **options: Any) -> "ConversationTask":
        parse = sft_messages if kind == "sft" else pair_messages
        rows = [parse(raw, where) for name in files for where, raw in table_rows(name, field)]
        if not rows:
            raise ValueError(f"{field}: no rows in {files}")
        return cls(rows, kind, **options)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def chars(self) -> str:
        """The alphabet of the built-in tiny model: every character of every message (and the validation's)."""
        rows = self.rows + (self.val.rows if self.val is not None else [])
        text = json.dumps(rows, ensure_ascii=False)  # the roles and contents, and a few JSON marks
        return "".join(sorted(set(text)))

    def example(self, seed: int, index: int) -> tuple[str, dict[str, Any]]:
        epoch, pos = divmod(index, len(self.rows))
        if self.shuffle:
            if self._order is None or self._order[0] != (seed, epoch):
                order = list(range(len(self.rows)))
                random.Random(seed * 1_000_003 + epoch).shuffle(order)
                self._order = ((seed, epoch), order)
            pos = self._order[1][pos]
        return "", {self.meta_keys[0]: json.dumps(self.rows[pos])}

    def reward(self, responses: list[str], meta: list[dict[str, Any]]) -> list[float]:
        raise ValueError("an SFT or preference data set has no reward; train it with `flowrl train sft` or "
                         "`flowrl train rm`")


def render_chat(tokenizer: Any, messages: Messages, generation_prompt: bool) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                              return_dict=False))


def encode_conversation(tokenizer: Any, messages: Messages) -> tuple[list[int], list[int]]:
    """(token ids, 1 on the assistant's tokens); see the module doc."""
    if not tokenizer.chat_template:
        ids: list[int] = []
        mask: list[int] = []
        for m in messages:
            tokens = tokenizer.encode(m["content"], add_special_tokens=False)
            assistant = m["role"] == "assistant"
            tokens += [tokenizer.eos_token_id] if assistant else []
            ids, mask = ids + tokens, mask + [int(assistant)] * len(tokens)
        return ids, mask
    ids, mask = [], []
    for i, m in enumerate(messages):
        start = render_chat(tokenizer, messages[:i], True) if m["role"] == "assistant" and i else ids
        full = render_chat(tokenizer, messages[:i + 1], False)
        if full[:len(ids)] != ids or full[:len(start)] != start:
            raise ValueError(f"the chat template renders turn {i} of a conversation differently once later turns "
                             f"follow (it rewrites earlier turns), so the assistant's tokens cannot be found")
        mask += [0] * (len(start) - len(ids)) + [int(m["role"] == "assistant")] * (len(full) - len(start))
        ids = full
    return ids, mask

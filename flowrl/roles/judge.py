"""A generative judge: a reward role that asks a language model to rate each response and parses its score.

Bind it to an algorithm's `reward` parameter with `roles.reward=llm_judge`. Each row's prompt and response
(decoded with the policy's tokenizer, special tokens dropped) fill the section's `template`
(`roles.reward.template`) at `{prompt}` and `{response}`; the text goes to the judge model as a user turn of
its chat template (as it is without one), the judge answers greedily on a rollout engine of its own (the
section's `engine`, starting from roles.rollout's: hf, hf_static or vllm), and the first number of its
answer, s, scores the row s / `max_score` when 0 <= s <= max. An answer with no number, or one out of range,
scores 0 and counts in `judge/parse_failures` (and `judge/parse_failure_rate`): a judge that rambles never
stops the run. The judge model is
model.reward_path when set (a generative model folder sharing nothing with the policy), else the
policy's starting weights, frozen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from pydantic import Field, field_validator

from flowrl import metrics
from flowrl.data.batch import left_pad
from flowrl.engines.models.folders import load_tokenizer
from flowrl.engines.protocols import RolloutEngine, SamplingParams
from flowrl.graph.role import graph_method, role
from flowrl.roles.configs import GeneratorConfig
from flowrl.roles.context import BuildContext
from flowrl.roles.reward import decode_responses

TEMPLATE = ("Rate how well the response answers the prompt, from 0 (useless) to 10 (perfect). Reply with the "
            "number only.\n\nPrompt: {prompt}\n\nResponse: {response}\n\nScore:")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class JudgeSettings:
    """The judge's prompt and parsing (its section's template, max_score, answer_tokens)."""

    template: str = TEMPLATE
    max_score: float = 10.0
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        if "{response}" not in self.template:
            raise ValueError("template: it must contain {response} (and usually {prompt})")
        if not self.max_score > 0 or self.max_new_tokens < 1:
            raise ValueError(f"max_score must be > 0 and answer_tokens >= 1, got {self.max_score} and "
                             f"{self.max_new_tokens}")

    def render(self, prompt: str, response: str) -> str:
        """The template with the row filled in (plain replacement: other braces in it stay as they are)."""
        return self.template.replace("{prompt}", prompt).replace("{response}", response)


def parse_score(text: str, max_score: float) -> float | None:
    """The first number of `text` over max_score, if it lies in [0, max_score]; else None."""
    found = NUMBER.search(text)
    if found is None:
        return None
    value = float(found.group())
    return value / max_score if 0 <= value <= max_score else None


def _scores_key(key: str = "scores", **_: Any) -> tuple[str, ...]:
    return (key,)


class JudgeConfig(GeneratorConfig):
    """The judge's section (roles.llm_judge, or the name bound to it: roles.reward=llm_judge)."""

    template: str | None = Field(None, description="The judge's prompt: {prompt} and {response} are replaced by "
                                 "the row's; None: flowrl.roles.judge.TEMPLATE, a 0-10 rating.")
    max_score: float = Field(10.0, gt=0, description="The top score: a parsed score s in [0, max] rewards s / max; "
                             "no number, or one out of range, rewards 0 (counted).")
    answer_tokens: int = Field(8, ge=1, description="Tokens the judge may answer with.")

    @field_validator("template")
    @classmethod
    def _fills_a_response(cls, value: str | None) -> str | None:
        if value is not None and "{response}" not in value:
            raise ValueError("the template must contain {response} (and usually {prompt})")
        return value

    def settings(self) -> JudgeSettings:
        return JudgeSettings(self.template or TEMPLATE, self.max_score, self.answer_tokens)


@role("llm_judge", engines=("rollout",), config=JudgeConfig)
@dataclass
class Judge:
    engine: RolloutEngine
    tokenizer: Any  # the judge model's
    policy_tokenizer: Any  # what the batch's tokens decode with
    settings: JudgeSettings = field(default_factory=JudgeSettings)

    @classmethod
    def build(cls, ctx: BuildContext) -> "Judge":
        source = ctx.reward_model or ctx.model
        tokenizer = load_tokenizer(source.path)
        engine = ctx.config.engine.build(source, tokenizer=tokenizer, device=ctx.device, share=None)
        return cls(engine, tokenizer, ctx.tokenizer, ctx.config.settings())

    @graph_method(reads=("prompt_ids", "prompt_mask", "response_ids", "response_mask"), writes=_scores_key)
    def score(self, batch: TensorDict, metric: str = "reward", key: str = "scores") -> TensorDict:
        """Each row's parsed score into `key`; logs `<metric>/mean` and the parse failures."""
        prompts = [self.policy_tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
                   for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"])]
        verdicts = self.verdicts(prompts, decode_responses(self.policy_tokenizer, batch))
        parsed = [parse_score(text, self.settings.max_score) for text in verdicts]
        failures = sum(p is None for p in parsed)
        batch[key] = torch.tensor([0.0 if p is None else p for p in parsed])
        metrics.log(f"{metric}/mean", batch[key].mean())
        metrics.log("judge/parse_failures", failures)
        metrics.log("judge/parse_failure_rate", failures / max(len(parsed), 1))
        return batch

    def verdicts(self, prompts: list[str], responses: list[str]) -> list[str]:
        """The judge model's greedy answers to the filled-in template, one per row."""
        texts = [self.settings.render(p, r) for p, r in zip(prompts, responses)]
        try:
            ids = self._encode(texts)
        except Exception as err:  # tokenizers raise their own types
            raise ValueError(f"template: the judge's tokenizer cannot encode the filled-in template "
                             f"({texts[0][:80]!r}): {' '.join(str(err).split())}") from None
        prompt_ids, prompt_mask = left_pad(ids, self.tokenizer.pad_token_id)
        params = SamplingParams(max_new_tokens=self.settings.max_new_tokens, greedy=True)
        out = self.engine.generate(prompt_ids, prompt_mask, params, seed=0)
        return [self.tokenizer.decode(row[mask.bool()].tolist(), skip_special_tokens=True)
                for row, mask in zip(out["response_ids"], out["response_mask"])]

    def _encode(self, texts: list[str]) -> list[list[int]]:
        if self.tokenizer.chat_template:
            return [list(self.tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=True,
                                                            add_generation_prompt=True, return_dict=False))
                    for t in texts]
        return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]

    def close(self) -> None:
        self.engine.close()

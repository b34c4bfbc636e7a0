"""The generative judge: its parser, scores from fixed verdicts (unparseable ones 0 and counted), the tiny model
judging through the HF rollout engine, and a GRPO step scored by it."""

import pytest
import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.config import load_run_config
from flowrl.data.batch import left_pad
from flowrl.engines.hf.configs import HFRolloutConfig
from flowrl.engines.configs import ModelSource
from flowrl.engines.models.folders import load_tokenizer
from flowrl.roles.judge import Judge, JudgeSettings, parse_score
from flowrl.runtime.trainer import train


@pytest.mark.parametrize("text, score", [("7", 0.7), (" Score: 3.5/10", 0.35), ("10", 1.0), ("0", 0.0),
                                         ("11", None), ("-1", None), ("n/a", None), ("", None),
                                         ("8 out of 10", 0.8)])
def test_parse_score(text, score):
    found = parse_score(text, 10.0)
    assert found == (None if score is None else pytest.approx(score))


class Verdicts:
    """A rollout engine answering each prompt with the next of fixed texts; records what it was asked."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.asked = tokenizer, texts, []

    def generate(self, prompt_ids, prompt_mask, params, *, seed=None):
        assert params.greedy and params.max_new_tokens == 8
        self.asked += [self.tokenizer.decode(ids[m.bool()].tolist()) for ids, m in zip(prompt_ids, prompt_mask)]
        ids, mask = left_pad([self.tokenizer.encode(t, add_special_tokens=False)[::-1] or [0] for t in self.texts], 0)
        # reversed rows left-padded, flipped: right-padded rows in order
        return TensorDict(response_ids=ids.flip(1), response_mask=mask.flip(1), batch_size=[len(self.texts)])

    def close(self):
        pass


def rows(tok, prompts, responses):
    prompt_ids, prompt_mask = left_pad([tok.encode(p, add_special_tokens=False) for p in prompts], tok.pad_token_id)
    response_ids, response_mask = left_pad([tok.encode(r, add_special_tokens=False)[::-1] for r in responses], 0)
    return TensorDict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids.flip(1),
                      response_mask=response_mask.flip(1), batch_size=[len(prompts)])


def test_scores_parse_the_verdicts_and_unparseable_ones_count_as_failures(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    engine = Verdicts(tok, ["7", "12", "+=", "35"])  # 0.7; 12 > 10: out of range; no number; 35 > 10 again
    judge = Judge(engine, tok, tok, JudgeSettings(template="{prompt}{response}=", max_new_tokens=8))
    batch = rows(tok, ["1+2=", "2+2=", "0+0=", "3+3="], ["3", "5", "0", "6"])
    with metrics.collect() as logged:
        out = judge.score(batch)
    assert out["scores"].tolist() == pytest.approx([0.7, 0.0, 0.0, 0.0])
    assert engine.asked == ["1+2=3=", "2+2=5=", "0+0=0=", "3+3=6="]  # the template, filled in per row
    assert logged["judge/parse_failures"] == 3 and logged["judge/parse_failure_rate"] == 0.75
    assert logged["reward/mean"] == pytest.approx(0.175)


def test_a_template_without_response_is_refused_at_load():
    with pytest.raises(ValueError, match=r"roles.llm_judge.template: .*must contain \{response\}"):
        load_run_config(None, ["roles.llm_judge.template=rate {prompt}"])


def test_the_tiny_model_judges_through_the_hf_rollout_engine(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    engine = HFRolloutConfig().build(ModelSource(tiny_model_path), tokenizer=tok, device="cpu")
    judge = Judge(engine, tok, tok, JudgeSettings(template="{prompt}{response}=", max_new_tokens=8))
    batch = rows(tok, ["1+2=", "2+2=", "4+0="], ["3", "4", "9"])
    with metrics.collect() as logged:
        scores = judge.score(batch)["scores"]
    verdicts = judge.verdicts(["1+2=", "2+2=", "4+0="], ["3", "4", "9"])  # greedy: the same answers again
    expected = [parse_score(v, 10.0) for v in verdicts]
    assert scores.tolist() == pytest.approx([0.0 if e is None else e for e in expected])
    assert logged["judge/parse_failures"] == sum(e is None for e in expected)
    assert ((scores >= 0) & (scores <= 1)).all() and scores.dtype == torch.float32


def test_grpo_trains_a_step_with_the_judge_as_its_reward(tmp_path):
    cfg = load_run_config(None, [
        "roles.reward=llm_judge", "roles.reward.template={prompt}{response}=", "train.steps=1", "train.batch_size=2",
        "algo.group_size=2", "algo.kl_coef=0", "eval.every=0", "checkpoint.export=false",
        "roles.rollout.max_new_tokens=4", f"train.output_dir={tmp_path}"])
    step = train(cfg, progress=False)[0]
    assert 0 <= step["judge/parse_failures"] <= 4 and 0.0 <= step["reward/mean"] <= 1.0
    assert "actor/pg_loss" in step

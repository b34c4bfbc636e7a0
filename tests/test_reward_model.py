"""A learned reward model scores each response at its last token."""

import pytest
import torch

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.data.batch import prompt_batch
from flowrl.config import load_run_config
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.models.folders import load_tokenizer, load_value_model
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.roles import RewardModel
from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.runtime.trainer import train


def save_reward_model(base_path, path):
    torch.manual_seed(1)
    model = load_value_model(base_path)
    torch.nn.init.normal_(model.score.weight, std=1.0)  # a head that tells responses apart
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reward_model_path(tiny_model_path, tmp_path_factory):
    """A reward model over the conftest tiny model's tokenizer."""
    return save_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm") / "model")


@pytest.fixture(scope="module")
def task_reward_model_path(tmp_path_factory):
    """A reward model sharing the arithmetic run's tokenizer (the task's alphabet)."""
    base = build_tiny_model(tmp_path_factory.mktemp("base") / "model", chars=ArithmeticTask.chars, seed=3)
    return save_reward_model(base, tmp_path_factory.mktemp("rm") / "model")


def test_scores_are_the_models_output_at_each_last_response_token(tiny_model_path, reward_model_path):
    tok = load_tokenizer(tiny_model_path)
    batch = prompt_batch([tok.encode(t, add_special_tokens=False) for t in ("1+2=", "13+4=")], tok.pad_token_id,
                         uids=[0, 1])
    batch["response_ids"] = torch.tensor([[5, 6, 1], [7, 1, 0]])
    batch["response_mask"] = torch.tensor([[1, 1, 1], [1, 1, 0]])
    model = load_value_model(reward_model_path)
    scored = RewardModel(engine=HFTrainEngine(model, HFTrainConfig(), kind="reward")).score(batch.clone())
    with torch.no_grad():
        for row, last in ((0, 2), (1, 1)):  # the last valid response token of each row
            ids = torch.cat([batch["prompt_ids"][row], batch["response_ids"][row]])
            mask = torch.cat([batch["prompt_mask"][row], batch["response_mask"][row]])
            logits = model(input_ids=ids[None], attention_mask=mask[None],
                           position_ids=(mask.cumsum(-1) - 1).clamp(min=0)[None]).logits[0, :, 0]
            position = batch["prompt_ids"].shape[1] + last
            torch.testing.assert_close(scored["scores"][row], logits[position], atol=1e-5, rtol=0)


def test_grpo_trains_against_a_reward_model(tmp_path, task_reward_model_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "train.steps=2", "train.batch_size=4",
                                 "eval.every=0", f"model.reward_path={task_reward_model_path}"])
    history = train(cfg, progress=False)
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(r["reward/mean"])) for r in history)
    assert history[0]["reward/mean"] not in (0.0, 1.0)  # a learned score, not the task's 0/1


def test_reward_model_errors_name_the_field(tmp_path, reward_model_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "model.reward_path=/nowhere"])
    with pytest.raises(ValueError, match="model.reward_path: '/nowhere' is not a Hugging Face model folder"):
        train(cfg, progress=False)
    other_vocab = load_run_config(None, [f"train.output_dir={tmp_path}", f"model.reward_path={reward_model_path}"])
    with pytest.raises(ValueError, match="model.reward_path: the reward model's vocab_size 17 differs"):
        train(other_vocab, progress=False)

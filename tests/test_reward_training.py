"""Reward-model training as a graph: the Bradley-Terry loss by hand, pairs as adjacent rows, a short run whose
held-out pair accuracy rises, and its export scoring GRPO's responses as model.reward_path."""

import json
import random

import pytest
import torch
from tensordict import TensorDict

from flowrl.config import load_run_config
from flowrl.data.batch import prompt_batch
from flowrl.engines.models.folders import load_tokenizer, load_value_model
from flowrl.data.conversations import encode_conversation
from flowrl.rl.sft_loss import BradleyTerryLoss, bradley_terry, pair_margins
from flowrl.roles.conversations import Conversations
from flowrl.runtime.trainer import train


def test_bradley_terry_by_hand():
    scores = torch.tensor([2.0, 0.0, 1.0, 3.0])
    group, preference = torch.tensor([5, 5, 9, 9]), torch.tensor([1, -1, 1, -1])
    margins = pair_margins(scores, group, preference)
    assert margins.tolist() == [2.0, -2.0]
    # (softplus(-2) + softplus(2)) / 2 = (0.126928 + 2.126928) / 2
    assert bradley_terry(margins).item() == pytest.approx(1.126928, abs=1e-6)
    out = {"scores": torch.tensor([[0.0, 2.0], [0.0, 0.0], [1.0, 9.0], [7.0, 3.0]])}  # last tokens: 2, 0, 1, 3
    mb = TensorDict(group=group, preference=preference, response_mask=torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]]),
                    batch_size=[4])
    loss, logged = BradleyTerryLoss(center_coef=0.5)(out, mb)
    assert loss.item() == pytest.approx(1.126928 + 0.5 * (4 + 0 + 1 + 9) / 4, abs=1e-6)  # + 0.5 * 3.5
    assert logged["accuracy"].item() == 0.5 and BradleyTerryLoss().weight(mb) == 2
    with pytest.raises(AssertionError, match="same micro-batch"):
        pair_margins(scores[:3], group[:3], preference[:3])


def write_pairs(path, rows, seed):
    """Prompts as the arithmetic task writes them; chosen: the sum, rejected: '=' marks as long as it."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            a, b = rng.randint(0, 4), rng.randint(0, 4)
            answer = str(a + b)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": answer, "rejected": "=" * len(answer)}) + "\n")
    return path


def test_pairs_become_adjacent_rows_with_their_group_and_preference(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    pair = json.dumps([[{"role": "user", "content": "1+2="}], [{"role": "assistant", "content": "3"}],
                       [{"role": "assistant", "content": "="}]])
    rows = Conversations(tok).encode_pairs(prompt_batch([[], []], 0, [4, 7], {"pair": [pair, pair]}))
    assert rows["group"].tolist() == [4, 4, 7, 7] and rows["preference"].tolist() == [1, -1, 1, -1]
    ids, _ = encode_conversation(tok, [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "="}])
    assert rows["prompt_ids"][1].tolist() + rows["response_ids"][1].tolist() == ids  # "1+2=" | "=<eos>"


def test_rm_accuracy_on_held_out_pairs_rises_and_grpo_scores_with_it(tmp_path):
    train_file, val_file = write_pairs(tmp_path / "train.jsonl", 64, 0), write_pairs(tmp_path / "val.jsonl", 16, 1)
    out = tmp_path / "rm"
    cfg = load_run_config(None, [
        "algorithm=rm", f"data.train_files={train_file}", f"data.val_files={val_file}", "train.steps=12",
        "train.batch_size=16", "roles.learned_reward.mini_batch_size=32",
        "roles.learned_reward.micro_batch_size=32", "eval.every=12",
        "eval.prompts=16", "roles.actor.lr=3e-3", f"train.output_dir={out}"])
    history = train(cfg, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0]["eval/rm/accuracy"], rows[-1]["eval/rm/accuracy"]
    assert first <= 0.75 and last == 1.0, (first, last)
    assert history[-1]["rm/bt_loss"] < history[0]["rm/bt_loss"]

    # the export is a reward model folder: the chosen answer scores above the junk, and GRPO trains with it
    tok, model = load_tokenizer(out / "final"), load_value_model(out / "final")
    with torch.no_grad():
        scores = [model(torch.tensor([tok.encode(text) + [tok.eos_token_id]])).logits[0, -1, 0].item()
                  for text in ("3+4=7", "3+4==")]
    assert scores[0] > scores[1]
    grpo = load_run_config(None, [
        "algorithm=grpo", f"model.path={out / 'tiny-model'}", f"model.reward_path={out / 'final'}", "train.steps=1",
        "train.batch_size=2", "algo.group_size=2", "algo.kl_coef=0", "eval.every=0", "checkpoint.export=false",
        "roles.rollout.max_new_tokens=4", f"train.output_dir={tmp_path / 'grpo'}"])
    step = train(grpo, progress=False)[0]
    assert step["reward/mean"] != 0.0 and "actor/pg_loss" in step

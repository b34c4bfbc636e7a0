"""Data sets in verl's schema: loading, shuffled epochs, resume, prompt-length limits, a short training run."""

import json
import logging

import datasets
import pytest

from flowrl.config import load_run_config
from flowrl.data import PromptStream
from flowrl.data.dataset import DatasetTask, load_rows
from flowrl.data.scoring.pool import ScoringPool
from flowrl.engines.train.sharded_checkpoint import read_model
from flowrl.runtime.data_tasks import run_task
from flowrl.runtime.trainer import train
from fakes import FakeTokenizer
from crash import train_until_crash


def row(i, prompt=None, source="exact", truth=None):
    return {"data_source": source, "prompt": prompt or [{"role": "user", "content": f"{i}+0="}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth or str(i)},
            "extra_info": {"index": i}}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_parquet_jsonl_and_saved_folder_give_the_same_rows(tmp_path):
    rows = [row(i) for i in range(3)]
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "d.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    files = [str(tmp_path / "d.parquet"), write_jsonl(tmp_path / "d.jsonl", rows), str(tmp_path / "saved")]
    loaded = [load_rows([f], "data.train_files") for f in files]
    assert all([r["ground_truth"] for r in got] == ["0", "1", "2"] for got in loaded)
    assert all(got[1]["prompt"] == [{"role": "user", "content": "1+0="}] for got in loaded)
    assert loaded[1][2]["where"] == f"{files[1]} row 2" and json.loads(loaded[0][2]["extra_info"]) == {"index": 2}
    both = load_rows(files[:2], "data.train_files")
    assert len(both) == 6


@pytest.mark.parametrize("bad, message", [
    ({"prompt": "x", "reward_model": {"ground_truth": "1"}}, r"d.jsonl row 1: missing 'data_source'"),
    ({"data_source": "s", "prompt": "x", "reward_model": {"style": "rule"}}, r"d.jsonl row 1: 'reward_model' must"),
    ({"data_source": "s", "prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}},
     r"d.jsonl row 1: 'prompt' must be a string or a list of chat messages"),
])
def test_a_bad_row_is_named(tmp_path, bad, message):
    good = {"data_source": "s", "prompt": "x", "reward_model": {"ground_truth": "1"}}
    path = write_jsonl(tmp_path / "d.jsonl", [good, bad])
    with pytest.raises(ValueError, match=message):
        load_rows([path], "data.train_files")


def test_missing_and_foreign_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"data.val_files: no such file or folder '.*nope.parquet'"):
        load_rows([str(tmp_path / "nope.parquet")], "data.val_files")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"is not .parquet, .jsonl or a saved datasets folder"):
        load_rows([str(tmp_path / "d.csv")], "data.train_files")


def task_of(n, **kw):
    rows = [{"prompt": f"{i}+0=", "data_source": "exact", "ground_truth": str(i), "extra_info": "null",
             "where": f"d row {i}"} for i in range(n)]
    return DatasetTask(rows, reward="exact_match", pool=ScoringPool(0), **kw)


def test_epochs_shuffle_by_seed_and_a_resumed_stream_continues_at_the_same_row():
    task = task_of(5)
    epoch0 = [task.example(seed=3, index=i)[1]["ground_truth"] for i in range(5)]
    epoch1 = [task.example(seed=3, index=i)[1]["ground_truth"] for i in range(5, 10)]
    assert sorted(epoch0) == sorted(epoch1) == ["0", "1", "2", "3", "4"]  # each epoch visits every row once
    assert epoch0 != epoch1 and epoch0 != [task.example(seed=4, index=i)[1]["ground_truth"] for i in range(5)]
    assert task.position(3, 7) == (1, int(epoch1[2]))
    assert [task_of(5, shuffle=False).example(0, i)[1]["ground_truth"] for i in range(6)] == list("012340")
    stream = PromptStream(task, FakeTokenizer(), batch_size=3, seed=3)
    next(stream), next(stream)
    state, expected = stream.state(), next(stream)
    resumed = PromptStream(task_of(5), FakeTokenizer(), batch_size=3, seed=3)
    resumed.restore(state)
    got = next(resumed)
    assert got["uid"].tolist() == [6, 7, 8] and list(got["ground_truth"]) == list(expected["ground_truth"])
    assert list(got["ground_truth"]) == epoch1[1:4]


def test_over_long_prompts_are_dropped_with_a_count_or_refused_naming_the_row(caplog):
    rows = [{"prompt": "1" * n, "data_source": "exact", "ground_truth": "1", "extra_info": "null",
             "where": f"d.parquet row {i}"} for i, n in enumerate([3, 9, 4, 12])]
    task = DatasetTask(list(rows), reward="exact_match", pool=ScoringPool(0))
    with caplog.at_level(logging.WARNING):
        assert task.limit_prompt_length(list, 4) == 2
    assert [r["where"] for r in task.rows] == ["d.parquet row 0", "d.parquet row 2"]
    assert "dropped 2 of 4 prompts longer than data.max_prompt_length=4" in caplog.text
    strict = DatasetTask(list(rows), reward="exact_match", pool=ScoringPool(0))
    with pytest.raises(ValueError, match=r"data.max_prompt_length: d.parquet row 1 has a 9-token prompt, above 4"):
        strict.limit_prompt_length(list, 4, truncation="error")


def test_rows_without_a_scorer_fail_at_load(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [row(0, source="my/source")])
    with pytest.raises(ValueError, match=r"d.jsonl row 0 has data_source 'my/source', which no built-in scorer"):
        run_task(load_run_config(None, [f"data.train_files={path}"]))
    with pytest.raises(ValueError, match=r"data.reward: unknown scorer 'nonsense'"):
        run_task(load_run_config(None, [f"data.train_files={path}", "data.reward=nonsense"]))


def test_training_on_a_data_set_with_validation_rows(tmp_path):
    train_rows = [row(i, prompt=f"{i}+{j}=", truth=str(i + j)) for i in range(4) for j in range(4)]
    train_rows.append(row(99, prompt="1+1+1+1+1+1+1+1+1+1=", truth="10"))  # 20 tokens: dropped
    val_rows = [row(i, prompt=f"{i}+1=", truth=str(i + 1)) for i in range(3)]
    cfg = load_run_config(None, [f"train.output_dir={tmp_path / 'out'}", "train.steps=2", "train.batch_size=4",
                                 "eval.every=1", "algo.group_size=2", "roles.rollout.max_new_tokens=3",
                                 f"data.train_files={write_jsonl(tmp_path / 't.jsonl', train_rows)}",
                                 f"data.val_files={write_jsonl(tmp_path / 'v.jsonl', val_rows)}",
                                 "data.reward=exact_match", "data.max_prompt_length=8", "data.reward_workers=2",
                                 "eval.samples=3"])
    history = train(cfg, progress=False)
    assert [r["step"] for r in history] == [1, 2]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in history)
    for r in history:  # every validation row is data_source "exact": its metrics equal the overall ones
        assert r["eval/exact/greedy"] == r["eval/reward/mean"] and r["eval/exact/mean@3"] == r["eval/mean@3"]
        assert r["eval/mean@3"] == pytest.approx(r["eval/sampled/mean"]) and 0.0 <= r["eval/pass@3"] <= 1.0
        assert r["eval/pass@3"] >= r["eval/mean@3"] - 1e-6  # 0/1 scores: a prompt's mean is at most its max


def test_the_evaluation_scores_with_data_val_reward_and_training_with_data_reward(tmp_path):
    """gsm8k_format gives a wrong `#### n` 0.1 in training; data.val_reward=gsm8k scores the validation rows
    strictly, though the run's one reward role calls the training task's reward function on them."""
    rows = [row(i, source="openai/gsm8k", truth="7") for i in range(2)]
    files = [f"data.train_files={write_jsonl(tmp_path / 't.jsonl', rows)}",
             f"data.val_files={write_jsonl(tmp_path / 'v.jsonl', rows)}", "data.reward=gsm8k_format"]
    task = run_task(load_run_config(None, [*files, "data.val_reward=gsm8k", "data.reward_workers=0"]))
    answers = ["so #### 5", "so #### 7"]  # wrong then right
    train_meta = [task.example(0, i)[1] for i in range(2)]
    val_meta = [task.val.example(0, i)[1] for i in range(2)]
    assert task.reward(answers, train_meta) == [0.1, 1.0] and task.reward(answers, val_meta) == [0.0, 1.0]
    same = run_task(load_run_config(None, [*files, "data.reward_workers=0"]))  # no val_reward: data.reward
    assert same.reward(answers, [same.val.example(0, i)[1] for i in range(2)]) == [0.1, 1.0]
    with pytest.raises(ValueError, match=r"^data.val_reward: it scores data.val_files, which is empty$"):
        run_task(load_run_config(None, [files[0], "data.val_reward=gsm8k"]))


def test_cli_names_a_missing_data_file_in_one_line(tmp_path, capsys):
    from flowrl.cli import main

    code = main(["train", "--output-dir", str(tmp_path), "--set", f"data.train_files={tmp_path}/nope.parquet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"flowrl: error: data.train_files: no such file or folder '{tmp_path}/nope.parquet'"


def test_a_resumed_data_set_run_continues_at_the_same_rows(tmp_path):
    """6 rows, 4 prompts a step: epochs end mid-step; a crash after step 3 resumes from step 2's checkpoint."""
    import torch

    rows = [row(i, prompt=f"{i}+{i}=", truth=str(2 * i)) for i in range(6)]
    path = write_jsonl(tmp_path / "t.jsonl", rows)

    def cfg(out):
        return load_run_config(None, [f"train.output_dir={out}", "train.steps=4", "checkpoint.every=2",
                                      "train.batch_size=4", "eval.every=0", "algo.group_size=2",
                                      "roles.rollout.max_new_tokens=2", f"data.train_files={path}",
                                      "data.reward=exact_match", "data.reward_workers=0",
                                      "roles.actor.lr_schedule=linear", "roles.actor.lr_decay_steps=8"])

    straight = train(cfg(tmp_path / "a"), progress=False)

    train_until_crash(cfg(tmp_path / "b"), 3)
    resumed = train(cfg(tmp_path / "b"), progress=False)
    assert [r["step"] for r in resumed] == [3, 4]
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert [r[key] for r in resumed] == [r[key] for r in straight[2:]], key
    lrs = [r["actor/lr"] for r in straight]
    assert all(a > b for a, b in zip(lrs, lrs[1:])), lrs  # linear decay over the run's optimizer steps
    a, b = (read_model(tmp_path / run / "checkpoints/step_000004/actor")
            for run in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)

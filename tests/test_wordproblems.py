"""`flowrl data wordproblems`: seeded arithmetic word problems in GSM8K's raw format, through the gsm8k converter."""

import json
import re

import pytest

from flowrl.cli import main
from flowrl.data.dataset import DatasetTask, load_rows
from flowrl.data.prepare import GSM8K_INSTRUCTION
from flowrl.data.scoring.pool import ScoringPool
from flowrl.data.builtin.wordproblems import KINDS, step, write

STEP = re.compile(r"(\d+) ([-+*]) (\d+) = <<(\d+)([-+*])(\d+)=(\d+)>>(\d+)")


def raw(folder, split):
    return [json.loads(line) for line in (folder / "raw" / f"{split}.jsonl").read_text().splitlines()]


def test_step_writes_gsm8k_notation():
    assert step(12, "+", 7) == ("12 + 7 = <<12+7=19>>19", 19)
    assert step(50, "-", 32) == ("50 - 32 = <<50-32=18>>18", 18)
    assert step(6, "*", 5) == ("6 * 5 = <<6*5=30>>30", 30)


def test_the_same_seed_writes_the_same_problems_and_test_is_disjoint_from_train(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        assert write(tmp_path / name, train_size=200, test_size=50, seed=seed) == {"train": 200, "test": 50}
    assert raw(tmp_path / "a", "train") == raw(tmp_path / "b", "train")
    assert raw(tmp_path / "a", "test") == raw(tmp_path / "b", "test")
    assert raw(tmp_path / "a", "train") != raw(tmp_path / "c", "train")
    train = {r["question"] for r in raw(tmp_path / "a", "train")}
    test = {r["question"] for r in raw(tmp_path / "a", "test")}
    assert len(train) == 200 and len(test) == 50 and not train & test


def test_every_worked_step_is_right_and_the_last_one_is_the_answer(tmp_path):
    write(tmp_path, train_size=300, test_size=20, seed=0)
    rows = raw(tmp_path, "train")
    for row in rows:
        steps = STEP.findall(row["answer"])
        assert steps, row
        for a, op, b, a2, op2, b2, c, c2 in steps:
            assert (a, op, b, c) == (a2, op2, b2, c2)
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(c) >= 0, row
        first = steps[0]
        assert f" {first[0]} " in f" {row['question']} " or f"${first[0]}" in row["question"], row
        assert row["answer"].endswith(f"\n#### {steps[-1][-1]}"), row
    kinds = {len(STEP.findall(r["answer"])) for r in rows}
    assert kinds == {1, 2} and len(KINDS) == 6  # one- and two-step problems both occur


def test_the_parquet_rows_are_gsm8k_rows_the_gsm8k_scorer_reads(tmp_path):
    write(tmp_path, train_size=20, test_size=5, seed=0)
    task = DatasetTask(load_rows([str(tmp_path / "test.parquet")], "data.val_files"), shuffle=False,
                       chat_template=True, pool=ScoringPool(0))
    originals = raw(tmp_path, "test")
    prompt, meta = task.example(0, 0)
    assert prompt == [{"role": "user", "content": f"{originals[0]['question']} {GSM8K_INSTRUCTION}"}]
    assert meta["data_source"] == "openai/gsm8k" and json.loads(meta["extra_info"])["split"] == "test"
    metas = [task.example(0, i)[1] for i in range(5)]
    gold = [r["answer"] for r in originals]  # the worked answers themselves score 1; off by one scores 0
    assert task.reward(gold, metas) == [1.0] * 5
    assert task.reward([f"#### {int(m['ground_truth']) + 1}" for m in metas], metas) == [0.0] * 5


def test_cli_writes_the_folder_and_names_a_bad_size(tmp_path, capsys):
    assert main(["data", "wordproblems", "--output", str(tmp_path / "wp"), "--train-size", "12",
                 "--test-size", "4", "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == (f"wrote 12 train and 4 test word problems to {tmp_path / 'wp'} "
                                               f"(train.parquet, test.parquet; raw GSM8K rows in raw/)")
    assert len(load_rows([str(tmp_path / "wp" / "train.parquet")], "data.train_files")) == 12
    assert main(["data", "wordproblems", "--output", str(tmp_path / "x"), "--test-size", "0"]) == 2
    assert capsys.readouterr().err.strip() == "flowrl: error: --test-size must be >= 1, got 0"


@pytest.mark.parametrize("argv, message", [
    (["gsm8k", "--output", "x.parquet"], "the following arguments are required: --input"),
    (["wordproblems", "--output", "x", "--input", "raw.jsonl"], "unrecognized arguments: --input raw.jsonl"),
])
def test_each_data_kind_takes_its_own_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["data", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err

"""`flowrl data gsm8k|math`: raw GSM8K and MATH rows into verl's schema, readable by data.train_files."""

import json
import re

import datasets
import pytest

from flowrl.cli import main
from flowrl.data.dataset import DatasetTask, load_rows
from flowrl.data.prepare import last_boxed
from flowrl.data.scoring.pool import ScoringPool


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_rows_convert_and_score(tmp_path, capsys):
    raw = [{"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=<<2+3=5>>5\n#### 5"},
           {"question": "How many cents in $12?", "answer": "12*100=1200\n#### 1,200"}]
    out = tmp_path / "gsm8k.parquet"
    assert main(["data", "gsm8k", "--input", jsonl(tmp_path / "raw.jsonl", raw), "--output", str(out)]) == 0
    assert f"wrote 2 gsm8k rows to {out}" in capsys.readouterr().out
    row = datasets.Dataset.from_parquet(str(out))[1]
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"] == {"style": "rule", "ground_truth": "1200"}
    assert row["prompt"] == [{"role": "user", "content": "How many cents in $12? Let's think step by step and "
                                                         "output the final answer after \"####\"."}]
    assert row["extra_info"]["index"] == 1 and row["extra_info"]["answer"].endswith("#### 1,200")
    task = DatasetTask(load_rows([str(out)], "data.train_files"), pool=ScoringPool(0))
    meta = [task.example(0, i)[1] for i in range(2)]
    meta.sort(key=lambda m: m["ground_truth"])
    assert task.reward(["so #### 1200", "#### 6"], meta) == [1.0, 0.0]


def test_math_rows_take_the_last_boxed_answer(tmp_path):
    raw = [{"problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?", "solution": "It is $\\boxed{\\frac{3}{4}}$."},
           {"problem": "Solve $x+1=3$.", "solution": "First \\boxed{1}, no: $x=\\boxed{2}$"}]
    src = tmp_path / "raw.parquet"
    datasets.Dataset.from_list(raw).to_parquet(src)
    out = tmp_path / "math.jsonl"
    assert main(["data", "math", "--input", str(src), "--output", str(out), "--split", "test"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{3}{4}", "2"]
    assert rows[0]["prompt"][0]["content"].endswith("output the final answer within \\boxed{}.")
    assert rows[1]["extra_info"]["split"] == "test"
    task = DatasetTask(load_rows([str(out)], "data.train_files"), shuffle=False, pool=ScoringPool(0))
    assert task.reward(["$\\boxed{0.75}$", "x = \\boxed{3}"], [task.example(0, i)[1] for i in range(2)]) == [1.0, 0.0]


def test_last_boxed_matches_nested_braces():
    assert last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\fbox{7}") == "7" and last_boxed("so \\boxed 5$") == "5"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None


@pytest.mark.parametrize("kind, raw, message", [
    ("gsm8k", {"question": "q", "answer": "5"}, r"--input .*raw.jsonl row 0: 'answer' has no '#### n'"),
    ("gsm8k", {"question": "q"}, r"--input .*raw.jsonl row 0: missing text field 'answer'"),
    ("math", {"problem": "p", "solution": "it is 5"}, r"--input .*raw.jsonl row 0: 'solution' has no \\boxed"),
])
def test_bad_raw_rows_are_one_line_naming_the_row(tmp_path, capsys, kind, raw, message):
    src = jsonl(tmp_path / "raw.jsonl", [raw])
    assert main(["data", kind, "--input", src, "--output", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "o.parquet").exists()

"""`flowrl data gsm8k|math --input FILE --output FILE.parquet`: raw public formats into verl's schema.

GSM8K rows hold `question` and `answer` (the reasoning, then `#### n`); MATH
rows hold `problem` and `solution` (the final answer in `\\boxed{}`). Each
becomes a row with the prompt as one user message asking for the answer in
the form the scorer reads, `reward_model.ground_truth` the bare answer, and
`extra_info` the split, index and original text.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from flowrl.data.dataset import read_table

GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) in text, braces matched; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    if rest.startswith("\\boxed ") and "{" not in rest.split(" ", 1)[1][:1]:  # "\boxed 5"
        return rest[len("\\boxed "):].split("$")[0].strip()
    open_at = rest.find("{")
    if open_at < 0:
        return None
    depth = 0
    for i, ch in enumerate(rest[open_at:], start=open_at):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return rest[open_at + 1:i]
    return None


def gsm8k_row(raw: dict[str, Any], index: int, split: str, where: str) -> dict[str, Any]:
    question, answer = _field(raw, "question", where), _field(raw, "answer", where)
    if "#### " not in answer:
        raise ValueError(f"{where}: 'answer' has no '#### n' final answer")
    truth = answer.split("#### ")[-1].replace(",", "").strip()
    return _row("openai/gsm8k", f"{question} {GSM8K_INSTRUCTION}", truth,
                {"split": split, "index": index, "question": question, "answer": answer})


def math_row(raw: dict[str, Any], index: int, split: str, where: str) -> dict[str, Any]:
    problem, solution = _field(raw, "problem", where), _field(raw, "solution", where)
    truth = last_boxed(solution)
    if truth is None:
        raise ValueError(f"{where}: 'solution' has no \\boxed{{}} answer")
    return _row("DigitalLearningGmbH/MATH-lighteval", f"{problem} {MATH_INSTRUCTION}", truth,
                {"split": split, "index": index, "problem": problem, "solution": solution})


def _field(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}: missing text field {key!r}")
    return value


def _row(source: str, prompt: str, truth: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"data_source": source, "prompt": [{"role": "user", "content": prompt}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": extra}


CONVERTERS: dict[str, Callable[..., dict[str, Any]]] = {"gsm8k": gsm8k_row, "math": math_row}


def convert(kind: str, source: str, output: str, split: str = "train") -> int:
    """Write `source`'s rows converted by CONVERTERS[kind] to `output` (.parquet or .jsonl); returns the count."""
    if Path(output).suffix not in (".parquet", ".jsonl"):
        raise ValueError(f"--output {output}: must end in .parquet or .jsonl")
    rows = [CONVERTERS[kind](raw, i, split, f"--input {source} row {i}")
            for i, raw in enumerate(read_table(source, "--input"))]  # names the extra when datasets is missing
    if not rows:
        raise ValueError(f"--input {source}: no rows")
    import datasets

    table = datasets.Dataset.from_list(rows)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(output) if output.endswith(".parquet") else table.to_json(output, lines=True)
    return len(rows)


def main(args: argparse.Namespace) -> int:
    count = convert(args.kind, args.input, args.output, args.split)
    print(f"wrote {count} {args.kind} rows to {args.output}")
    return 0

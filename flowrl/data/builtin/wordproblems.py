"""`flowrl data wordproblems --output DIR`: generated arithmetic word problems in GSM8K's raw format.

Each problem is one or two steps of +, - and * on small integers told as a short story ("Ava has
12 marbles. She buys 7 more. ..."), with a worked answer in GSM8K's style (`12 + 7 =
<<12+7=19>>19`) whose last line is `#### n`. DIR gets raw/train.jsonl and raw/test.jsonl (rows of
`question` and `answer`: what `flowrl data gsm8k` reads) and train.parquet and test.parquet,
converted by that same converter, so the gsm8k scorers score them and the prompt is one chat
message. The seed fixes every problem; no test question is also a training question.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Callable

from flowrl.data.prepare import convert

NAMES = [("Ava", "She"), ("Ben", "He"), ("Chloe", "She"), ("Daniel", "He"), ("Emma", "She"), ("Finn", "He"),
         ("Grace", "She"), ("Hugo", "He"), ("Isla", "She"), ("Jack", "He"), ("Lena", "She"), ("Omar", "He"),
         ("Maya", "She"), ("Noah", "He"), ("Priya", "She"), ("Sam", "He")]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "books", "cards", "eggs",
         "balloons", "crayons"]
FRIENDS = ["a friend", "a cousin", "a neighbour", "the teacher", "a classmate"]
THINGS = [("notebook", "notebooks"), ("sandwich", "sandwiches"), ("toy car", "toy cars"), ("ticket", "tickets"),
          ("plant", "plants"), ("juice box", "juice boxes")]
Problem = tuple[str, str]  # (question, worked answer ending "#### n")


def step(a: int, op: str, b: int) -> tuple[str, int]:
    """GSM8K's worked-step notation, `a op b = <<a op b=c>>c`, and c."""
    c = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c}", c


def buys(rng: random.Random) -> Problem:
    (name, she), item, a, b = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(2, 50), rng.randint(2, 50)
    work, c = step(a, "+", b)
    return (f"{name} has {a} {item}. {she} buys {b} more. How many {item} does {name} have now?",
            f"{name} has {work} {item} now.\n#### {c}")


def gives(rng: random.Random) -> Problem:
    (name, she), item, b = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(2, 40)
    a = rng.randint(b + 1, 60)
    work, c = step(a, "-", b)
    return (f"{name} has {a} {item}. {she} gives {b} of them to {rng.choice(FRIENDS)}. How many {item} does "
            f"{name} have left?", f"{name} has {work} {item} left.\n#### {c}")


def bags(rng: random.Random) -> Problem:
    (name, _), item, a, b = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(2, 9), rng.randint(2, 12)
    work, c = step(a, "*", b)
    return (f"{name} buys {a} bags of {item}. Each bag holds {b} {item}. How many {item} does {name} buy?",
            f"{name} buys {work} {item}.\n#### {c}")


def buys_then_gives(rng: random.Random) -> Problem:
    (name, she), item, a, b = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(2, 30), rng.randint(2, 30)
    first, total = step(a, "+", b)
    second, left = step(total, "-", rng.randint(1, total - 1))
    given = total - left
    return (f"{name} has {a} {item}. {she} buys {b} more and then gives {given} to {rng.choice(FRIENDS)}. How "
            f"many {item} does {name} have left?",
            f"After buying, {name} has {first} {item}.\nAfter giving some away, {name} has {second} {item} left."
            f"\n#### {left}")


def boxes_and_loose(rng: random.Random) -> Problem:
    (name, _), item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, loose = rng.randint(2, 9), rng.randint(2, 10), rng.randint(1, 20)
    first, boxed = step(a, "*", b)
    second, total = step(boxed, "+", loose)
    return (f"{name} has {a} boxes with {b} {item} in each box, and {loose} more {item} outside the boxes. How "
            f"many {item} does {name} have in all?",
            f"The boxes hold {first} {item}.\nIn all, {name} has {second} {item}.\n#### {total}")


def change(rng: random.Random) -> Problem:
    (name, _), (thing, things) = rng.choice(NAMES), rng.choice(THINGS)
    price, count = rng.randint(2, 9), rng.randint(2, 5)
    first, cost = step(price, "*", count)
    bill = next(note for note in (20, 50, 100) if note > cost)
    second, back = step(bill, "-", cost)
    return (f"A {thing} costs ${price}. {name} buys {count} of them and pays with a ${bill} bill. How many "
            f"dollars of change does {name} get?",
            f"The {things} cost {first} dollars.\nThe change is {second} dollars.\n#### {back}")


KINDS: list[Callable[[random.Random], Problem]] = [buys, gives, bags, buys_then_gives, boxes_and_loose, change]


def generate(count: int, rng: random.Random, exclude: set[str], field: str) -> list[dict[str, str]]:
    """`count` problems with distinct questions, none in `exclude`, each of a kind drawn uniformly."""
    rows: dict[str, str] = {}
    for _ in range(50 * count):
        if len(rows) == count:
            break
        question, answer = rng.choice(KINDS)(rng)
        if question not in exclude:
            rows.setdefault(question, answer)
    if len(rows) < count:
        raise ValueError(f"{field} {count}: only {len(rows)} distinct problems found; ask for fewer")
    return [{"question": q, "answer": a} for q, a in rows.items()]


def write(output: str | Path, train_size: int = 5000, test_size: int = 500, seed: int = 0) -> dict[str, int]:
    """Writes raw/{train,test}.jsonl and {train,test}.parquet under `output`; returns the row count per split."""
    for field, size in (("--train-size", train_size), ("--test-size", test_size)):
        if size < 1:
            raise ValueError(f"{field} must be >= 1, got {size}")
    rng = random.Random(seed)
    train = generate(train_size, rng, set(), "--train-size")
    test = generate(test_size, rng, {row["question"] for row in train}, "--test-size")
    out = Path(output)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, rows in (("train", train), ("test", test)):
        raw = out / "raw" / f"{split}.jsonl"
        raw.write_text("".join(json.dumps(row) + "\n" for row in rows))
        counts[split] = convert("gsm8k", str(raw), str(out / f"{split}.parquet"), split)
    return counts


def main(args: argparse.Namespace) -> int:
    counts = write(args.output, args.train_size, args.test_size, args.seed)
    print(f"wrote {counts['train']} train and {counts['test']} test word problems to {args.output} "
          f"(train.parquet, test.parquet; raw GSM8K rows in raw/)")
    return 0

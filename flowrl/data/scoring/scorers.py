"""Rule scorers for data-set rows, picked by `data_source` or named by `data.reward`.

A scorer is `fn(data_source, solution_str, ground_truth, extra_info) -> float`
(verl's compute_score signature). Built in: `gsm8k` (strict: the last
`#### n`), `gsm8k_format` (strict, and 0.1 for a wrong `#### n`: verl's
gsm8k `format_score=0.1`), `gsm8k_flexible` (the last number), `math` (math-verify: the
response's answer equals the ground truth as mathematics) and `exact_match`.
Your own: "package.module:function" or "path/to/file.py:function" (the file
is imported by path, no PYTHONPATH needed).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from flowrl.data.imports import import_attribute

Scorer = Callable[..., float]

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")

DATA_SOURCES = {"openai/gsm8k": "gsm8k", "gsm8k": "gsm8k", "math": "math", "lighteval/MATH": "math",
                "DigitalLearningGmbH/MATH-lighteval": "math", "HuggingFaceH4/MATH-500": "math"}


def extract_gsm8k(solution_str: str, method: str = "strict") -> str | None:
    """The answer of a GSM8K response, as verl's gsm8k.py extracts it: the last `#### n` with commas removed
    (strict), or the last number-like run that is not a lone "." (flexible, commas kept)."""
    if method == "strict":
        found = _STRICT.findall(solution_str)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _NUMBER.findall(solution_str)
    valid = [answer for answer in found if answer not in ("", ".")]
    return valid[-1] if valid else (found[0] if found else None)


def gsm8k(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
          method: str = "strict") -> float:
    return 1.0 if extract_gsm8k(solution_str, method) == ground_truth else 0.0


def gsm8k_format(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """verl's gsm8k compute_score with format_score=0.1: 1 for the right `#### n`, 0.1 for a wrong one, 0 for
    none (a sparse task's first signal is the answer's form)."""
    answer = extract_gsm8k(solution_str, "strict")
    return 0.0 if answer is None else 1.0 if answer == ground_truth else 0.1


def gsm8k_flexible(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    return gsm8k(data_source, solution_str, ground_truth, extra_info, method="flexible")


def math(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ValueError("data.reward: the 'math' scorer needs math-verify: pip install -e '.[data]' in the flowrl "
                         "checkout") from None
    gold = parse(ground_truth if "\\boxed" in ground_truth else f"\\boxed{{{ground_truth}}}")
    answer = parse(solution_str)
    return 1.0 if gold and answer and verify(gold, answer) else 0.0


def exact_match(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


BUILT_IN: dict[str, Scorer] = {"gsm8k": gsm8k, "gsm8k_format": gsm8k_format, "gsm8k_flexible": gsm8k_flexible,
                               "math": math, "exact_match": exact_match}


def scorer_name(data_source: str, reward: str) -> str | None:
    """The scorer for a row: `reward` unless it is "auto", else the built-in one for its data_source."""
    return DATA_SOURCES.get(data_source) if reward == "auto" else reward


_LOADED: dict[str, Scorer] = {}


def resolve(spec: str) -> Scorer:
    """A built-in name, "module:function" or "file.py:function"; ValueError naming data.reward otherwise."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    if spec not in _LOADED:
        _LOADED[spec] = _load(spec)
    return _LOADED[spec]


def _load(spec: str) -> Scorer:
    fn = import_attribute(spec, "data.reward: ", BUILT_IN, kind="scorer")
    if not callable(fn):
        raise ValueError(f"data.reward: {spec!r} is a {type(fn).__name__}, not a function")
    return fn

"""Data sets in verl's schema as a task: rows from parquet, jsonl or a saved `datasets` folder.

A row holds `data_source`, `prompt` (chat messages or a string), `ability`,
`reward_model: {style, ground_truth}` and `extra_info`. Prompt index i of a
PromptStream maps to (epoch, position) = divmod(i, len(rows)); each epoch is
its own permutation drawn from (seed, epoch), so a resumed stream, which
restores its next index, continues at the same row. Rewards come from the
scorer named for each row's data_source (flowrl.data.scoring.scorers), run in a
process pool.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any, Callable, Iterator

from flowrl.data.scoring.http_reward import is_url
from flowrl.data.scoring.scorers import resolve, scorer_name
from flowrl.data.scoring.pool import Sample, ScoringPool

log = logging.getLogger(__name__)
Prompt = str | list[dict[str, str]]


def load_rows(files: list[str], field: str) -> list[dict[str, Any]]:
    """Every file's rows, checked against the schema; ValueError naming the field, file and row."""
    rows = [_normalize(raw, where) for name in files for where, raw in table_rows(name, field)]
    if not rows:
        raise ValueError(f"{field}: no rows in {files}")
    return rows


def table_rows(name: str, field: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """("FIELD: FILE row I", row) for each row of the file; a row that cannot be decoded (text that is not
    UTF-8, which pyarrow's readers pass until the row is read) is one line naming the file and row."""
    table = read_table(name, field)
    for index in range(len(table)):
        try:
            raw = table[index]
        except Exception as err:  # noqa: BLE001 - the file's bytes, named
            raise ValueError(f"{field}: {name} row {index}: cannot read it: "
                             f"{_bad_line(Path(name)) or _innermost(err)}") from None
        yield f"{field}: {name} row {index}", raw


def read_table(name: str, field: str) -> Any:
    """The rows of a .parquet, .jsonl or saved `datasets` folder, as a datasets.Dataset."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{field}: reading data sets needs the `datasets` package: pip install -e '.[data]' "
                         f"in the flowrl checkout") from None

    path = Path(name)
    datasets.disable_progress_bars()
    if not path.is_dir() and not path.is_file():
        raise ValueError(f"{field}: no such file or folder {name!r}")
    if not path.is_dir() and path.suffix not in (".parquet", ".jsonl", ".json"):
        raise ValueError(f"{field}: {name!r} is not .parquet, .jsonl or a saved datasets folder")
    quiet = logging.getLogger("datasets")  # its loaders log the error they then raise: one line is ours to say
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        if path.is_dir():
            return datasets.load_from_disk(str(path))
        if path.suffix == ".parquet":
            return datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
        return datasets.Dataset.from_json(str(path), keep_in_memory=True)
    except Exception as err:  # a corrupt or foreign file (UnicodeDecodeError, ArrowInvalid...): one line naming it
        raise ValueError(f"{field}: cannot read {name!r}: {_bad_line(path) or _innermost(err)}") from None
    finally:
        quiet.setLevel(level)


def _innermost(err: BaseException) -> str:
    """The first line of the deepest cause (datasets wraps the parser's error in its DatasetGenerationError)."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _bad_line(path: Path) -> str:
    """For a .jsonl file that failed to load: its first line that is not UTF-8 or not a JSON object, named."""
    if path.suffix != ".jsonl":
        return ""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                row = json.loads(raw.decode("utf-8")) if raw.strip() else {}
            except UnicodeDecodeError as err:
                return f"line {number} is not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1})"
            except json.JSONDecodeError as err:
                return f"line {number} is not JSON ({err.msg.removesuffix(' at')} at column {err.colno})"
            if not isinstance(row, dict):
                return f"line {number} is a JSON {type(row).__name__}, not an object"
    return ""


def _normalize(raw: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("data_source", "prompt", "reward_model"):
        if raw.get(key) is None:
            raise ValueError(f"{where}: missing {key!r}")
    prompt = raw["prompt"]
    if prompt == "" or prompt == []:
        raise ValueError(f"{where}: 'prompt' is empty")
    if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt)):
        raise ValueError(f"{where}: 'prompt' must be a string or a list of chat messages with 'role' and 'content'")
    reward = raw["reward_model"]
    if not isinstance(reward, dict) or reward.get("ground_truth") is None:
        raise ValueError(f"{where}: 'reward_model' must be {{style, ground_truth}} with a ground_truth")
    truth = reward["ground_truth"]
    return {"prompt": prompt, "data_source": str(raw["data_source"]), "where": where.split(": ", 1)[1],
            "ground_truth": truth if isinstance(truth, str) else json.dumps(truth),
            "extra_info": json.dumps(raw.get("extra_info"), default=str)}


def prompt_text(prompt: Prompt) -> str:
    """A prompt as plain text, for models without a chat template: the messages' contents, one a line."""
    return prompt if isinstance(prompt, str) else "\n".join(str(m["content"]) for m in prompt)


class DatasetTask:
    """A task over data-set rows (see the module doc); `reward` scores each row by the scorer its task chose
    (`reward`: a name, or "auto": by the row's data_source), which travels with the row as its `scorer` column:
    the validation task's rows (data.val_reward) are scored by theirs, whichever task's `reward` is called."""

    meta_keys = ("data_source", "ground_truth", "extra_info", "where", "scorer")

    def __init__(self, rows: list[dict[str, Any]], reward: str = "auto", shuffle: bool = True,
                 chat_template: bool = False, pool: ScoringPool | None = None):
        self.rows, self.shuffle, self.chat_template = rows, shuffle, chat_template
        self.reward_spec, self.pool = reward, pool or ScoringPool()
        self._order: tuple[tuple[int, int], list[int]] | None = None
        self.val: DatasetTask | None = None  # the validation rows, when the run has them
        self.extra_chars = ""
        if is_url(reward):  # one server scores every row
            return
        for row in rows:
            name = scorer_name(row["data_source"], reward)
            if name is None:
                raise ValueError(f"data.reward: {row['where']} has data_source {row['data_source']!r}, which no "
                                 f"built-in scorer handles; set data.reward (exact_match, math, gsm8k, "
                                 f"module:function or file.py:function)")
            resolve(name)  # a bad name or an unimportable scorer fails before any model loads

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def chars(self) -> str:
        """The alphabet of the built-in tiny model: every character of the prompts and answers."""
        text = "".join(prompt_text(r["prompt"]) + r["ground_truth"] for r in self.rows) + self.extra_chars
        return "".join(sorted(set(text)))

    def position(self, seed: int, index: int) -> tuple[int, int]:
        """(epoch, row) of the stream's prompt `index`."""
        epoch, pos = divmod(index, len(self.rows))
        if not self.shuffle:
            return epoch, pos
        if self._order is None or self._order[0] != (seed, epoch):
            order = list(range(len(self.rows)))
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
            self._order = ((seed, epoch), order)
        return epoch, self._order[1][pos]

    def example(self, seed: int, index: int) -> tuple[Prompt, dict[str, Any]]:
        row = self.rows[self.position(seed, index)[1]]
        prompt = row["prompt"] if self.chat_template else prompt_text(row["prompt"])
        return prompt, {**{key: row[key] for key in self.meta_keys if key != "scorer"},
                        "scorer": scorer_name(row["data_source"], self.reward_spec) or ""}

    def reward(self, responses: list[str], meta: list[dict[str, Any]]) -> list[float]:
        samples = [Sample(m.get("scorer") or scorer_name(m["data_source"], self.reward_spec), m["data_source"], text,
                          m["ground_truth"], json.loads(m["extra_info"]), m["where"])
                   for text, m in zip(responses, meta)]
        return self.pool.score(samples)

    def limit_prompt_length(self, encode: Callable[[Prompt], list[int]], max_tokens: int,
                            truncation: str = "drop") -> int:
        """Drop (or, with truncation="error", refuse) rows whose prompt encodes to more than max_tokens;
        returns how many were dropped."""
        kept = []
        for row in self.rows:
            length = len(encode(row["prompt"] if self.chat_template else prompt_text(row["prompt"])))
            if length <= max_tokens:
                kept.append(row)
            elif truncation == "error":
                raise ValueError(f"data.max_prompt_length: {row['where']} has a {length}-token prompt, above "
                                 f"{max_tokens} (data.truncation=drop skips such rows)")
        dropped = len(self.rows) - len(kept)
        if not kept:
            raise ValueError(f"data.max_prompt_length: all {len(self.rows)} prompts are longer than {max_tokens} tokens")
        if dropped:
            log.warning("data: dropped %d of %d prompts longer than data.max_prompt_length=%d tokens",
                        dropped, len(self.rows), max_tokens)
        self.rows, self._order = kept, None
        return dropped

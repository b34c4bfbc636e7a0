"""Load local Hugging Face checkpoints, and write checkpoint folders atomically.

Everything here is local only (`local_files_only=True`): flowrl never reaches
a model hub, so a missing folder is a user mistake reported as ValueError.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import warnings
from typing import Iterator

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer,
                          PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast)
from transformers.utils import logging as hf_logging


def check_model_path(path: str | os.PathLike) -> pathlib.Path:
    """The folder as a Path; ValueError naming `model_path` if it holds no checkpoint."""
    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise ValueError(f"model_path {str(folder)!r} does not exist or is not a folder")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model_path {str(folder)!r} holds no config.json (not a Hugging Face checkpoint)")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"model_path {str(folder)!r}: config.json is not valid JSON ({err})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"model_path {str(folder)!r}: config.json has no model_type (not a Hugging Face model "
                         f"config)")
    for weights in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem:
            raise ValueError(f"model_path {str(folder)!r}: {weights.name} {problem}")
    return folder


def safetensors_problem(path: pathlib.Path) -> str:
    """What makes a .safetensors file unloadable, from its header alone ("": nothing): cut short (a copy or
    download that stopped), or not a safetensors file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(size - 8, 100 << 20):
            return f"is cut short or not a safetensors file ({size} bytes, no whole header)"
        try:
            header = json.loads(f.read(length))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, AttributeError):
            return "is not a safetensors file (its header is not JSON with data_offsets)"
    if 8 + length + end > size:
        return f"is cut short: {size} bytes where its header needs {8 + length + end} (copy it again)"
    return ""


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer: its tokenizer.json verbatim when there is one.

    AutoTokenizer is not used for folders with a tokenizer.json because
    transformers 5 forces the model type's own tokenizer class on some model
    types (qwen2 among them), and that class rebuilds the pipeline (Qwen's
    ByteLevel pre-tokenizer, an extra "<|endoftext|>" token) instead of the one
    stored, which breaks e.g. the char-level tokenizer of `build_tiny_model`.
    """
    folder = check_model_path(path)
    if (folder / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The checkpoint as a causal LM (actor, reference or rollout model)."""
    return AutoModelForCausalLM.from_pretrained(str(check_model_path(path)), dtype=dtype,
                                                local_files_only=True)


def load_value_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The checkpoint as a token-classification model with one label: a critic.

    The backbone comes from the checkpoint; the one-output `score` head is new
    and randomly initialised, by design: transformers' load report (a table of
    MISSING keys) is silenced for this load, one line says so, and any other
    missing key still warns. `classifier_dropout` is set to 0.0: the
    transformers default of 0.1 would make value estimates random in train mode.
    """
    folder = str(check_model_path(path))
    config = AutoConfig.from_pretrained(folder, num_labels=1, local_files_only=True)
    config.classifier_dropout = 0.0  # not a Qwen2Config field, so from_pretrained would drop it as a kwarg
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # for this load only: its report lists the new head as MISSING
    try:
        model, info = AutoModelForTokenClassification.from_pretrained(folder, config=config, dtype=dtype,
                                                                      local_files_only=True, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(key for key in info["missing_keys"] if not key.startswith("score."))
    if missing:
        warnings.warn(f"critic: {len(missing)} backbone weights missing from {folder}, newly initialised: "
                      f"{missing[:5]}", stacklevel=2)
    if os.environ.get("RANK", "0") == "0":  # torchrun's ranks load alike: rank 0 says it
        print(f"flowrl: value head 'score' newly initialised on {folder}'s backbone (as a critic's is)",
              file=sys.stderr)
    return model


MARKER = ".flowrl_export"
"""Written into the model folders a run or an export writes: `flowrl export` replaces a non-empty folder only with it."""


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, marked: bool = False) -> Iterator[pathlib.Path]:
    """Yields a temp folder next to `target`; on success it replaces `target` whole.

    A crash inside the block leaves `target` as it was (the temp folder is
    removed). An existing `target` is moved aside first, then deleted, since
    os.replace cannot replace a non-empty folder. `marked`: a model folder for `flowrl export` to replace
    later, so it gets a MARKER file.
    """
    target = pathlib.Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    tmp.chmod(0o777 & ~current_umask())  # mkdtemp's 0700 would leave `target` readable by its owner only
    try:
        yield tmp
        if marked:
            (tmp / MARKER).write_text("written by flowrl; `flowrl export` may replace this folder whole\n")
        replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def current_umask() -> int:
    """The process's umask (os.umask can only be read by setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_dir(src: pathlib.Path, target: pathlib.Path) -> None:
    if not target.exists():
        os.replace(src, target)
        return
    old = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
    os.replace(target, old / "x")
    os.replace(src, target)
    shutil.rmtree(old, ignore_errors=True)

"""A tiny char-level Qwen2 checkpoint built from a config, for tests and CPU runs.

Nothing is downloaded: the tokenizer maps each character of `chars` to one
token (plus "<pad>" = 0 and "<eos>" = 1) and the model is a randomly
initialised Qwen2 causal LM, deterministic under `seed`. The recipe is stored
in `flowrl_tiny.json`, so building the same recipe twice reuses the folder.
"""

from __future__ import annotations

import json
import os
import pathlib

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from flowrl.engines.models.folders import atomic_dir

PAD, EOS = "<pad>", "<eos>"
RECIPE_FILE = "flowrl_tiny.json"
RECIPE_VERSION = 2  # 2: the tokenizer stores unk_token=None (folders of version 1 are rebuilt, same weights)


def build_tiny_model(path: str | os.PathLike, *, chars: str = "0123456789+-*= ", hidden_size: int = 64,
                     num_layers: int = 2, num_heads: int = 4, max_position_embeddings: int = 64,
                     seed: int = 0) -> pathlib.Path:
    """Writes (or reuses) a tiny checkpoint at `path` and returns `path` as a Path."""
    _check_recipe(chars, hidden_size, num_layers, num_heads, max_position_embeddings)
    recipe = dict(version=RECIPE_VERSION, chars=chars, hidden_size=hidden_size, num_layers=num_layers,
                  num_heads=num_heads, max_position_embeddings=max_position_embeddings, seed=seed)
    path = pathlib.Path(path)
    if _stored_recipe(path) == recipe:
        return path
    if path.exists() and not path.is_dir():
        raise ValueError(f"path {str(path)!r} is a file, not a folder")
    if path.exists() and _stored_recipe(path) is None and any(path.iterdir()):
        raise ValueError(f"path {str(path)!r} is a non-empty folder that flowrl did not build; "
                         "refusing to overwrite it")
    tokenizer = build_char_tokenizer(chars)
    model = _build_model(tokenizer, recipe)
    try:
        with atomic_dir(path) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            (tmp / RECIPE_FILE).write_text(json.dumps(recipe, indent=2))
    except OSError:
        if _stored_recipe(path) != recipe:  # not a concurrent build of the same recipe
            raise
    return path


def build_char_tokenizer(chars: str) -> PreTrainedTokenizerFast:
    """One token per character of `chars`; ids 0 and 1 are "<pad>" and "<eos>".

    No unknown-token: `unk_token=None` is stored, because AutoTokenizer loads a qwen2 folder with
    Qwen2Tokenizer, whose default unk_token "<|endoftext|>" would otherwise be added as one more token than
    the model has (15 for the 14 embeddings of "0123456789+=").
    """
    vocab = {PAD: 0, EOS: 1}
    for ch in chars:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token=None)


def _build_model(tokenizer: PreTrainedTokenizerFast, recipe: dict) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=recipe["hidden_size"],
        intermediate_size=4 * recipe["hidden_size"], num_hidden_layers=recipe["num_layers"],
        num_attention_heads=recipe["num_heads"], num_key_value_heads=recipe["num_heads"],
        max_position_embeddings=recipe["max_position_embeddings"], tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def _check_recipe(chars: str, hidden_size: int, num_layers: int, num_heads: int,
                  max_position_embeddings: int) -> None:
    if not chars or len(set(chars)) != len(chars):
        raise ValueError(f"chars must be non-empty with no repeated character, got {chars!r}")
    for name, value in [("hidden_size", hidden_size), ("num_layers", num_layers), ("num_heads", num_heads),
                        ("max_position_embeddings", max_position_embeddings)]:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise ValueError(f"hidden_size ({hidden_size}) must be num_heads ({num_heads}) times an even "
                         "head size (rotary embeddings)")


def _stored_recipe(path: pathlib.Path) -> dict | None:
    try:
        return json.loads((path / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return None

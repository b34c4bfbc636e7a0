import json

import pytest
import torch

from flowrl.engines.models.folders import load_causal_lm, load_tokenizer, load_value_model
from flowrl.engines.models.tiny_model import build_tiny_model


def test_roundtrip_through_auto_loading(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    model = load_causal_lm(tiny_model_path)
    assert len(tokenizer) == 2 + len("0123456789+-*= ")
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<pad>", "<eos>")
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.eos_token_id == model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert (tiny_model_path / "model.safetensors").is_file()
    logits = model(input_ids=torch.tensor([tokenizer.encode("12+3=")])).logits
    assert logits.shape == (1, 5, len(tokenizer))


def test_tokenizer_is_char_level(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    ids = tokenizer.encode("12+3=")
    assert tokenizer.convert_ids_to_tokens(ids) == ["1", "2", "+", "3", "="]
    assert tokenizer.decode(ids) == "12+3="
    assert tokenizer.decode(tokenizer.encode(" 4 * 5 ")) == " 4 * 5 "  # spaces are tokens too
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == "12+3="


def test_value_model_shares_the_backbone(tiny_model_path):
    value = load_value_model(tiny_model_path, dtype=torch.float32)
    causal = load_causal_lm(tiny_model_path)
    assert value.config.num_labels == 1 and value.dropout.p == 0.0
    assert torch.equal(value.model.embed_tokens.weight, causal.model.embed_tokens.weight)
    assert value(input_ids=torch.tensor([[3, 4, 5]])).logits.shape == (1, 3, 1)


def test_build_is_deterministic_and_idempotent(tmp_path, tiny_model_path):
    path = build_tiny_model(tmp_path / "a")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(tmp_path / "a") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    assert (tiny_model_path / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()
    build_tiny_model(path, seed=1)  # another recipe replaces the folder
    assert json.loads((path / "flowrl_tiny.json").read_text())["seed"] == 1
    assert (path / "model.safetensors").read_bytes() != (tiny_model_path / "model.safetensors").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["a"]  # no temp folders left behind


def test_build_refuses_foreign_folder_and_bad_recipe(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="path"):
        build_tiny_model(tmp_path / "mine")
    with pytest.raises(ValueError, match="chars"):
        build_tiny_model(tmp_path / "b", chars="11")
    with pytest.raises(ValueError, match="hidden_size"):
        build_tiny_model(tmp_path / "b", hidden_size=30, num_heads=4)


@pytest.mark.parametrize("loader", [load_tokenizer, load_causal_lm, load_value_model])
def test_bad_path_names_model_path(tmp_path, loader):
    with pytest.raises(ValueError, match="model_path"):
        loader(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="model_path.*config.json"):
        loader(tmp_path / "empty")

"""benchmarks/verl_system.py gives verl's copy of the benchmark model a tokenizer verl 0.9.1's Qwen token builder
accepts ("\n" one token, "<|im_end|>" a token: its QwenContinuousTokenBuilder checks both, transcribed below),
while every prompt tokenizes as in the copy flowrl and TRL read."""

import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import pytest  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config  # noqa: E402

from common import full_vocab_tokenizer  # noqa: E402
from verl_system import CHAT_TEMPLATE, add_chat_template  # noqa: E402


def qwen_builder_checks(tokenizer) -> tuple[int, int]:
    """verl/utils/tokenizer/continuous_token.py (0.9.1): QwenContinuousTokenBuilder.__init__ and require_token_id."""
    newline_ids = tokenizer.encode("\n", add_special_tokens=False)
    if len(newline_ids) != 1:
        raise ValueError(f"Expected Qwen newline to tokenize to one token, got {newline_ids!r}")
    token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(token_id, int) or token_id < 0:
        raise ValueError(f"Tokenizer returned invalid id for required token '<|im_end|>': {token_id!r}")
    return newline_ids[0], token_id


def benchmark_model(folder: Path):
    """The benchmark model's folder as common.qwen_model writes it: its tokenizer beside a Qwen2 config.json; the
    tokenizer as flowrl reads it."""
    original = full_vocab_tokenizer(string.ascii_lowercase, 64)
    original.save_pretrained(folder)
    Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2).save_pretrained(folder)
    return original


def test_verl_copy_passes_the_qwen_builder_and_keeps_prompt_ids(tmp_path):
    original = benchmark_model(tmp_path / "model0")
    verl = AutoTokenizer.from_pretrained(add_chat_template(str(tmp_path / "model0"), tmp_path))
    # beside config.json (model_type qwen2) transformers 5 loads Qwen2Tokenizer, a byte-level BPE rebuilt from the
    # vocabulary: "\n" is looked up as "Ċ" and encodes to [] (the device's "got []")
    assert type(verl).__name__ == "Qwen2Tokenizer"
    with pytest.raises(ValueError, match=r"Expected Qwen newline to tokenize to one token, got \[\]"):
        qwen_builder_checks(AutoTokenizer.from_pretrained(tmp_path / "model0"))
    assert qwen_builder_checks(verl) == (63, 62)  # the last two filler ids of a 64-token vocabulary
    prompt = "thequickbrownfoxjumpsoverthelazydog"
    assert verl.encode(prompt, add_special_tokens=False) == original.encode(prompt, add_special_tokens=False)
    assert verl.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False) == prompt
    assert verl.chat_template == CHAT_TEMPLATE and verl.decode([5]) == original.decode([5]) == "d"


def test_the_copy_keeps_newline_one_token_whatever_the_split_does(tmp_path):
    """With "\\n" and "<|im_end|>" as added tokens, they are matched before any split runs: even one that drops
    every newline."""
    import json

    benchmark_model(tmp_path / "model0")
    copy = add_chat_template(str(tmp_path / "model0"), tmp_path)
    spec = json.loads((copy / "tokenizer.json").read_text())
    assert [(t["id"], t["content"], t["special"]) for t in spec["added_tokens"][-2:]] == [(62, "<|im_end|>", True),
                                                                                          (63, "\n", False)]
    drop = {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Removed", "invert": False}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [drop, spec["pre_tokenizer"]]}
    (copy / "tokenizer.json").write_text(json.dumps(spec))  # a split that drops every newline
    dropping = AutoTokenizer.from_pretrained(copy)
    assert qwen_builder_checks(dropping) == (63, 62)
    assert dropping.encode("ab\ncd", add_special_tokens=False) == [2, 3, 63, 4, 5]
    assert dropping.decode([2, 62, 63]) == "a<|im_end|>\n"
    spec["added_tokens"] = spec["added_tokens"][:2]  # without the added tokens, that split loses the newline
    (copy / "tokenizer.json").write_text(json.dumps(spec))
    assert AutoTokenizer.from_pretrained(copy).encode("\n", add_special_tokens=False) == []

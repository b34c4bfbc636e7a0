"""benchmarks/verl_system.py gives verl's copy of the benchmark model a tokenizer verl 0.9.1's Qwen token builder
accepts ("\n" one token, "<|im_end|>" a token: its QwenContinuousTokenBuilder checks both, transcribed below),
while every prompt tokenizes as in the copy flowrl and TRL read."""

import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import pytest  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

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


def test_verl_copy_passes_the_qwen_builder_and_keeps_prompt_ids(tmp_path):
    original = full_vocab_tokenizer(string.ascii_lowercase, 64)
    original.save_pretrained(tmp_path / "model0")
    verl = AutoTokenizer.from_pretrained(add_chat_template(str(tmp_path / "model0"), tmp_path))
    with pytest.raises(Exception):  # on the device: "got []"; this machine's tokenizers: WordLevel's missing [UNK]
        qwen_builder_checks(AutoTokenizer.from_pretrained(tmp_path / "model0"))
    assert qwen_builder_checks(verl) == (63, 62)  # the last two filler ids of a 64-token vocabulary
    prompt = "thequickbrownfoxjumpsoverthelazydog"
    assert verl.encode(prompt, add_special_tokens=False) == original.encode(prompt, add_special_tokens=False)
    assert verl.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False) == prompt
    assert verl.chat_template == CHAT_TEMPLATE and verl.decode([5]) == original.decode([5]) == "d"

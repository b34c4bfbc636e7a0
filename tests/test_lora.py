"""LoRA (peft): only the adapters train and checkpoint; the synced rollout and the export hold merged weights; the
reference policy is the actor's module with its adapters disabled."""

import pytest
import torch

from flowrl.config import validate, RunConfig
from flowrl.engines.train import sharded_checkpoint
from flowrl.engines.configs import ModelSource
from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train.lora import BaseModelEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.weights.in_process import StreamedSync
from fakes import TokenMeanNLL
from test_engine_fsdp2 import ROWS, make_batch

CONFIG = HFTrainConfig(lr=0.05, lora_rank=4, lora_alpha=8.0, lora_target_modules=["q_proj", "v_proj", "down_proj"])
GREEDY = SamplingParams(max_new_tokens=6, greedy=True)


@pytest.fixture(scope="module")
def trained(tiny_model_path):
    """A LoRA actor after two optimizer steps."""
    engine = CONFIG.build(ModelSource(tiny_model_path), head="actor", device="cpu")
    for _ in range(2):
        engine.update(make_batch(ROWS), TokenMeanNLL(), mini_batch_size=8, micro_batch_size=4)
    return engine


def test_only_the_adapters_train(trained):
    names = {id(p): n for n, p in trained.model.named_parameters()}
    optimized = [names[id(p)] for group in trained.optimizer.param_groups for p in group["params"]]
    assert optimized and all(".lora_A." in n or ".lora_B." in n for n in optimized)
    assert len(optimized) == 2 * 3 * 2  # lora_A and lora_B of 3 targets in each of 2 layers
    lora_b = trained.model.base_model.model.model.layers[0].self_attn.q_proj.lora_B.default.weight
    assert lora_b.abs().sum() > 0  # it moved from peft's zero init


def test_the_synced_rollout_equals_the_trained_models_greedy_output(trained, tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    prompts = make_batch([(p, [0]) for p, _ in ROWS])
    copy = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig())
    StreamedSync()(trained, copy)  # merged weights under the base model's names
    own = HFRolloutEngine(trained.model, tokenizer, HFRolloutConfig())  # the peft module itself, adapters on
    expected = own.generate(prompts["prompt_ids"], prompts["prompt_mask"], GREEDY)
    synced = copy.generate(prompts["prompt_ids"], prompts["prompt_mask"], GREEDY)
    assert torch.equal(synced["response_ids"], expected["response_ids"])
    base = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig()).generate(
        prompts["prompt_ids"], prompts["prompt_mask"], GREEDY)
    assert not torch.equal(base["response_ids"], expected["response_ids"])  # the adapters changed the policy
    merged = trained.full_state_dict()
    assert merged.keys() == load_causal_lm(tiny_model_path).state_dict().keys()
    batch = make_batch(ROWS)
    torch.testing.assert_close(HFTrainEngine(copy.model, HFTrainConfig(), kind="actor").forward(batch)["logprobs"],
                               trained.forward(batch)["logprobs"], atol=1e-5, rtol=0)


def test_the_reference_is_the_base_model_with_adapters_disabled(trained, tiny_model_path):
    ref = CONFIG.build(ModelSource(tiny_model_path), head="actor", device="cpu", trainable=False, base_of=trained)
    assert isinstance(ref, BaseModelEngine) and ref.model is trained.model  # no second copy
    batch = make_batch(ROWS)
    base = HFTrainEngine(load_causal_lm(tiny_model_path).requires_grad_(False), HFTrainConfig(), kind="actor")
    torch.testing.assert_close(ref.forward(batch)["logprobs"], base.forward(batch)["logprobs"], atol=1e-6, rtol=0)
    assert not torch.allclose(trained.forward(batch)["logprobs"], base.forward(batch)["logprobs"], atol=1e-3)
    base_state = dict(ref.named_full_tensors())
    initial = load_causal_lm(tiny_model_path).state_dict()
    assert base_state.keys() == initial.keys()
    assert all(torch.equal(base_state[k], initial[k]) for k in initial)


def test_the_checkpoint_holds_only_adapter_tensors_and_restores_them(trained, tiny_model_path, tmp_path):
    trained.save(str(tmp_path / "actor"))
    keys = sharded_checkpoint.saved_keys(tmp_path / "actor")
    model_keys = [k for k in keys if k.startswith("model.")]
    assert len(model_keys) == 12 and all(".lora_" in k for k in model_keys)
    assert all(".lora_" in k for k in keys if k.startswith("optimizer.state."))
    restored = CONFIG.build(ModelSource(tiny_model_path), head="actor", device="cpu")
    restored.load(str(tmp_path / "actor"))
    expected, actual = trained.full_state_dict(), restored.full_state_dict()
    assert all(torch.equal(actual[k], expected[k]) for k in expected)
    trained.save_pretrained(str(tmp_path / "hf"))
    exported = load_causal_lm(tmp_path / "hf").state_dict()
    assert all(torch.equal(exported[k], expected[k]) for k in expected)


def test_bad_lora_settings_name_the_field(tiny_model_path):
    with pytest.raises(ValueError, match=r"actor.lora_rank: Input should be greater than or equal to 0"):
        validate(RunConfig, {"actor": {"lora_rank": -1}})
    bad = HFTrainConfig(lora_rank=4, lora_target_modules=["q_proj", "qkv"])
    with pytest.raises(ValueError, match=r"actor.lora_target_modules: 'qkv' names no linear layer .*'q_proj'"):
        bad.build(ModelSource(tiny_model_path), head="actor", device="cpu")
    with pytest.raises(ValueError, match=r"critic.lora_rank=4: LoRA is for the actor"):
        HFTrainConfig(lora_rank=4).build(ModelSource(tiny_model_path), head="critic", device="cpu")


def test_a_lora_run_trains_resumes_and_exports(tmp_path):
    from transformers import AutoModelForCausalLM

    from flowrl.cli import main
    from flowrl.config import load_run_config
    from flowrl.runtime.trainer import train

    sets = ["train.steps=2", "checkpoint.every=1", "eval.every=0", "train.batch_size=8", "roles.actor.lora_rank=4",
            f"train.output_dir={tmp_path}"]
    train(load_run_config(None, sets), progress=False)
    model_keys = [k for k in sharded_checkpoint.saved_keys(tmp_path / "checkpoints/step_000002/actor")
                  if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)
    rows = train(load_run_config(None, [*sets, "train.steps=3"]), progress=False)  # resumes from step 2
    assert [r["step"] for r in rows] == [3]
    assert main(["export", str(tmp_path), "--output", str(tmp_path.parent / f"{tmp_path.name}-exported")]) == 0
    final, exported = (AutoModelForCausalLM.from_pretrained(folder).state_dict()
                       for folder in (tmp_path / "final", tmp_path.parent / f"{tmp_path.name}-exported"))
    assert final.keys() == exported.keys() and all(torch.equal(final[k], exported[k]) for k in final)

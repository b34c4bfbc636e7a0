import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.responses import mask_after_eos
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.weights.in_process import StreamedSync, SharedModuleSync, choose_weight_sync
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from fakes import TokenMeanNLL

PROMPTS = ["12+3=", "7*8=", "9-4=", "1+1=", "22+22=", "5=", "3*3=", "60-7="]
SAMPLE = SamplingParams(max_new_tokens=12, temperature=1.5)
GREEDY = SamplingParams(max_new_tokens=6, greedy=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def left_pad(tokenizer, texts):
    rows = [tokenizer.encode(text) for text in texts]
    width = max(len(row) for row in rows)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return ids, mask


def test_mask_after_eos_by_hand():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8], [1, 0, 0, 0]])  # eos = 1, pad = 0
    fixed, mask = mask_after_eos(ids, eos_id=1, pad_id=0)
    assert fixed.tolist() == [[5, 1, 0, 0], [5, 6, 7, 8], [1, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_shapes_and_mask_semantics(tiny_model_path, tokenizer):
    engine = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig(micro_batch_size=3))
    ids, mask = left_pad(tokenizer, PROMPTS)
    out = engine.generate(ids, mask, SAMPLE, seed=3)
    response, response_mask = out["response_ids"], out["response_mask"]
    assert out.batch_size == torch.Size([len(PROMPTS)])
    assert response.shape == response_mask.shape and response.shape[1] <= SAMPLE.max_new_tokens
    eos = tokenizer.eos_token_id
    ended = 0
    for row, row_mask in zip(response.tolist(), response_mask.tolist()):
        length = row.index(eos) + 1 if eos in row else len(row)
        ended += eos in row
        assert row_mask == [1] * length + [0] * (len(row) - length)
        assert row[length:] == [tokenizer.pad_token_id] * (len(row) - length)
    assert 0 < ended < len(PROMPTS)  # this seed exercises both cases


def test_greedy_is_deterministic_and_argmax(tiny_model_path, tokenizer):
    model = load_causal_lm(tiny_model_path)
    model.train()
    engine = HFRolloutEngine(model, tokenizer, HFRolloutConfig())
    ids, mask = left_pad(tokenizer, PROMPTS)
    first = engine.generate(ids, mask, GREEDY)
    assert model.training  # the flag is restored
    assert torch.equal(engine.generate(ids, mask, GREEDY)["response_ids"], first["response_ids"])
    for i, text in enumerate(PROMPTS):  # the first token is the unpadded argmax
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tokenizer.encode(text)])).logits[0, -1]
        assert first["response_ids"][i, 0].item() == logits.argmax().item()


def test_seeded_sampling_is_reproducible(tiny_model_path, tokenizer):
    engine = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig())
    ids, mask = left_pad(tokenizer, PROMPTS)
    state = torch.random.get_rng_state()
    a = engine.generate(ids, mask, SAMPLE, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    b = engine.generate(ids, mask, SAMPLE, seed=7)
    c = engine.generate(ids, mask, SAMPLE, seed=8)
    assert torch.equal(a["response_ids"], b["response_ids"]) and torch.equal(a["response_mask"], b["response_mask"])
    assert not torch.equal(a["response_ids"], c["response_ids"])
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(ids, mask, SamplingParams(top_p=0.0))


def train_toward(train, ids, mask, responses):
    """A few supervised steps on (prompt, response) rows so the greedy output changes."""
    batch = TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=responses,
                       response_mask=torch.ones_like(responses), batch_size=[ids.shape[0]])
    for _ in range(5):
        train.update(batch, TokenMeanNLL(), mini_batch_size=ids.shape[0])


def test_shared_module_sync(tiny_model_path, tokenizer):
    model = load_causal_lm(tiny_model_path)
    train = HFTrainEngine(model, HFTrainConfig(lr=3e-2), kind="actor")
    rollout = HFRolloutEngine(model, tokenizer, HFRolloutConfig())
    sync = choose_weight_sync(train.model, rollout.model)
    assert isinstance(sync, SharedModuleSync)
    ids, mask = left_pad(tokenizer, PROMPTS)
    before = rollout.generate(ids, mask, GREEDY)["response_ids"]
    sampled = rollout.generate(ids, mask, SAMPLE, seed=1)["response_ids"]
    train_toward(train, ids, mask, sampled)  # rollout outputs feed a backward: no inference tensors
    sync(train, rollout)
    after = rollout.generate(ids, mask, GREEDY)["response_ids"]
    reference = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig())
    reference.load_weights(train.full_state_dict())
    assert not torch.equal(after, before)
    assert torch.equal(after, reference.generate(ids, mask, GREEDY)["response_ids"])


def test_streamed_sync(tiny_model_path, tokenizer):
    train = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=3e-2), kind="actor")
    rollout = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig())
    sync = choose_weight_sync(train.model, rollout.model)
    assert isinstance(sync, StreamedSync)
    with pytest.raises(AssertionError):
        SharedModuleSync()(train, rollout)
    ids, mask = left_pad(tokenizer, PROMPTS)
    before = rollout.generate(ids, mask, GREEDY)["response_ids"]
    train_toward(train, ids, mask, torch.full((len(PROMPTS), 3), tokenizer.encode("7")[0]))
    assert torch.equal(rollout.generate(ids, mask, GREEDY)["response_ids"], before)  # not synced yet
    sync(train, rollout)
    after = rollout.generate(ids, mask, GREEDY)["response_ids"]
    shared = HFRolloutEngine(train.model, tokenizer, HFRolloutConfig())  # the train model itself, for reference
    assert not torch.equal(after, before)
    assert torch.equal(after, shared.generate(ids, mask, GREEDY)["response_ids"])


def sampled_batch(engine, tokenizer, params, seed=5):
    ids, mask = left_pad(tokenizer, PROMPTS)
    out = engine.generate(ids, mask, params, seed=seed)
    return TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=out["response_ids"],
                      response_mask=out["response_mask"], batch_size=[len(PROMPTS)]), out


@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_sampler_logprobs_equal_the_trainers_in_fp32(tiny_model_path, tokenizer, temperature):
    model = load_causal_lm(tiny_model_path)
    engine = HFRolloutEngine(model, tokenizer, HFRolloutConfig(micro_batch_size=3))
    batch, out = sampled_batch(engine, tokenizer, SamplingParams(max_new_tokens=12, temperature=temperature))
    trainer = HFTrainEngine(model, HFTrainConfig(), kind="actor").forward(batch, temperature=temperature, micro_batch_size=4)
    mask = batch["response_mask"].bool()
    assert mask.sum() > 20 and (out["rollout_logprobs"][~mask] == 0).all()
    assert torch.allclose(out["rollout_logprobs"][mask], trainer["logprobs"][mask], atol=1e-4)


def test_sampler_logprobs_follow_top_k_truncation(tiny_model_path, tokenizer):
    """With top_k the sampler's distribution is the top k logits renormalised: computed here by hand."""
    model = load_causal_lm(tiny_model_path)
    batch, out = sampled_batch(HFRolloutEngine(model, tokenizer, HFRolloutConfig()), tokenizer,
                               SamplingParams(max_new_tokens=8, temperature=1.2, top_k=3))
    prompt_len = batch["prompt_ids"].shape[1]
    ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], 1)
    attn = torch.cat([batch["prompt_mask"], batch["response_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    logits = logits[:, prompt_len - 1:-1].float() / 1.2
    kth = logits.topk(3, dim=-1).values[..., -1:]
    expected = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
    expected = expected.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].bool()
    assert torch.allclose(out["rollout_logprobs"][mask], expected[mask], atol=1e-4)
    untruncated = torch.log_softmax(logits, -1).gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)
    assert (out["rollout_logprobs"][mask] - untruncated[mask]).abs().max() > 1e-2  # the truncation shows


def test_finish_reason_is_stop_at_eos_and_length_at_the_cap(tiny_model_path, tokenizer):
    engine = HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig())
    _, out = sampled_batch(engine, tokenizer, SamplingParams(max_new_tokens=4, temperature=1.5), seed=1)
    stopped = ((out["response_ids"] == tokenizer.eos_token_id) & out["response_mask"].bool()).any(-1)
    assert stopped.any() and (~stopped).any()  # both kinds occur in this sample
    assert out["finish_reason"].tolist() == [0 if s else 1 for s in stopped.tolist()]
    _, long = sampled_batch(engine, tokenizer, SamplingParams(max_new_tokens=4, temperature=1.5, ignore_eos=True))
    assert long["response_mask"].sum(-1).tolist() == [4] * len(PROMPTS) and (long["finish_reason"] == 1).all()

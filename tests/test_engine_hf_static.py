"""roles.rollout.engine=hf_static: a static KV cache and one decode step per token (run eagerly on CPU here)."""

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.configs import HFRolloutConfig, HFStaticRolloutConfig, HFTrainConfig
from flowrl.config import load_run_config
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.hf import static as hf_static
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.sampling import sampling_columns
from flowrl.runtime.trainer import train


def prompts(tokenizer):
    rows = [tokenizer.encode(t) for t in ("12+3=", "7*8=", "9-4=", "1+1=", "22+22=", "5=")]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.mark.parametrize("model", ["tiny_model_path", "gqa_model_path"])
def test_greedy_outputs_equal_generate(model, request):
    path = request.getfixturevalue(model)
    tokenizer = load_tokenizer(path)
    ids, mask = prompts(tokenizer)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    expected = HFRolloutEngine(load_causal_lm(path), tokenizer, HFRolloutConfig()).generate(ids, mask, params)
    static = StaticCacheRolloutEngine(load_causal_lm(path), tokenizer, HFStaticRolloutConfig(compile=False))
    static = static.generate(ids, mask, params)
    for key in ("response_ids", "response_mask", "finish_reason"):
        assert torch.equal(static[key], expected[key]), key
    assert torch.allclose(static["rollout_logprobs"], expected["rollout_logprobs"], atol=1e-5)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (1.5, 0, 1.0), (1.0, 5, 1.0), (1.2, 3, 1.0),
                                                      (1.0, 0, 0.7), (1.3, 4, 0.8)])
def test_sampler_logprobs_equal_the_trainers(gqa_model_path, temperature, top_k, top_p):
    """Top-k and top-p renormalise the sampler's distribution; the trainer scores each row under the same one,
    read from the row's sampling columns (flowrl.engines.sampling)."""
    tokenizer, model = load_tokenizer(gqa_model_path), load_causal_lm(gqa_model_path)
    ids, mask = prompts(tokenizer)
    engine = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False))
    params = SamplingParams(max_new_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p)
    out = engine.generate(ids, mask, params, seed=2)
    again = engine.generate(ids, mask, params, seed=2)
    assert torch.equal(out["response_ids"], again["response_ids"])  # seeded: the same sample
    batch = TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=out["response_ids"],
                       response_mask=out["response_mask"], **sampling_columns(params, ids.shape[0]),
                       batch_size=[ids.shape[0]])
    trainer = HFTrainEngine(model, HFTrainConfig(), kind="actor").forward(batch, micro_batch_size=8)
    valid = out["response_mask"].bool()
    assert torch.allclose(out["rollout_logprobs"][valid], trainer["logprobs"][valid], atol=1e-4)


def test_grpo_trains_with_the_static_engine(tmp_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "roles.rollout.engine=hf_static", "train.steps=30",
                                 "eval.every=0", "checkpoint.export=false"])
    rows = train(cfg, progress=False)
    first, last = sum(r["reward/mean"] for r in rows[:5]) / 5, sum(r["reward/mean"] for r in rows[-5:]) / 5
    assert last > first + 0.1, (first, last)


def test_a_reused_loop_gives_what_a_fresh_engine_gives(gqa_model_path, monkeypatch):
    """Buffers and caches are kept per shape: a second call's rows, and calls over more shapes than are kept,
    equal a fresh engine's (prompts of 6 and 40 tokens fall in different buckets)."""
    tokenizer, model = load_tokenizer(gqa_model_path), load_causal_lm(gqa_model_path)
    ids, mask = prompts(tokenizer)
    params = SamplingParams(max_new_tokens=9, greedy=True)
    monkeypatch.setattr(hf_static, "MAX_SHAPES", 4)
    engine = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False))
    calls = [(ids[:3], mask[:3]), (ids[3:], mask[3:]), (ids.flip(0), mask.flip(0))]
    calls += [(torch.nn.functional.pad(ids, (34, 0), value=tokenizer.pad_token_id),
               torch.nn.functional.pad(mask, (34, 0))), (ids[:1], mask[:1]), (ids[:2], mask[:2]), (ids[:3], mask[:3])]
    for call_ids, call_mask in calls:
        again = engine.generate(call_ids, call_mask, params)
        fresh = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False)).generate(call_ids, call_mask, params)
        for key in ("response_ids", "rollout_logprobs", "finish_reason"):
            assert torch.equal(again[key], fresh[key]), key
    assert len(engine._caches) == 4  # MAX_SHAPES


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_the_captured_step_equals_the_eager_one_and_sees_weight_updates(gqa_model_path):
    tokenizer = load_tokenizer(gqa_model_path)
    model = load_causal_lm(gqa_model_path).cuda()
    ids, mask = prompts(tokenizer)
    greedy, sampled = SamplingParams(max_new_tokens=24, greedy=True), SamplingParams(max_new_tokens=24)
    graphed = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=True), device="cuda")
    eager = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False), device="cuda")
    for _ in range(2):  # the first call warms up and captures, the second replays from its first step
        out = graphed.generate(ids, mask, greedy)
        assert torch.equal(out["response_ids"], eager.generate(ids, mask, greedy)["response_ids"])
    assert graphed._loops[next(iter(graphed._loops))].graph is not None
    first, again = graphed.generate(ids, mask, sampled, seed=3), graphed.generate(ids, mask, sampled, seed=3)
    assert torch.equal(first["response_ids"], again["response_ids"])  # seeded replays repeat
    assert not torch.equal(first["response_ids"], graphed.generate(ids, mask, sampled, seed=4)["response_ids"])
    with torch.no_grad():  # an optimizer-like in-place update, then a replaced parameter: both are seen
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.lm_head.weight = model.model.embed_tokens.weight = torch.nn.Parameter(model.lm_head.weight * 1.5)
    assert torch.equal(graphed.generate(ids, mask, greedy)["response_ids"],
                       eager.generate(ids, mask, greedy)["response_ids"])


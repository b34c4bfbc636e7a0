"""hf_static: rows end at drawn lengths (`eos_at_B`), and finished rows are compacted out of the decode batch
(eagerly on CPU here)."""

import functools

import torch

from flowrl.engines.hf.configs import HFStaticRolloutConfig
from flowrl import metrics
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.protocols import FinishReason, SamplingParams
from test_engine_hf_static import prompts


def eight_prompts(tokenizer):
    ids, mask = prompts(tokenizer)
    return torch.cat([ids, ids[:2]]), torch.cat([mask, mask[:2]])


def test_eos_at_ends_each_row_with_eos_at_its_length(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    ids, mask = prompts(tokenizer)
    eos_at = torch.tensor([1, 3, 5, 12, 13, 7])  # 13 > max_new_tokens: that row runs to the cap
    engine = StaticCacheRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFStaticRolloutConfig(compile=False))
    out = engine.generate(ids, mask, SamplingParams(max_new_tokens=12, ignore_eos=True), seed=0, eos_at_B=eos_at)
    assert out["response_mask"].sum(-1).tolist() == [1, 3, 5, 12, 12, 7]
    lengths = out["response_mask"].sum(-1)
    last = out["response_ids"].gather(-1, (lengths - 1)[:, None]).squeeze(-1)
    assert (last[[0, 1, 2, 3, 5]] == tokenizer.eos_token_id).all() and last[4] != tokenizer.eos_token_id
    assert out["finish_reason"].tolist() == [FinishReason.STOP] * 4 + [FinishReason.LENGTH, FinishReason.STOP]
    forced = out["rollout_logprobs"].gather(-1, (lengths - 1)[:, None]).squeeze(-1)
    assert forced[[0, 1, 2, 3, 5]].eq(0).all() and forced[4] < 0  # a forced token's logprob is 0


def test_compacting_finished_rows_out_keeps_the_greedy_outputs(tiny_model_path):
    """Rows finish early (eos_at); the compacting engine decodes the rest in batches of 4 and then 2 rows and
    returns what the engine that never compacts returns."""
    tokenizer, model = load_tokenizer(tiny_model_path), load_causal_lm(tiny_model_path)
    ids, mask = eight_prompts(tokenizer)
    eos_at = torch.tensor([2, 3, 4, 5, 6, 17, 40, 40])
    params = SamplingParams(max_new_tokens=40, greedy=True, ignore_eos=True)
    compacting = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False), compact_min_rows=1)
    static = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False), compact_min_rows=None)
    with metrics.collect() as logged:
        out = compacting.generate(ids, mask, params, eos_at_B=eos_at)
    expected = static.generate(ids, mask, params, eos_at_B=eos_at)
    # the call's seconds per loop size (8 rows, then 4, then 2): where a variable-length call's time goes
    assert sorted(logged) == [f"rollout/decode_s/rows_{n}" for n in (2, 4, 8)]
    assert all(v > 0 for v in logged.values())
    assert sorted(rows for rows, _ in compacting._caches) == [2, 4, 8]
    assert sorted(rows for rows, _ in static._caches) == [8]
    for key in ("response_ids", "response_mask", "finish_reason"):
        assert torch.equal(out[key], expected[key]), key
    assert torch.allclose(out["rollout_logprobs"], expected["rollout_logprobs"], atol=1e-5)
    assert out["response_mask"].sum(-1).tolist() == eos_at.tolist()


def test_the_compiled_step_compiles_once_for_all_shapes_of_a_sampling(tiny_model_path, monkeypatch):
    """Compaction (16, 8 then 4 rows) and a second prompt width (another cache length) reuse the first graph:
    the decode step is traced once (torch.compile's default traced it 3 times: static, then dynamic rows, then
    dynamic length; on an H200 each is a full inductor compile). 16 rows is the model's head size, which
    dynamic=True alone would duck-size with the rows and specialize. Dynamo's guards decide this, not the
    backend: the engine's torch.compile gets backend="eager" here (inductor on CPU: 20 s)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    tokenizer, model = load_tokenizer(tiny_model_path), load_causal_lm(tiny_model_path)
    assert model.config.hidden_size // model.config.num_attention_heads == 16
    ids, mask = eight_prompts(tokenizer)
    ids, mask = torch.cat([ids, ids]), torch.cat([mask, mask])
    wide_ids = torch.nn.functional.pad(ids, (40 - ids.shape[1], 0), value=tokenizer.pad_token_id)
    wide_mask = torch.nn.functional.pad(mask, (40 - ids.shape[1], 0), value=0)
    eos_at = torch.tensor([2, 3, 4, 5, 6, 17, 40, 40] * 2)
    params = SamplingParams(max_new_tokens=40, greedy=True, ignore_eos=True)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=True), compact_min_rows=1)
    eager = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False), compact_min_rows=1)
    for call_ids, call_mask in ((ids, mask), (wide_ids, wide_mask)):
        out, expected = (e.generate(call_ids, call_mask, params, eos_at_B=eos_at) for e in (compiled, eager))
        assert torch.equal(out["response_ids"], expected["response_ids"])
        assert torch.allclose(out["rollout_logprobs"], expected["rollout_logprobs"], atol=1e-5)
    assert sorted(compiled._caches) == [(4, 72), (4, 104), (8, 72), (8, 104), (16, 72), (16, 104)]
    # two graphs: one decoder layer, traced once for all of the model's layers (flowrl.engines.hf.decode_regions),
    # and sampling
    assert model.config.num_hidden_layers >= 2
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2
    # sampling reads temperature, noise and ignore-eos as tensors: a sampled call (the rollout after a greedy
    # evaluation) runs the same graph (before: a second compile, 45-50 s on a cold H200)
    sampled = SamplingParams(max_new_tokens=40, temperature=0.7)
    out, expected = (e.generate(ids, mask, sampled, seed=3) for e in (compiled, eager))
    assert torch.equal(out["response_ids"], expected["response_ids"])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2

"""hf_static's decode step compiled per decoder layer (flowrl.engines.hf.decode_regions): the same tokens and
logprobs as the whole-model step, one layer graph for every layer, and the layers' own compiled calls (the
train engine's, in the hybrid engine) left as they were. Dynamo's guards decide the graph count, not the
backend: torch.compile gets backend="eager" here (inductor on CPU takes tens of seconds)."""

import functools

import pytest
import torch
from transformers import Qwen2Config

from flowrl.engines.hf.configs import HFStaticRolloutConfig
from flowrl.engines.hf import static as hf_static
from flowrl.engines.hf.decode_regions import RegionalDecodeStep, WholeDecodeStep, supports_regions
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from test_engine_hf_static import prompts


def test_only_models_whose_layers_all_attend_to_the_whole_cache_compile_per_layer(gqa_model_path):
    model = load_causal_lm(gqa_model_path)
    assert supports_regions(model)
    engine = StaticCacheRolloutEngine(model, load_tokenizer(gqa_model_path), HFStaticRolloutConfig(compile=True))
    assert isinstance(engine._step, RegionalDecodeStep)
    config = Qwen2Config(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"],
                         use_sliding_window=True, sliding_window=8)
    model.config = config
    assert not supports_regions(model)


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=12, greedy=True, ignore_eos=True),
                                    SamplingParams(max_new_tokens=12, temperature=0.8)], ids=["greedy", "sampled"])
def test_the_per_layer_step_equals_the_whole_model_step(gqa_model_path, monkeypatch, params):
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    tokenizer, model = load_tokenizer(gqa_model_path), load_causal_lm(gqa_model_path)
    ids, mask = prompts(tokenizer)
    torch._dynamo.reset()
    regional = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=True))
    monkeypatch.setattr(hf_static, "supports_regions", lambda model: False)
    whole = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=True))
    eager = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False))
    assert isinstance(whole._step, WholeDecodeStep) and isinstance(eager._step, WholeDecodeStep)
    out, expected, eager_out = (e.generate(ids, mask, params, seed=5) for e in (regional, whole, eager))
    for other in (expected, eager_out):
        assert torch.equal(out["response_ids"], other["response_ids"])
        torch.testing.assert_close(out["rollout_logprobs"], other["rollout_logprobs"], atol=1e-5, rtol=1e-5)


def test_one_layer_graph_serves_every_layer_and_the_layers_own_calls_are_put_back(gqa_model_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    tokenizer, model = load_tokenizer(gqa_model_path), load_causal_lm(gqa_model_path)
    layers = model.get_decoder().layers
    assert len(layers) >= 2
    own = [functools.partial(layer._call_impl) for layer in layers]  # as the train engine's compiled layers
    for layer, call in zip(layers, own):
        layer._compiled_call_impl = call
    ids, mask = prompts(tokenizer)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    engine = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=True))
    engine.generate(ids, mask, SamplingParams(max_new_tokens=6, greedy=True, ignore_eos=True))
    assert [layer._compiled_call_impl for layer in layers] == own
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2  # the layer and sampling

"""Compiles under dynamic=True take Python floats as constants (flowrl.engines.train.regional_compile.
specialized_floats): torch.compile otherwise made the attention scaling a symbol, its tensorify pass gave up
on it and restarted the whole trace (13 s of the decode step's compile on a cold H200, 21 s with warm
caches). The pass runs in AOTAutograd, so the engines' torch.compile gets backend="aot_eager" here."""

import functools

import torch
import torch.fx.passes._tensorify_python_scalars as tensorify

from flowrl.engines.hf.configs import HFStaticRolloutConfig
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.train.regional_compile import CompiledLayers


def counting_restarts(monkeypatch) -> list:
    raised = []

    class Restart(tensorify.TensorifyScalarRestartAnalysis):
        def __init__(self, *args):
            raised.append(args)
            super().__init__(*args)

    monkeypatch.setattr(tensorify, "TensorifyScalarRestartAnalysis", Restart)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    return raised


def test_the_decode_step_compiles_without_a_restart(tiny_model_path, monkeypatch):
    restarts = counting_restarts(monkeypatch)
    tokenizer, model = load_tokenizer(tiny_model_path), load_causal_lm(tiny_model_path)
    ids = torch.tensor([tokenizer.encode("12+3=")] * 4)
    engine = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=True))
    eager = StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False))
    params = SamplingParams(max_new_tokens=5, greedy=True, ignore_eos=True)
    out, expected = (e.generate(ids, torch.ones_like(ids), params) for e in (engine, eager))
    assert torch.equal(out["response_ids"], expected["response_ids"])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert restarts == []


def test_compiled_layers_compile_without_a_restart(tiny_model_path, monkeypatch):
    restarts = counting_restarts(monkeypatch)
    model = load_causal_lm(tiny_model_path)
    layers = CompiledLayers(model)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]] * 2)
    expected = model(input_ids=ids).logits
    with layers.active(), torch.no_grad():
        out = model(input_ids=ids).logits
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert restarts == []

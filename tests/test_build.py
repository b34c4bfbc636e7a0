"""Role building details: activation checkpointing on the trainable models."""

import torch

from flowrl.engines.configs import ModelSource, TrainEngineConfig
from flowrl.engines.models.folders import load_causal_lm


def test_gradient_checkpointing_recomputes_layers_and_keeps_state_dict_keys(tiny_model_path):
    keys = set(load_causal_lm(tiny_model_path).state_dict())
    source = ModelSource(tiny_model_path, gradient_checkpointing=True)
    model = TrainEngineConfig.model_validate({"engine": "hf"}).build(source, head="actor", device="cpu").model
    assert set(model.state_dict()) == keys  # checkpoints and HF export see the same names
    calls = []
    inner = model.model.layers[0]._checkpoint_wrapped_module
    inner.register_forward_pre_hook(lambda *_: calls.append(1))  # recompute may stop early: count starts
    ids = torch.tensor([[3, 4, 5, 6]])
    model(input_ids=ids, labels=ids).loss.backward()
    assert len(calls) == 2  # once forward, once again in backward: activations were not kept

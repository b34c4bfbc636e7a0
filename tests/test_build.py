"""Role building details: activation checkpointing on the trainable models."""

import torch

from flowrl.runtime.factory import _trainable
from flowrl.config import load_run_config
from flowrl.engines.hf_models import load_causal_lm


def test_gradient_checkpointing_recomputes_layers_and_keeps_state_dict_keys(tiny_model_path):
    model = load_causal_lm(tiny_model_path)
    keys = set(model.state_dict())
    model = _trainable(model, load_run_config(None, ["model.gradient_checkpointing=true"]))
    assert set(model.state_dict()) == keys  # checkpoints and HF export see the same names
    calls = []
    inner = model.model.layers[0]._checkpoint_wrapped_module
    inner.register_forward_pre_hook(lambda *_: calls.append(1))  # recompute may stop early: count starts
    ids = torch.tensor([[3, 4, 5, 6]])
    model(input_ids=ids, labels=ids).loss.backward()
    assert len(calls) == 2  # once forward, once again in backward: activations were not kept

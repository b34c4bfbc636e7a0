"""Token-budget micro-batches in the train engine: the same step as row micro-batches, for every loss aggregation."""

import pytest
import torch

from flowrl.engines.configs import ModelSource
from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.models.folders import load_causal_lm
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.rl.ops.aggregate import AGG_MODES, SUM_MODES, agg_loss, agg_weight
from test_engine_hf_train import ROWS, make_batch, stepped_grads
from test_resources_options import per_gpu

# lengths 6, 6, 7, 7, 3, 7, 11, 2: a long row and a short one
LONG_TAIL = ROWS + [([4, 4, 5], [3, 12, 11, 10, 9, 8, 7, 1]), ([2], [1])]


class Reinforce:
    """-A * logp over the loss mask, aggregated in `mode` (flowrl.rl.ops.aggregate): a LossFn."""

    reads = ("advantages", "loss_mask")
    needs = ("logprobs",)

    def __init__(self, mode):
        self.mode, self.combine = mode, "sum" if mode in SUM_MODES else "mean"

    def __call__(self, out, mb):
        loss = agg_loss(-mb["advantages"] * out["logprobs"], mb["loss_mask"], self.mode)
        return loss, {"loss": loss.detach()}

    def weight(self, mb):
        return agg_weight(mb["loss_mask"], self.mode)


def rl_batch():
    batch = make_batch(LONG_TAIL)
    batch["loss_mask"] = batch["response_mask"].clone()
    batch["loss_mask"][1, 0] = 0  # a token the loss does not count
    batch["advantages"] = torch.linspace(-1.0, 1.5, len(LONG_TAIL))[:, None] * batch["response_mask"]
    batch["old_logprobs"] = torch.zeros(batch["response_mask"].shape)
    return batch


def fresh(path, **kwargs):
    # no clipping: the gradient the optimizer steps with is the step's own
    return HFTrainEngine(load_causal_lm(path), HFTrainConfig(lr=1.0, grad_clip=1e9, **kwargs), kind="actor", eps=1.0)


def step_grads(engine, loss, **kwargs):
    grads = stepped_grads(engine)  # the engine frees them after its step
    engine.update(rl_batch(), loss, mini_batch_size=len(LONG_TAIL), **kwargs)
    return grads


@pytest.mark.parametrize("mode", AGG_MODES)
def test_token_budget_step_equals_row_micro_batches(tiny_model_path, mode):
    """token-mean, the seq-means, Dr.GRPO's seq-mean-token-sum-norm and token-sum alike: each micro-batch's
    loss is weighted against the whole mini-batch, so 4 row micro-batches of 2 and token-budget micro-batches
    (16 tokens, padded, as rows' lengths: [11], [7, 7], [7, 6], [6, 3], [2]) give the same gradient."""
    loss = Reinforce(mode)
    rows = step_grads(fresh(tiny_model_path), loss, micro_batch_size=2)
    engine = fresh(tiny_model_path, max_tokens_per_micro_batch=16)
    groups = engine._micro_batches(rl_batch(), 2, 16)
    assert [len(g) for g in groups] == [1, 2, 2, 2, 1]  # not the row split
    budget = step_grads(engine, loss, micro_batch_size=2)
    # to 1e-6 of the gradient's largest entry (0.11 for seq-mean-token-sum-norm .. 6.9 for token-sum; the
    # differences seen are float rounding, 2e-7 of it, as between 4 row micro-batches and 1)
    scale = max(grad.abs().max() for grad in rows.values())
    for name, grad in rows.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(budget[name] / scale, grad / scale, atol=1e-6, rtol=0, msg=name)


def test_packed_token_budget_step_equals_padded_rows(tiny_model_path):
    """Packed micro-batches of at most 24 real tokens: the padded row step's gradient, to float rounding."""
    loss = Reinforce("seq-mean-token-mean")
    rows = step_grads(fresh(tiny_model_path), loss, micro_batch_size=2)
    packed = step_grads(fresh(tiny_model_path, max_tokens_per_micro_batch=24, packing=True), loss, micro_batch_size=2)
    for name, grad in rows.items():
        torch.testing.assert_close(packed[name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_forward_budget_gives_the_row_outputs(tiny_model_path):
    """No-grad passes by forward_max_tokens_per_micro_batch (here 10 tokens, padded): the outputs of row passes,
    back in the batch's row order."""
    batch = make_batch(LONG_TAIL)
    rows = fresh(tiny_model_path).forward(batch, micro_batch_size=3)["logprobs"]
    engine = fresh(tiny_model_path, max_tokens_per_micro_batch=1000, forward_max_tokens_per_micro_batch=10)
    # lengths 11 | 7 | 7 | 7 | 6 | 6 | 3, 2 (2 x 3 <= 10)
    assert engine.forward_max_tokens == 10 and len(engine._micro_batches(batch, 3, 10)) == 7
    torch.testing.assert_close(engine.forward(batch, micro_batch_size=3)["logprobs"], rows, atol=1e-6, rtol=0)


def test_config_builds_the_budget_and_refuses_a_negative_one(tiny_model_path):
    engine = HFTrainConfig(max_tokens_per_micro_batch=64, packing=True).build(ModelSource(tiny_model_path),
                                                                             head="actor", device="cpu")
    assert (engine.max_tokens, engine.forward_max_tokens, engine.packing) == (64, 64, True)
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch\n.*greater than or equal to 0"):
        HFTrainConfig(max_tokens_per_micro_batch=-1)


def test_the_memory_estimate_uses_the_token_budget():
    """Qwen2.5-0.5B, rows of 1024 tokens, 16-row micro-batches over 2 ranks: 8192 tokens a micro-batch; a budget
    of 4096 tokens halves the actor's activations, 24 h + 8 i bytes per token and layer (24 layers, h = 896,
    i = 4864); the reference's no-grad passes (4 bytes per hidden unit) follow forward_max_tokens_per_micro_batch;
    a budget under one row is one row."""
    layer = 24 * 896 + 8 * 4864  # 60,416 B: 67 per hidden unit, the H200's measured 66 (flowrl.engines.memory)
    rows = per_gpu()
    assert rows["actor"]["activations"] == 8192 * 24 * layer
    budget = per_gpu(max_tokens_per_micro_batch=4096, forward_max_tokens_per_micro_batch=2048)
    assert budget["actor"]["activations"] == 4096 * 24 * layer
    assert budget["ref"]["activations"] == 2048 * 24 * 896 * 4 and rows["ref"]["activations"] == 8192 * 24 * 896 * 4
    assert per_gpu(max_tokens_per_micro_batch=100)["actor"]["activations"] == 1024 * 24 * layer
    assert per_gpu(compile=True)["actor"]["activations"] == 8192 * 24 * (18 * 896 + 6 * 4864)  # compiled: fewer

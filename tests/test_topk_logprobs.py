"""The train engine's [B, R, K] outputs (flowrl.engines.train.model_outputs): a distribution's top-k logprobs and
their ids, and the logprobs at ids a batch column holds (on-policy distillation's forward top-k KL). Each
equals an unpadded reference forward of the row, whichever way the engine computes it: full logits, chunks
of the hidden states, packed rows."""

import pytest
import torch

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.models.folders import load_causal_lm
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train.model_outputs import check_outputs, logprobs_at, topk_outputs
from test_engine_hf_train import ROWS, make_batch

K = 3
MODES = {"full logits": {"logprob_chunk_tokens": 0}, "chunks": {"logprob_chunk_tokens": 5},
         "packed": {"packing": True, "logprob_chunk_tokens": 0},
         "packed chunks": {"packing": True, "logprob_chunk_tokens": 4}}


def reference_logprobs(model, prompt, response):
    """[len(response), V]: the logprobs of each response token's distribution, one unpadded row."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:-1], -1)


def with_ids(batch, seed=0):
    """The batch with a column "ids" of K random token ids per response token."""
    g = torch.Generator().manual_seed(seed)
    batch["ids"] = torch.randint(0, 16, (*batch["response_ids"].shape, K), generator=g)
    return batch


@pytest.mark.parametrize("mode", MODES)
def test_topk_and_gathered_logprobs_equal_an_unpadded_forward(tiny_model_path, mode):
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(**MODES[mode]), kind="actor")
    batch = with_ids(make_batch(ROWS, 9, 7))
    top_logprobs, top_ids = topk_outputs(K)
    out = engine.forward(batch, micro_batch_size=4, outputs=("logprobs", top_logprobs, top_ids, logprobs_at("ids")))
    assert out[top_ids].shape == out[logprobs_at("ids")].shape == (len(ROWS), 7, K)
    assert out[top_ids].dtype == torch.int64
    for i, (prompt, response) in enumerate(ROWS):
        logp = reference_logprobs(engine.model, prompt, response)
        values, ids = torch.topk(logp, K, dim=-1)
        n = len(response)
        torch.testing.assert_close(out[top_logprobs][i, :n], values, atol=1e-5, rtol=0)
        assert torch.equal(out[top_ids][i, :n], ids)
        torch.testing.assert_close(out[logprobs_at("ids")][i, :n], logp.gather(-1, batch["ids"][i, :n]),
                                   atol=1e-5, rtol=0)
        assert not out[top_logprobs][i, n:].any() and not out[top_ids][i, n:].any()  # 0 on padding


class GatheredNLL:
    """-token-mean of the logprobs at the ids of column "ids" (summed over K): a loss needing logprobs_at."""

    reads = ("response_mask", "ids")
    needs = ("logprobs", logprobs_at("ids"))
    combine = "mean"

    def __call__(self, out, mb):
        mask = mb["response_mask"].float()
        loss = -(out[logprobs_at("ids")].sum(-1) * mask).sum() / mask.sum()
        return loss, {"gathered_nll": loss.detach()}

    def weight(self, mb):
        return float(mb["response_mask"].sum())


def test_an_update_through_gathered_logprobs_is_the_same_chunked_or_not(tiny_model_path):
    """The gradient flows through the chunks (recomputed in backward) as through the full logits."""
    batch = with_ids(make_batch(ROWS), seed=1)
    # eps=1: Adam's step ~ lr * g / (|g| + 1), as sensitive to the gradient as to its sign (k_proj's bias has
    # a gradient of ~0, whose rounding sign alone would move it by lr under the default eps)
    engines = [HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(lr=0.1, **MODES[mode]), kind="actor", eps=1.0)
               for mode in ("full logits", "chunks")]
    metrics = [engine.update(batch, GatheredNLL(), mini_batch_size=6, micro_batch_size=4) for engine in engines]
    assert metrics[0]["gathered_nll"] == pytest.approx(metrics[1]["gathered_nll"], abs=1e-5)
    assert metrics[0]["grad_norm"] == pytest.approx(metrics[1]["grad_norm"], rel=1e-4)
    for (name, a), b in zip(engines[0].model.named_parameters(), engines[1].model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
    after = engines[0].update(batch, GatheredNLL(), mini_batch_size=6, micro_batch_size=4)
    assert after["gathered_nll"] < metrics[0]["gathered_nll"]  # the step raised the logprobs at those ids


def test_bad_names_fail_naming_the_output():
    assert check_outputs("actor", ("logprobs", "topk_ids:4", "logprobs_at:teacher_topk_ids")) == (
        "logprobs", "topk_ids:4", "logprobs_at:teacher_topk_ids")
    for bad in ("topk_ids:0", "topk_ids", "topk_logprobs:x", "logprobs_at:"):
        with pytest.raises(ValueError, match=f"cannot compute {bad!r}"):
            check_outputs("actor", (bad,))
    with pytest.raises(ValueError, match="topk"):
        topk_outputs(0)
    with pytest.raises(ValueError, match="cannot compute 'topk_ids:2'"):
        check_outputs("critic", ("topk_ids:2",))

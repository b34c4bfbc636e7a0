"""A loss is a sum of terms, each declaring the batch fields it reads and the model outputs it needs; the train
engine computes only the outputs a loss needs, from one output table (flowrl.engines.train.model_outputs), so a new
per-token statistic is one table entry plus the term that uses it."""

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.configs import HFTrainConfig
import flowrl as fl
from fakes import ROLE_CLASSES
from flowrl.engines.models.folders import load_causal_lm
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train.model_outputs import TOKEN_OUTPUTS, check_outputs
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.rl.distillation import DistillTerm  # noqa: F401 (registers the "distill" term)
from flowrl.rl.loss_terms import TERMS, EntropyTerm, KLTerm, Loss, PolicyTerm, ValueTerm
from flowrl.rl.ops.policy_loss import ppo_clip
from test_engine_hf_train import ROWS, make_batch


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


MASK = t([1, 1, 0], [1, 0, 0])  # 3 valid tokens in 2 rows
CLIP = PolicyTerm(partial(ppo_clip, clip_low=0.2, clip_high=0.2))


def policy_batch():
    """logp = old = 0 (ratio 1); advantages 1 in row 0, -4 in row 1."""
    return TensorDict({"old_logprobs": torch.zeros(2, 3), "advantages": t([1, 1, 1], [-4, -4, -4]),
                       "ref_logprobs": t([0, 1, 0], [-1, 0, 0]), "loss_mask": MASK}, batch_size=[2])


def test_reads_and_needs_are_the_terms_unions():
    assert Loss((CLIP,)).reads == ("old_logprobs", "advantages", "loss_mask") and Loss((CLIP,)).needs == ("logprobs",)
    correction = RolloutCorrectionConfig(is_level="token", is_threshold=2.0).build()
    full = Loss((CLIP, KLTerm(0.1), EntropyTerm(0.01)), rollout_correction=correction)
    assert full.reads == ("old_logprobs", "advantages", "loss_mask", "ref_logprobs", "rollout_logprobs")
    assert full.needs == ("logprobs", "entropy")
    value = Loss((ValueTerm(0.5),))
    assert value.reads == ("values", "returns", "loss_mask") and value.needs == ("values",)
    assert TERMS.names() == ["distill", "entropy", "kl", "nll", "policy", "value"]  # distill: rl.distillation


def test_the_sum_of_terms_by_hand():
    loss_fn = Loss((CLIP, KLTerm(0.1, "k2"), EntropyTerm(0.01)))
    out = {"logprobs": torch.zeros(2, 3, requires_grad=True), "entropy": t([1, 2, 9], [3, 9, 9])}
    loss, metrics = loss_fn(out, policy_batch())
    # ratio 1: pg = -A on valid tokens [-1, -1, 4], token-mean 2/3; k2 = .5 (0 - ref)^2 = [0, .5, .5]: 1/3;
    # entropy [1, 2, 3]: 2. loss = 2/3 + .1 * 1/3 - .01 * 2 = .68
    assert loss.item() == pytest.approx(0.68)
    assert metrics["pg_loss"] == pytest.approx(2 / 3) and metrics["kl_loss"] == pytest.approx(1 / 3)
    assert metrics["entropy"] == pytest.approx(2.0) and metrics["clipfrac"] == 0.0


def test_dr_grpo_sums_each_row_over_a_constant_length():
    from flowrl.rl.losses import dr_grpo_loss, ppo_loss

    loss_fn = dr_grpo_loss(norm_len=4)
    out = {"logprobs": torch.zeros(2, 3, requires_grad=True)}
    # ratio 1: pg = -A on valid tokens, row 0 [-1, -1], row 1 [4]: (-2 / 4 + 4 / 4) / 2 rows = .25
    assert loss_fn(out, policy_batch())[0].item() == pytest.approx(0.25)
    # GRPO's clip, another aggregation
    assert loss_fn.term("pg_loss").objective.keywords == ppo_loss().term("pg_loss").objective.keywords


def test_a_loss_refuses_no_terms_a_repeated_term_and_a_zero_kl():
    with pytest.raises(ValueError, match="terms"):
        Loss(())
    with pytest.raises(ValueError, match="terms"):
        Loss((CLIP, CLIP))
    with pytest.raises(ValueError, match="kl_coef"):
        KLTerm(0.0)


def test_each_kind_of_engine_offers_its_own_outputs():
    assert check_outputs("actor", ["logprobs", "sum_pi_squared", "logprobs"]) == ("logprobs", "sum_pi_squared")
    with pytest.raises(ValueError, match="cannot compute 'values'"):
        check_outputs("actor", ("values",))
    with pytest.raises(ValueError, match="cannot compute 'entropy'.*'values'"):
        check_outputs("critic", ("entropy",))


def test_an_unknown_output_fails_when_the_graph_is_traced():
    @fl.algorithm
    def asks_for_a_typo(batch, actor, rollout):
        batch = rollout.generate(batch)
        return actor.logprobs(batch, outputs=("sum_pi_sqared",))

    with pytest.raises(ValueError, match="sum_pi_sqared"):
        asks_for_a_typo.trace({"prompt_ids", "prompt_mask", "uid"}, ROLE_CLASSES)


@dataclass(frozen=True)
class Top1Bonus:
    """A term needing an output no built-in term does: a bonus on max_v pi(v) (a made-up estimator)."""

    bonus: float
    metric: ClassVar[str] = "top1"
    corrected: ClassVar[bool] = False
    reads: ClassVar[tuple[str, ...]] = ("loss_mask",)
    needs: ClassVar[tuple[str, ...]] = ("top1_prob",)

    @property
    def coef(self) -> float:
        return -self.bonus

    def __call__(self, out, mb, is_weights_BT):
        return out["top1_prob"], {}


class Recorded(Loss):
    """Remembers the outputs each micro-batch got."""

    seen: ClassVar[list] = []

    def __call__(self, out, mb):
        Recorded.seen.append(sorted(out))
        return super().__call__(out, mb)


def test_the_engine_computes_exactly_the_outputs_the_terms_need(tiny_model_path, monkeypatch):
    # a new statistic: one entry of the output table and the term that reads it, nothing else
    monkeypatch.setitem(TOKEN_OUTPUTS._entries, "top1_prob",
                        lambda logits_NV, logprobs_NV, tokens_N: logprobs_NV.max(-1).values.exp())
    batch = make_batch(ROWS[:3])
    batch["loss_mask"] = batch["response_mask"].clone()
    batch["old_logprobs"] = torch.zeros(batch["response_mask"].shape)
    batch["advantages"] = batch["response_mask"].float()
    engine = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(), kind="actor")
    for terms, expected in [((CLIP,), ["logprobs"]), ((CLIP, EntropyTerm(0.01)), ["entropy", "logprobs"]),
                            ((CLIP, Top1Bonus(0.1)), ["logprobs", "top1_prob"])]:
        Recorded.seen = []
        metrics = engine.update(batch, Recorded(terms), mini_batch_size=4, micro_batch_size=2)
        assert Recorded.seen == [expected, expected], terms
    assert 0 < metrics["top1"] <= 1  # the term before its coefficient: the mean top-1 probability
    out = engine.forward(batch, outputs=("top1_prob",))
    assert set(out) == {"top1_prob"}
    with torch.no_grad():
        prompt, response = ROWS[0]
        logits = engine.model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    torch.testing.assert_close(out["top1_prob"][0, :len(response)], torch.softmax(logits, -1).max(-1).values,
                               atol=1e-5, rtol=0)

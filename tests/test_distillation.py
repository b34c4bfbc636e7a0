"""On-policy distillation: verl's distillation losses (tests/verl_reference.py transcribes
verl/trainer/distillation, v0.9.0 = 1dda039), the teacher role, and a CPU run on tiny models in which the
student's KL to its teacher falls.

verl's compute_distillation_loss_reverse_kl_estimator:

    distillation_losses = kl_penalty(
        logprob=student_log_probs, ref_logprob=teacher_log_probs, kl_penalty=loss_config.loss_mode
    )

and with use_policy_gradient:

        distillation_loss, pg_metrics = policy_loss_fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=-distillation_losses.detach(),
"""

import math

import pytest
import torch
from tensordict import TensorDict

import verl_reference as verl
from flowrl.config import load_run_config
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.rl.distillation import STUDENT_AT_TEACHER_TOPK, DistillTerm
from flowrl.rl.loss_terms import Loss
from flowrl.rl.ops.distillation import estimator_loss, forward_kl_topk
from flowrl.runtime.trainer import train

ln = math.log


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


def test_estimator_losses_by_hand():
    logp, teacher, mask = t(ln(0.5), ln(0.5), 0.0), t(ln(0.25), ln(1.0), float("nan")), t(1, 1, 0)
    # k1 = logp - teacher = [ln 2, -ln 2]; k3 = r - ln r - 1, r = teacher / student = [.5, 2]
    assert torch.allclose(estimator_loss(logp, teacher, mask, "k1"), t(0.693147, -0.693147, 0.0), atol=1e-6)
    assert torch.allclose(estimator_loss(logp, teacher, mask, "k3"), t(0.193147, 0.306853, 0.0), atol=1e-6)
    # clamped to +-.5: k1 [.5, -.5]
    assert torch.allclose(estimator_loss(logp, teacher, mask, "k1", 0.5), t(0.5, -0.5, 0.0))


def test_forward_kl_topk_by_hand():
    # teacher top-2 [ln .5, ln .25], student at those ids [ln .25, ln .25]: .5 ln 2 + 0 = .346574
    loss = forward_kl_topk(t([[[ln(0.25), ln(0.25)]]]), t([[[ln(0.5), ln(0.25)]]]), t([[1]]))
    assert loss.item() == pytest.approx(0.346574, abs=1e-6)


def test_forward_kl_topk_renorm_by_hand():
    # renormalised over the top-2: teacher [2/3, 1/3], student [1/2, 1/2]:
    # 2/3 ln(4/3) + 1/3 ln(2/3) = .191788 - .135155 = .056633
    loss = forward_kl_topk(t([[[ln(0.25), ln(0.25)]]]), t([[[ln(0.5), ln(0.25)]]]), t([[1]]), renorm=True)
    assert loss.item() == pytest.approx(0.056633, abs=1e-6)


def topk_case(seed, k=4):
    """Student logits, the teacher's top-k logprobs and ids, and a mask with interior gaps."""
    g = torch.Generator().manual_seed(seed)
    student_logits = 3 * torch.randn(4, 6, 11, generator=g)
    teacher_logp = torch.log_softmax(3 * torch.randn(4, 6, 11, generator=g), -1)
    top_logp, top_ids = torch.topk(teacher_logp, k, dim=-1)
    return student_logits, top_logp, top_ids, (torch.rand(4, 6, generator=g) > 0.3).float()


@pytest.mark.parametrize("renorm", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_forward_kl_topk_equals_verls(seed, renorm):
    student_logits, top_logp, top_ids, mask = topk_case(seed)
    reference = verl.forward_kl_topk_renorm if renorm else verl.forward_kl_topk
    expected = reference(student_logits, top_logp, top_ids) * mask
    student_at_ids = torch.log_softmax(student_logits, -1).gather(-1, top_ids)
    assert torch.allclose(forward_kl_topk(student_at_ids, top_logp, mask, renorm=renorm), expected, atol=1e-6)


@pytest.mark.parametrize("kind", ["forward_kl_topk", "forward_kl_topk_renorm"])
def test_the_topk_term_is_verls_supervised_loss(kind):
    """verl's compute_forward_kl_topk / _renorm, token-mean over the loss mask (agg_loss), from the teacher's
    top-k and the student's logprobs at those ids (the engine's logprobs_at output)."""
    student_logits, top_logp, top_ids, mask = topk_case(7)
    reference = verl.forward_kl_topk_renorm if kind.endswith("renorm") else verl.forward_kl_topk
    expected = (reference(student_logits, top_logp, top_ids) * mask).sum() / mask.sum()
    mb = TensorDict({"teacher_topk_logprobs": top_logp, "teacher_topk_ids": top_ids, "loss_mask": mask},
                    batch_size=[4])
    student_logp = torch.log_softmax(student_logits, -1)
    out = {"logprobs": student_logp[..., 0], STUDENT_AT_TEACHER_TOPK: student_logp.gather(-1, top_ids)}
    loss = Loss((DistillTerm(kind, policy_gradient=False),))
    value, metrics = loss(out, mb)
    assert value.item() == pytest.approx(expected.item(), abs=1e-6)
    assert metrics["distill_kl"].item() == pytest.approx(expected.item(), abs=1e-6)
    teacher_mass = (top_logp.exp().sum(-1) * mask).sum() / mask.sum()  # verl's distillation/teacher_mass
    assert metrics["distill_teacher_mass"].item() == pytest.approx(teacher_mass.item(), abs=1e-6)
    assert loss.reads == ("teacher_topk_logprobs", "teacher_topk_ids", "loss_mask")
    assert loss.needs == ("logprobs", "logprobs_at:teacher_topk_ids")


@pytest.mark.parametrize("kind", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"])
def test_estimator_losses_equal_verls(kind):
    g = torch.Generator().manual_seed(0)
    logp, teacher = -3 * torch.rand(5, 7, generator=g), -6 * torch.rand(5, 7, generator=g)
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    expected = verl.distillation_estimator(logp, teacher, kind, 1.0) * mask
    assert torch.allclose(estimator_loss(logp, teacher, mask, kind, 1.0), expected, atol=1e-6)


def distill_batch(seed):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(6, 8, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    old = -2 * torch.rand(6, 8, generator=g)
    return TensorDict({"old_logprobs": old, "teacher_logprobs": old + torch.randn(6, 8, generator=g),
                       "loss_mask": mask}, batch_size=[6]), old + 0.2 * torch.randn(6, 8, generator=g)


@pytest.mark.parametrize("seed", range(3))
def test_the_term_is_verls_supervised_and_policy_gradient_loss(seed):
    mb, logp = distill_batch(seed)
    mask = mb["loss_mask"]
    kl = verl.distillation_estimator(logp, mb["teacher_logprobs"], "k3")
    supervised, metrics = Loss((DistillTerm("k3", policy_gradient=False),))({"logprobs": logp}, mb)
    assert supervised.item() == pytest.approx(((kl * mask).sum() / mask.sum()).item(), abs=1e-6)
    assert metrics["distill_kl"].item() == pytest.approx(supervised.item(), abs=1e-6)
    pg, _ = Loss((DistillTerm("k1"),))({"logprobs": logp}, mb)
    tokens = verl.vanilla(mb["old_logprobs"], logp, -verl.distillation_estimator(logp, mb["teacher_logprobs"], "k1"),
                          mask, 0.2, 0.2)
    assert pg.item() == pytest.approx(((tokens * mask).sum() / mask.sum()).item(), abs=1e-6)
    assert Loss((DistillTerm(),)).reads == ("teacher_logprobs", "loss_mask", "old_logprobs")
    with pytest.raises(ValueError, match="kind"):
        DistillTerm("forward_kl")


def peaked_teacher(tmp_path):
    """A tiny model of another seed with its final norm's weight times 6: logits 6x larger, a sharp
    distribution far from the near-uniform student's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowrl.data.builtin.arithmetic import ArithmeticTask

    base = build_tiny_model(tmp_path / "base", chars=ArithmeticTask.chars, seed=7)
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
    model.save_pretrained(tmp_path / "teacher")
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp_path / "teacher")
    return tmp_path / "teacher"


@pytest.mark.parametrize("kind, policy_gradient", [("k1", "true"), ("k3", "false")])
def test_the_students_kl_to_its_teacher_falls_on_cpu(tmp_path, kind, policy_gradient):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path / 'run'}", "algorithm=distill", "train.steps=10",
                                 "train.batch_size=16", "roles.actor.mini_batch_size=16", "roles.actor.micro_batch_size=16",
                                 "checkpoint.every=0", "checkpoint.export=false",
                                 f"roles.teacher.model={peaked_teacher(tmp_path)}", "roles.actor.lr=1e-2",
                                 f"algo.kind={kind}", f"algo.policy_gradient={policy_gradient}"])
    history = train(cfg, progress=False)
    kl = [row["actor/distill_kl"] for row in history]  # the mean estimate on each step's own samples
    assert len(kl) == 10 and all(math.isfinite(v) for v in kl)
    assert sum(kl[-3:]) / 3 < 0.6 * sum(kl[:3]) / 3, kl


@pytest.mark.parametrize("kind", ["forward_kl_topk", "forward_kl_topk_renorm"])
def test_the_students_topk_kl_to_its_teacher_falls_on_cpu(tmp_path, kind):
    """The teacher writes its top-4 logprobs and ids (teacher.logprobs(batch, topk=4)); the student's update
    gathers its own logprobs at those ids and descends verl's forward top-k KL, supervised."""
    cfg = load_run_config(None, [f"train.output_dir={tmp_path / 'run'}", "algorithm=distill", "train.steps=8",
                                 "train.batch_size=16", "roles.actor.mini_batch_size=16", "roles.actor.micro_batch_size=8",
                                 "checkpoint.every=0", "checkpoint.export=false",
                                 f"roles.teacher.model={peaked_teacher(tmp_path)}", "roles.actor.lr=1e-2",
                                 f"algo.kind={kind}", "algo.policy_gradient=false", "algo.topk=4",
                                 "roles.actor.logprob_chunk_tokens=16"])
    history = train(cfg, progress=False)
    kl = [row["actor/distill_kl"] for row in history]  # the mean top-k KL on each step's own samples
    assert len(kl) == 8 and all(math.isfinite(v) and v >= 0 for v in kl)
    assert sum(kl[-3:]) / 3 < 0.6 * sum(kl[:3]) / 3, kl
    mass = [row["actor/distill_teacher_mass"] for row in history]  # the peaked teacher's top-4 hold most of it
    assert all(0.5 < m <= 1.0 + 1e-6 for m in mass), mass


def test_a_teacher_needs_its_own_model(tmp_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "algorithm=distill", "train.steps=1"])
    with pytest.raises(ValueError, match="roles.teacher.model"):
        train(cfg, progress=False)

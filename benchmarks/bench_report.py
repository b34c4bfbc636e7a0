"""`grpo_vs_trl.py`'s printed summary: each system's line, flowrl's details and the ratios to flowrl
(`report`), and `--report`'s ratios per workload of a JSONL file (`report_file`)."""

from __future__ import annotations

import json
from pathlib import Path

from bench_workload import PEAK_FLOPS, PEAK_NAME


def fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def report_flowrl(r: dict) -> None:
    t = r["timing_s"]
    print(f"        rollout {fmt(r['rollout_tok_s'], ',.0f')} tok/s ({r['response_tokens']} tokens in "
          f"{fmt(t.get('rollout.generate'), '.3f')} s); update {fmt(t.get('actor.update'), '.3f')} s, MFU "
          f"{fmt(r['update_mfu'], '.1%')} (6 x {r['num_params'] / 1e6:.1f}M params x {r['update_tokens']} tokens "
          f"/ {PEAK_NAME} {PEAK_FLOPS / 1e12:.0f} TFLOP/s); prompt width {r['prompt_width']}")
    print("        timing_s: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
    print(f"        memory (max over steps): {r.get('memory_max')}; first step done "
          f"{fmt(r.get('first_step_s_since_start'), '.1f')} s after the process started")
    print(f"        rollout config: {r['rollout']}")
    print(f"        logprobs trainer vs sampler: mean |diff| {fmt(r.get('logprob_diff_mean'), '.2e')}, max "
          f"{fmt(r.get('logprob_diff_max'), '.2e')} over {r.get('logprob_diff_tokens')} tokens "
          f"{r.get('logprob_diff', '')}")


def report(results: dict) -> dict:
    """Prints each system's line and the ratios (other system's s/step over flowrl's); returns the ratios."""
    for name, r in results.items():
        if "error" in r:
            print(f"{name:7s} FAILED: {r['error']}")
            continue
        print(f"{name:8s} {fmt(r['s_per_step'], '.3f')} s/step  peak {fmt(r.get('peak_gib'), '.1f')} GiB  "
              f"useful {fmt(r.get('useful_tok_per_step_s'), ',.0f')} tok/s of step")
        if name.startswith("flowrl"):
            report_flowrl(r)
    ok = {n: r["s_per_step"] for n, r in results.items() if r.get("s_per_step")}
    ratios = {f"{other}/{mine}": ok[other] / ok[mine] for mine in ok if mine.startswith("flowrl")
              for other in ("trl", "trl_vllm", "plain", "verl") if other in ok}
    for key, ratio in ratios.items():
        print(f"GRPO step {key}: {ratio:.2f}x")
    return ratios


def report_file(path: str) -> None:
    """The ratios per workload of the RESULT lines in a JSONL file."""
    workloads: dict[str, dict] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        wl = row["workload"]
        key = f"{wl['prompts']}x{wl['group']}, {wl['new_tokens']} new, {wl['lengths']}"
        workloads.setdefault(key, {})[row["system"]] = row["result"]
    for key, results in workloads.items():
        print(f"=== {key}")
        report(results)


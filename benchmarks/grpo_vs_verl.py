"""A GRPO step on one card: flowrl beside verl itself (verl 0.9.1's trainer entry point, GRPO, FSDP, vLLM
colocated), the workload of grpo_vs_trl.py (its options, lengths and RESULT lines).

flowrl runs in this process with `train.device=cuda` alone; verl runs as `python -m verl.trainer.main_ppo` in a
process of its own (benchmarks/verl_system.py: its settings, the forced lengths, what is read back). Each
system's GPU memory in use (nvidia-smi, all processes, every 0.5 s) is reported as gpu_used_peak_gib, beside
each one's own peak allocated. Usage (on the device, after benchmarks/verl_carry.sh's wheels are installed):
  python benchmarks/grpo_vs_verl.py --device cuda --systems flowrl,verl --steps 3 [--lengths variable]
      [--prompts 16 --new-tokens 1024 --shape qwen1.5b] [--verl-set KEY=VALUE ...] [--jsonl runs.jsonl]
  python benchmarks/grpo_vs_verl.py --report runs.jsonl
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

import grpo_vs_trl  # noqa: E402  (puts the project root and benchmarks/ on sys.path, starts the clock)
import common  # noqa: E402
import forced_lengths  # noqa: E402
from verl_system import run_verl, watch_gpu_memory  # noqa: E402

QWEN15B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
               intermediate_size=8960, vocab_size=151936)
"""The shape of Qwen2.5-1.5B."""


def with_gpu_peak(runner):
    """The runner, with the GPU's memory in use (all processes) sampled while it runs."""
    def run(wl, path):
        stop, peaks = threading.Event(), [0.0]
        watcher = threading.Thread(target=watch_gpu_memory, args=(stop, peaks), daemon=True)
        watcher.start()
        try:
            result = runner(wl, path)
        finally:
            stop.set()
            watcher.join()
        result.setdefault("gpu_used_peak_gib", peaks[0] / 1024)
        return result
    return run


def main() -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--verl-set", action="append", default=[], metavar="KEY=VALUE", help="extra hydra override")
    p.add_argument("--verl-log", default=os.environ.get("OUT", ".") + "/verl.log", help="verl's own output")
    p.add_argument("--shape", choices=("qwen0.5b", "qwen1.5b"), default="qwen0.5b")
    p.add_argument("--verl-deadline", type=float, default=480, help="seconds before verl's processes are killed")
    p.add_argument("--verl-fallback", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides of a second try, made only where the first logged no step and its log names "
                        "the v1 trainer or TransferQueue")
    args, rest = p.parse_known_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still runs run_verl's cleanup
    if args.shape == "qwen1.5b":
        common.QWEN05B.clear()
        common.QWEN05B.update(QWEN15B)  # grpo_vs_trl's workload() reads this dict (same object)
    folder = tempfile.mkdtemp(prefix="verl-bench-")

    def verl(wl, path):
        if wl.variable:  # the same draws, through the vLLM logits-processor plugin, in verl's vLLM process
            forced_lengths.install_vllm_plugin(folder + "/plugin")
        try:
            return {**run_verl(wl, path, folder, args.verl_set, args.verl_log, args.verl_deadline),
                    "verl_set": args.verl_set}  # the overrides beyond verl_system's own, with the figures
        except RuntimeError as err:
            if not args.verl_fallback or not any(k in str(err) for k in ("transfer_queue", "ppo/v1", "TaskRunnerV1")):
                raise
            print(f"verl: first try failed ({str(err)[-300:]}); again with {args.verl_fallback}", flush=True)
            result = run_verl(wl, path, folder, args.verl_set + args.verl_fallback, args.verl_log + ".2",
                              args.verl_deadline)
            return {**result, "verl_set": args.verl_set, "fallback": args.verl_fallback,
                    "first_try_error": str(err)[-2000:]}

    grpo_vs_trl.RUNNERS["flowrl"] = with_gpu_peak(grpo_vs_trl.RUNNERS["flowrl"])
    grpo_vs_trl.RUNNERS["verl"] = verl
    sys.argv = [sys.argv[0], *rest]
    grpo_vs_trl.main()


if __name__ == "__main__":
    main()

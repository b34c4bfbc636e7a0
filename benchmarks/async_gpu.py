"""grpo and grpo_async (k = 0, 1, 2, batched or streamed) on one GPU: steps/s, useful tokens/s, GPU idle fraction.

Issue 25's GPU half of benchmarks/async_cpu.py, on the local executor (generation pauses while the actor trains).
Workload: the Qwen2.5-0.5B shape, random bf16 weights; `--prompts` x `--group` rows of `--prompt-len` prompt
tokens, each response ending with eos at a log-normal drawn length (median a quarter of `--new-tokens`, capped
there; benchmarks/forced_lengths.py), the draws restarting at each setting (the same lengths in submission
order; a sample resumed after a partial abort draws again). Settings (`--settings`, run in that order): `grpo`
(synchronous), `K` (grpo_async, max_staleness K, batched), `Ks` (algo.stream=true), `Ksp` (streamed, with
roles.rollout.partial=true). They run in one child process sharing one vLLM engine (vLLM starts once; awake
throughout, free_cache_engine=0, as the streamer needs; each setting reloads the checkpoint into it). A setting
that fails prints its error; one past `--setting-timeout` is killed with its process and a new child runs the
rest; `--deadline` bounds the whole run. roles.actor.compile=false unless `--set roles.actor.compile=true`.

One JSON line per setting as it ends: the setting; steps_per_s, s_per_step and useful_tok_per_s (response
tokens of the trained rows, eos included) over the timed window (end of step 1 to end of the last); the window's
gpu_idle_fraction (1 - mean utilization.gpu / 100, `nvidia-smi -lms 100`; null off CUDA), gpu_zero_fraction
(samples at 0 %); mean response length, staleness, dropped, stream/wait_s, generate and update seconds; the first
step's seconds and build_s (setting start to the end of step 1). Usage (CPU dry run: --smoke --device cpu):
PYTHONUNBUFFERED=1 python benchmarks/async_gpu.py [--engine vllm|hf_static] [--steps 6] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import forced_lengths  # noqa: E402
from common import QWEN05B, SMALL, alias_algorithms, qwen_model  # noqa: E402
from grpo_vs_trl import BenchTask  # noqa: E402

SMOKE = dict(prompts=4, group=2, new_tokens=24, prompt_len=16, steps=3, micro=4)
FULL = dict(prompts=16, group=8, new_tokens=256, prompt_len=128, steps=6, micro=32)
_ENGINE = None  # the child's one vLLM engine, shared by its settings
START = time.monotonic()


def register_shared_vllm() -> None:
    """`roles.rollout.engine=vllm_shared`: flowrl's vLLM engine, built once per process; a later build reloads the
    checkpoint's weights into it, and a role's close leaves it running (closed at the process's end)."""
    from safetensors.torch import load_file

    from flowrl.engines.configs import ROLLOUT_ENGINES
    from flowrl.engines.vllm.rollout import VLLMRolloutConfig, VLLMRolloutEngine

    class KeptEngine(VLLMRolloutEngine):
        def close(self) -> None:  # a role's close: the next setting uses it (shutdown() at the process's end)
            pass

        shutdown = VLLMRolloutEngine.close

    class SharedConfig(VLLMRolloutConfig):
        def build(self, source, *, tokenizer, device, share=None):
            global _ENGINE
            if _ENGINE is None:
                _ENGINE = KeptEngine(source, tokenizer, device=device, config=self)
            else:
                _ENGINE.load_weights(load_file(str(Path(source.path) / "model.safetensors")))
            return _ENGINE

    ROLLOUT_ENGINES.register("vllm_shared", SharedConfig)


def parse_setting(text: str) -> dict:
    if text == "grpo":
        return {"setting": text, "algorithm": "grpo", "k": None, "stream": False, "partial": False}
    k, flags = text[:1], text[1:]
    if not k.isdigit() or flags not in ("", "s", "sp"):
        raise SystemExit(f"--settings: {text!r} is not grpo, K, Ks or Ksp (K a digit)")
    return {"setting": text, "algorithm": "grpo_async", "k": int(k), "stream": "s" in flags, "partial": "p" in flags}


def failed(text: str, args: argparse.Namespace, error: str) -> dict:
    return {**parse_setting(text), "engine": args.engine, "error": error}


def run_config(s: dict, args: argparse.Namespace, model: str, out: str):
    from flowrl.config import load_run_config

    rows = args.prompts * args.group
    sets = [f"algorithm={s['algorithm']}", f"model.path={model}", f"model.dtype={args.dtype}",
            f"train.device={args.device}", f"train.steps={args.steps}", f"train.batch_size={args.prompts}",
            f"algo.group_size={args.group}", f"roles.actor.mini_batch_size={rows}",
            f"roles.actor.micro_batch_size={args.micro}",
            "roles.actor.lr=1e-6", f"roles.rollout.max_new_tokens={args.new_tokens}", "roles.actor.compile=false",
            "eval.every=0", "checkpoint.every=0", "checkpoint.export=false", "checkpoint.resume=false",
            f"train.output_dir={out}"]
    if s["algorithm"] == "grpo_async":
        sets += [f"algo.max_staleness={s['k']}", f"algo.stream={str(s['stream']).lower()}",
                 f"roles.rollout.partial={str(s['partial']).lower()}", f"roles.rollout.max_in_flight={3 * rows}"]
    if args.engine == "vllm":
        sets += ["roles.rollout.engine=vllm_shared", "roles.rollout.free_cache_engine=0",
                 f"roles.rollout.max_num_seqs={max(256, 4 * rows)}"]
        sets += ["roles.rollout.gpu_memory_utilization=0.3", "roles.rollout.enforce_eager=false"] \
            if args.device == "cuda" else ["roles.rollout.block_size=32", "roles.rollout.kv_cache_gb=0.25"]
    else:
        sets.append("roles.rollout.engine=hf_static_lengths")
    return load_run_config(None, sets + args.set)


def sample_gpu(device: str) -> subprocess.Popen | None:
    """`nvidia-smi -lms 100` writing utilization.gpu every 100 ms until stopped; None off CUDA."""
    if device != "cuda" or shutil.which("nvidia-smi") is None:
        return None
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    return subprocess.Popen(["nvidia-smi", "-i", gpu, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                             "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def gpu_idle(proc: subprocess.Popen | None) -> dict:
    util = []
    if proc is not None:
        proc.terminate()
        util = [float(v) for v in proc.communicate(timeout=10)[0].split() if v.replace(".", "").isdigit()]
    if not util:
        return {"gpu_idle_fraction": None, "gpu_zero_fraction": None, "gpu_samples": 0}
    return {"gpu_idle_fraction": round(1 - sum(util) / len(util) / 100, 3),
            "gpu_zero_fraction": round(sum(u == 0 for u in util) / len(util), 3), "gpu_samples": len(util)}


def run_setting(s: dict, args: argparse.Namespace, model: str) -> dict:
    from flowrl.runtime.trainer import train

    forced_lengths.process_draws().next = 0  # every setting samples the same lengths
    sampler, marks, begun = [], {}, time.perf_counter()

    def on_step(step: int, _logged: dict) -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()
        marks[step] = time.perf_counter()
        if step == 1:
            sampler.append(sample_gpu(args.device))

    with tempfile.TemporaryDirectory() as out:
        try:
            rows = train(run_config(s, args, model, out), progress=False, on_step=on_step,
                         task=BenchTask(args.prompt_len))
        finally:
            gpu = gpu_idle(sampler[0] if sampler else None)
    timed, window = rows[1:], marks[len(rows)] - marks[1]

    def mean(key: str) -> float | None:  # None: no timed step logs it
        values = [r[key] for r in timed if key in r]
        return round(sum(values) / len(values), 4) if values else None

    trained = [r["response_length/mean"] * (args.prompts * args.group - r.get("buffer/dropped", 0.0)) for r in timed]
    return {**s, "engine": args.engine, "steps_timed": len(timed), "steps_per_s": round(len(timed) / window, 4),
            "s_per_step": round(window / len(timed), 4), "useful_tok_per_s": round(sum(trained) / window, 1), **gpu,
            "response_length": mean("response_length/mean"), "staleness": mean("buffer/staleness/mean"),
            "dropped": mean("buffer/dropped"), "wait_s": mean("stream/wait_s"),
            "generate_s": mean("timing_s/rollout.generate"), "update_s": mean("timing_s/actor.update"),
            "first_step_s": round(rows[0]["timing_s/step"], 3), "build_s": round(marks[1] - begun, 2)}


def child(args: argparse.Namespace) -> None:
    """Runs the settings in this process, one JSON line each."""
    alias_algorithms()
    forced_lengths.register_flowrl_engine()
    if args.engine == "vllm":
        register_shared_vllm()
    try:
        for text in args.settings.split(","):
            s = parse_setting(text)
            try:
                result = run_setting(s, args, args.child)
            except Exception as err:  # this setting's error line; the others go on
                result = failed(text, args, f"{type(err).__name__}: {err}"[:500])
            print(json.dumps(result), flush=True)
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    finally:
        if _ENGINE is not None:
            _ENGINE.shutdown()


def drive(args: argparse.Namespace, model: str) -> None:
    """Child processes over the settings; a setting past its timeout kills its child and the next one goes on."""
    left, deadline = args.settings.split(","), START + args.deadline
    while left and time.monotonic() < deadline:
        cmd = [sys.executable, "-u", *sys.argv, "--settings", ",".join(left), "--child", model]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                         daemon=True).start()
        limit = args.setting_timeout + args.start_timeout  # the first setting also starts the engine
        while left:
            try:
                line = lines.get(timeout=max(0.0, min(limit, deadline - time.monotonic())))
            except queue.Empty:
                line = "timeout"
            if line is None or line == "timeout":
                proc.kill()
                proc.wait()
                why = f"process exited {proc.returncode}" if line is None else "--deadline passed" \
                    if time.monotonic() >= deadline else f"no result within {limit:g} s"
                print(json.dumps(failed(left.pop(0), args, why)), flush=True)
                break
            if line.startswith("{\"setting\": ") and line.rstrip().endswith("}"):
                print(line.rstrip(), flush=True)
                left.pop(0)
                limit = args.setting_timeout
            else:
                sys.stderr.write(line)
        proc.wait()
    for text in left:
        print(json.dumps(failed(text, args, "--deadline passed")), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=("vllm", "hf_static"), default="vllm")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="a tiny model and batch (CPU dry run): " + str(SMOKE))
    for name, value in FULL.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"default {value} ({SMOKE[name]} with --smoke)")
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of the response lengths")
    p.add_argument("--settings", default="grpo,1,0s,1s,2sp,2s,2,0", help="run in this order (see above)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a flowrl override (repeatable)")
    p.add_argument("--setting-timeout", type=float, default=150.0, help="seconds one setting may take")
    p.add_argument("--start-timeout", type=float, default=120.0, help="extra seconds for a child's first setting")
    p.add_argument("--deadline", type=float, default=440.0, help="seconds the whole run may take, from its start")
    p.add_argument("--child", help=argparse.SUPPRESS)  # the model folder: run the settings in this process
    args = p.parse_args()
    for name, value in (SMOKE if args.smoke else FULL).items():
        setattr(args, name, getattr(args, name) or value)
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.child:
        return child(args)
    [parse_setting(text) for text in args.settings.split(",")]  # a bad one fails here
    rows = args.prompts * args.group
    with tempfile.TemporaryDirectory() as tmp:
        forced_lengths.write_draws(forced_lengths.draw_lengths(8 * rows * (args.steps + 3), args.new_tokens,
                                                               args.sigma), tmp)
        if args.engine == "vllm":
            forced_lengths.install_vllm_plugin(tmp + "/plugin")
        model = qwen_model(tmp + "/model", BenchTask.chars, SMALL if args.smoke else QWEN05B,
                           args.prompt_len + args.new_tokens + 16, getattr(torch, args.dtype))
        drive(args, model)


if __name__ == "__main__":
    main()

"""A CPU preflight of verl's side of grpo_vs_verl.py: as much of verl 0.9.1's own rollout path as runs without a
GPU and without a vLLM server, over the same model copy, parquet, hydra overrides and environment that
verl_system.run_verl hands `python -m verl.trainer.main_ppo`, in under a minute instead of after verl's 5 minutes
of start-up on the GPU machine.

Two processes, as in run_verl: this one (the project's packages) makes the benchmark model (common.qwen_model:
the workload's shape with tiny hidden sizes, its vocabulary kept), verl's copy of it
(verl_system.add_chat_template), the parquet (verl_system.write_data), the variable workload's draws
(FLOWRL_BENCH_LENGTHS), the overrides and environment (verl_system.verl_args, verl_env), then runs itself with
`--check SPEC` in verl's packages (VERL_SITE first on PYTHONPATH, or --verl-python), which goes through verl's real
classes stage by stage, one line each:
  config      verl's ppo_trainer config composed by hydra with the overrides (a key verl lacks is refused here),
              main_ppo.main's auto_set_device and validate_config, the TaskRunner's resolve, and the dataclasses
              the workers build from it (rollout, model, actor, ref as engine_workers.py renames it, checkpoint
              engine)
  tokenizer   HFModelConfig (the tokenizer, processor and hf_config AgentLoopWorker takes), its custom chat
              template, and verl's continuous token builder for the config's model_type
  logprobs    the actor's and reference's forward as verl's FSDP engine patches it (use_fused_kernels and its
              backend), on the CPU over the model copy: fused log_probs against log_softmax of the logits, and
              their backward (verl_preflight_actor.py)
  dataset     create_rl_dataset (RLHFDataset with the data config; train and val) and the trainer's
              StatefulDataLoader: the first batch
  reward      RewardLoopWorker: verl's reward manager with benchmarks/verl_reward.py's compute_score
  rollout     the legacy trainer's gen batch (RayPPOTrainer.fit: DataProto, uid, _get_gen_batch, repeat n) through
              AgentLoopWorker (rollout.agent.default_agent_loop: single_turn_agent), chunked as AgentLoopManager
              does, with verl's own LLMServerClient and GlobalRequestLoadBalancer in front of a fake vLLM server
              (FakeVLLMServer: the config check, max_tokens, ignore_eos and logprobs rules of verl's vLLM server,
              random token ids and logprobs: fixed lengths run to max_tokens with eos, <|im_end|> and "\n" among
              them; variable, the n-th request ends with eos at FLOWRL_BENCH_LENGTHS's n-th draw, some with
              <|im_end|>), the continuous token builder, the padded output batch and the streamed reward (each
              call's arguments and result through cloudpickle, as Ray's handles pass them); every row's prompt,
              response, masks, logprobs and score are checked against what the fake server returned
  advantage   that batch joined as RayPPOTrainer.fit does, extract_reward and compute_advantage (GRPO)
  v1          the default trainer (trainer.use_v1, sync): a local Ray at 127.0.0.1 started with main_ppo.run_ppo's
              ray.init arguments (the overrides' runtime_env), TransferQueue (tq.init, one storage unit), the
              trainer's own prepare_step (dataloader batch as a TensorDict into TransferQueue and through
              AgentLoopWorkerTQ's agent loops), ReplayBuffer.sample and _compute_advantage
  metrics     the v1 trainer's _compute_metrics, verl's Tracking with the overrides' loggers (the file logger
              at VERL_FILE_LOGGER_PATH), and run_verl's reading of that file (verl_system.step_lines, verl_result)
              (v1 and metrics are skipped with --no-v1, or where the overrides set trainer.use_v1=False)
Not exercised: vLLM itself (its server, engine, sampler and the forced-lengths plugin), the FSDP workers and their
phases (log-probs, reference, update, weight sync: the v1 stage writes the rollout's log-probs where they go),
Ray's placement of the real actors. Exit 0 when every stage passes; else 1, `preflight FAILED at STAGE: REASON
(verl/FILE:LINE where verl refused)` the last line (a stage running past --stage-timeout counts as hung; the
launcher ended by SIGTERM, as `timeout` does, ends the check's process group first).
This file is the launcher and the stage runner; the stages are verl_preflight_setup.py (imports .. reward),
verl_preflight_actor.py (logprobs),
verl_preflight_rollout.py (rollout, advantage) and verl_preflight_v1.py (v1, metrics), the stand-ins for Ray's
handles, vLLM's server and the client in front of it verl_preflight_fakes.py (all in benchmarks/, which the check
finds first on its path: it runs as a script there, and verl_system.verl_env puts benchmarks/ on PYTHONPATH).
Usage, from the project root (on the GPU machine verl's packages are VERL_SITE, /tmp/vsite, as for run_verl):
  python benchmarks/verl_preflight.py [--lengths variable] [--verl-python /tmp/verlenv/bin/python] [--no-v1]
      [--prompts 64 --group 8 --new-tokens 256 --prompt-len 128] [--shape qwen1.5b] [--verl-set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from verl_preflight_actor import stage_logprobs
from verl_preflight_rollout import stage_advantage, stage_rollout
from verl_preflight_setup import stage_config, stage_dataset, stage_imports, stage_reward, stage_tokenizer
from verl_preflight_v1 import stage_metrics, stage_v1, stop_v1

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
T0 = time.perf_counter()


# ---- the project's side: model, copy, data, overrides --------------------------------------------------------

def prepare(args, folder: Path) -> tuple[Path, dict]:
    """The workload of grpo_vs_verl.py (its sizes and lengths), the model folder, verl's copy, the parquet and the
    overrides as run_verl makes them (written to folder/spec.json for the check), and run_verl's environment."""
    sys.path[:0] = [str(ROOT), str(HERE)]
    import torch

    import common
    import forced_lengths
    import verl_system
    from bench_workload import BenchTask, Workload

    shape = dict(common.QWEN05B)
    if args.shape == "qwen1.5b":
        import grpo_vs_verl
        shape = dict(grpo_vs_verl.QWEN15B)
    tiny = {k: common.SMALL[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "num_key_value_heads", "intermediate_size")}
    shape.update(tiny)  # the vocabulary (and so the tokenizer) of the shape, tiny weights
    wl = Workload(device="cuda", prompts=args.prompts, group=args.group, new_tokens=args.new_tokens,
                  prompt_len=args.prompt_len, micro=min(32, args.prompts * args.group), steps=args.steps,
                  warmup=args.warmup, lr=1e-7, kl_coef=0.001, lengths=args.lengths, shape=shape)
    max_positions = max(1536, wl.prompt_len + wl.new_tokens)  # as grpo_vs_trl.main
    path = common.qwen_model(str(folder / "model0"), BenchTask.chars, shape, max_positions, torch.bfloat16)
    work = folder / "verl"
    work.mkdir(parents=True, exist_ok=True)
    model, data = verl_system.add_chat_template(path, work), verl_system.write_data(wl, work)
    draws = None
    if wl.variable:  # as grpo_vs_trl.setup_lengths: the draws' file in FLOWRL_BENCH_LENGTHS, unless given there
        draws = os.environ.get(forced_lengths.LENGTHS_ENV) or forced_lengths.write_draws(wl.draws(), str(folder))
    env = verl_system.verl_env(work)  # run_verl's environment and overrides, runtime_env's variables included
    overrides = verl_system.verl_args(wl, model, data, work, args.verl_set, env)
    spec = {"model": str(model), "data": str(data), "overrides": overrides, "lengths": wl.lengths,
            "draws": draws, "prompts": wl.prompts, "group": wl.group, "new_tokens": wl.new_tokens,
            "prompt_len": wl.prompt_len, "vocab_size": shape["vocab_size"], "v1": not args.no_v1}
    out = folder / "spec.json"
    out.write_text(json.dumps(spec, indent=1))
    print(f"preflight: prepared {wl.prompts}x{wl.group} rows, {wl.prompt_len} + {wl.new_tokens} tokens, "
          f"{wl.lengths} lengths, vocabulary {shape['vocab_size']}, in {folder} ({time.perf_counter() - T0:.1f} s)",
          flush=True)
    return out, env


def launch(args) -> int:
    folder = Path(args.folder or tempfile.mkdtemp(prefix="verl-preflight-"))
    folder.mkdir(parents=True, exist_ok=True)
    spec, env = prepare(args, folder)
    env.pop("RAY_ADDRESS", None)
    env.setdefault("HF_HUB_OFFLINE", "1")  # as benchmarks/verl_chain.sh exports them
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    cmd = [args.verl_python or sys.executable, str(Path(__file__).resolve()), "--check", str(spec),
           "--stage-timeout", str(args.stage_timeout)]
    proc = subprocess.Popen(cmd, env=env, cwd=folder, start_new_session=True)
    # `timeout` (benchmarks/verl_chain.sh) sends SIGTERM: an exit through the finally below, which ends the check's
    # own session (out of `timeout`'s reach) and the Ray it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        code = proc.wait()
    finally:  # what the check left (a Ray it started and could not stop): its whole process group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if code == 0 and not args.folder:
        shutil.rmtree(folder, ignore_errors=True)
    return code


# ---- verl's side ----------------------------------------------------------------------------------------------

def verl_frame(err: BaseException) -> str:
    """The innermost frame of the exception's traceback inside verl's package: where verl refused."""
    where = ""
    for frame in traceback.extract_tb(err.__traceback__):
        marker = f"{os.sep}verl{os.sep}"
        if marker in frame.filename:
            where = f"verl/{frame.filename.rsplit(marker, 1)[1]}:{frame.lineno}"
    return where


def one_line(err: BaseException) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text[:600]


class Stages:
    """Runs one stage after another; the first failure ends the run with its one-line reason, and so does a stage
    still running after `limit` seconds (a hang: every thread's stack is printed first)."""

    def __init__(self, limit: float):
        self.start, self.limit = time.perf_counter(), limit

    def run(self, name: str, fn, *a):
        import threading

        t = time.perf_counter()
        watchdog = threading.Timer(self.limit, self.hung, args=(name,))
        watchdog.daemon = True
        watchdog.start()
        try:
            result, note = fn(*a)
        except BaseException as err:  # noqa: BLE001 (the reason is the point)
            where = verl_frame(err)
            traceback.print_exc()
            print(f"preflight FAILED at {name}: {one_line(err)}" + (f" ({where})" if where else ""), flush=True)
            raise SystemExit(1)
        finally:
            watchdog.cancel()
        print(f"preflight: {name}: ok ({time.perf_counter() - t:.1f} s) {note}", flush=True)
        return result

    def hung(self, name: str) -> None:
        import faulthandler

        faulthandler.dump_traceback(all_threads=True)
        print(f"preflight FAILED at {name}: still running after {self.limit:.0f} s (the stacks above)", flush=True)
        os._exit(1)  # the launcher ends what this process started (its process group)


def run_check(spec_path: str, limit: float) -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # before Ray is imported: the v1 stage's local cluster registers at 127.0.0.1 and listens there only
    # (flowrl/runtime/ray/loopback.py says why), and is a new one even where RAY_ADDRESS names another
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.pop("RAY_ADDRESS", None)
    spec = json.loads(Path(spec_path).read_text())
    st = Stages(limit)
    ctx: dict = {"spec": spec}
    ctx["spec_path"] = spec_path
    try:
        st.run("imports", stage_imports, ctx)
        st.run("config", stage_config, ctx)
        st.run("tokenizer", stage_tokenizer, ctx)
        st.run("logprobs", stage_logprobs, ctx)
        st.run("dataset", stage_dataset, ctx)
        st.run("reward", stage_reward, ctx)
        st.run("rollout", stage_rollout, ctx)
        st.run("advantage", stage_advantage, ctx)
        if not spec.get("v1", True) or not ctx["config"].trainer.use_v1:  # --no-v1, or the legacy trainer's run
            print(f"preflight: v1, metrics: skipped (--no-v1: {not spec.get('v1', True)}, trainer.use_v1="
                  f"{ctx['config'].trainer.use_v1})", flush=True)
        else:
            st.run("v1", stage_v1, ctx)
            st.run("metrics", stage_metrics, ctx)
    finally:
        stop_v1()
    print(f"preflight: all stages passed ({time.perf_counter() - st.start:.1f} s in verl's process)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", help="(internal) run the checks of this spec, in verl's packages")
    p.add_argument("--lengths", choices=("fixed", "variable"), default="fixed")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--shape", choices=("qwen0.5b", "qwen1.5b"), default="qwen0.5b")
    p.add_argument("--verl-set", action="append", default=[], metavar="KEY=VALUE", help="as grpo_vs_verl.py's")
    p.add_argument("--verl-python", help="the python of verl's packages (default: this one, VERL_SITE first)")
    p.add_argument("--folder", help="where the model, copy and data go (default: a new temporary folder)")
    p.add_argument("--no-v1", action="store_true", help="skip the v1 stages (Ray and TransferQueue)")
    p.add_argument("--stage-timeout", type=float, default=120, help="seconds before a stage counts as hung")
    args = p.parse_args()
    if args.check:
        run_check(args.check, args.stage_timeout)
        return
    raise SystemExit(launch(args))


if __name__ == "__main__":
    main()

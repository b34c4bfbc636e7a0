"""`grpo_vs_verl.py`'s verl runner: verl 0.9.1's own trainer entry point (`python -m verl.trainer.main_ppo`, Ray on
this host) with GRPO, FSDP and vLLM colocated (its hybrid engine), on the workload of `grpo_vs_trl.py`.

verl runs in a process of its own, with its own packages first on PYTHONPATH (`VERL_SITE`: verl, ray, hydra,
tensordict 0.10 and transformers 5.9, which verl pins; benchmarks/verl_carry.sh), over the same random-weight
model folder, the same prompts (`BenchTask`, as a parquet file in order, no shuffle) and the same reward (a hash
of the response, `verl_reward.py`). Lengths: fixed, `rollout.ignore_eos` with max_tokens = the cap; variable,
the drawn lengths of benchmarks/forced_lengths.py through the same vLLM logits-processor plugin that TRL's
colocated vLLM and flowrl's vLLM engine take them from (the vLLM engine process of verl's rollout server takes
the n-th draw for the n-th request it admits, so each step takes the step's draws, in arrival order).

What is read back: verl's own per-step metrics (its file logger, one JSON line a step: timing_s/step, gen,
old_log_prob, ref, adv, update_actor, update_weights, ..., perf/max_memory_allocated_gb, response_length/mean),
the wall-clock time each line appeared (the first step's end since this process started), and the GPU's memory
in use (nvidia-smi, every 0.5 s: verl's trainer and its vLLM server are separate processes).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import bench_workload
from bench_workload import BenchTask, Workload, mean_or_none

HERE = Path(__file__).resolve().parent
VERL_SITE = os.environ.get("VERL_SITE", "/tmp/vsite")  # verl's packages, ahead of the shared site
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"  # the prompt's 128 chars as is
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step")


def write_data(wl: Workload, folder: Path) -> Path:
    """The prompts every step takes, in order: BenchTask(seed 0) examples 0.. as verl's RLHF parquet rows."""
    import pandas as pd

    task = BenchTask(wl.prompt_len)
    rows = []
    for i in range(wl.prompts * (wl.warmup + wl.steps)):
        text, meta = task.example(0, i)
        rows.append({"data_source": "flowrl_bench", "prompt": [{"role": "user", "content": text}],
                     "ability": "bench", "reward_model": {"style": "rule", "ground_truth": meta["target"]},
                     "extra_info": {"index": i}})
    path = folder / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def add_chat_template(model_path: str, folder: Path) -> Path:
    """A copy of the model folder (links to its weights) whose tokenizer has a chat template that returns the
    user's text unchanged: verl's dataset and agent loop apply a chat template to every prompt."""
    out = folder / "model"
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(model_path).iterdir():
        if not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((Path(model_path) / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").unlink()
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    tokenizer = json.loads((Path(model_path) / "tokenizer.json").read_text())
    (out / "tokenizer.json").unlink()
    (out / "tokenizer.json").write_text(json.dumps(with_qwen_boundary(tokenizer)))
    return out


def with_qwen_boundary(tokenizer: dict) -> dict:
    """The benchmark's tokenizer (common.full_vocab_tokenizer) with its last two filler tokens renamed "<|im_end|>"
    and "\\n": verl 0.9.1's agent loop builds a Qwen token builder for any config.json of model_type qwen2
    (verl/utils/tokenizer/continuous_token.py, QwenContinuousTokenBuilder), which refuses a tokenizer where "\\n"
    is not one token or "<|im_end|>" is none (2026-12-06, H200: "Expected Qwen newline to tokenize to one token,
    got []"). The prompts are lowercase letters, so their ids are unchanged; only those two sampled ids decode
    differently. Both are added tokens as well, as in Qwen's own tokenizer.json: with config.json beside it
    (model_type qwen2), transformers 5 loads the folder as Qwen2Tokenizer, which rebuilds a byte-level BPE from
    the vocabulary, so "\n" is looked up as "Ċ", absent, and encodes to [] (the device's refusal on the H100
    and H200, 2026-12-06, reproduced on the CPU with transformers 5.9 and 5.19); an added token is matched
    before that split."""
    vocab = tokenizer["model"]["vocab"]
    last = sorted(vocab.items(), key=lambda kv: kv[1])[-2:]
    for (old, index), new in zip(last, ("<|im_end|>", "\n")):
        del vocab[old]
        vocab[new] = index
        tokenizer["added_tokens"].append({"id": index, "content": new, "single_word": False, "lstrip": False,
                                          "rstrip": False, "normalized": False, "special": new != "\n"})
    return tokenizer


def overrides(wl: Workload, model: Path, data: Path, folder: Path) -> list[str]:
    """verl's GRPO example (examples/grpo_trainer) on one GPU, set for speed as verl's performance-tuning page
    advises, with the workload's sizes, KL, optimizer and lr. No flash-attn on the device (no wheel for torch
    2.11/cu130): sdpa attention, so no remove-padding (its packed sequences need flash-attn's varlen kernel).
    verl's fused kernels (`model.use_fused_kernels`, its best-practices page; torch backend, no flash-attn): without
    them and without flash-attn, verl 0.9.1 takes each token's logprob in a Python loop over the vocabulary
    (verl/utils/torch_functional.py, logprobs_from_logits_v2 for bf16 logits, reached from
    verl/workers/engine/fsdp/transformer_impl.py with the micro-batch flattened to one row a token): 82.9 s a step
    on the H100 (2026-12-07) at 1.8% MFU, 13-15 s each logprob pass."""
    rows_tokens = wl.prompt_len + wl.new_tokens
    a = "actor_rollout_ref"
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False", "algorithm.norm_adv_by_std_in_grpo=True",
        f"data.train_files={data}", f"data.val_files={data}", f"data.train_batch_size={wl.prompts}",
        f"data.max_prompt_length={wl.prompt_len}", f"data.max_response_length={wl.new_tokens}",
        "data.shuffle=False", "data.filter_overlong_prompts=False", "data.truncation=error",
        "data.dataloader_num_workers=0",
        f"{a}.model.path={model}", f"+{a}.model.override_config.attn_implementation=sdpa",
        f"{a}.model.use_remove_padding=False", f"{a}.model.enable_gradient_checkpointing=False",
        f"{a}.model.use_fused_kernels=True", f"{a}.model.fused_kernel_options.impl_backend=torch",
        f"{a}.model.custom_chat_template={json.dumps(CHAT_TEMPLATE)}",
        f"{a}.actor.optim.lr={wl.lr}", f"{a}.actor.optim.weight_decay=0.0", f"{a}.actor.grad_clip=1.0",
        f"{a}.actor.ppo_mini_batch_size={wl.prompts}", f"{a}.actor.ppo_epochs=1",
        f"{a}.actor.use_dynamic_bsz=True", f"{a}.actor.ppo_max_token_len_per_gpu=16384",
        f"{a}.actor.use_kl_loss=True", f"{a}.actor.kl_loss_coef={wl.kl_coef}", f"{a}.actor.kl_loss_type=low_var_kl",
        f"{a}.actor.entropy_coeff=0", f"{a}.actor.loss_agg_mode=token-mean", f"{a}.actor.clip_ratio=0.2",
        f"{a}.actor.fsdp_config.param_offload=False", f"{a}.actor.fsdp_config.optimizer_offload=False",
        f"{a}.actor.fsdp_config.model_dtype=bf16", f"{a}.ref.fsdp_config.model_dtype=bf16",
        f"{a}.ref.fsdp_config.param_offload=False",
        f"{a}.rollout.log_prob_use_dynamic_bsz=True", f"{a}.ref.log_prob_use_dynamic_bsz=True",
        f"{a}.rollout.log_prob_max_token_len_per_gpu=32768", f"{a}.ref.log_prob_max_token_len_per_gpu=32768",
        f"{a}.rollout.name=vllm", f"{a}.rollout.mode=async", f"{a}.rollout.tensor_model_parallel_size=1",
        f"{a}.rollout.n={wl.group}", f"{a}.rollout.temperature=1.0", f"{a}.rollout.top_p=1.0",
        f"{a}.rollout.top_k=-1", f"{a}.rollout.gpu_memory_utilization=0.4", f"{a}.rollout.enforce_eager=False",
        f"{a}.rollout.free_cache_engine=True", f"{a}.rollout.max_num_seqs={wl.rows}",
        f"{a}.rollout.max_num_batched_tokens={max(8192, 4 * rows_tokens)}",
        f"{a}.rollout.ignore_eos={not wl.variable}", f"{a}.rollout.load_format=dummy",
        f"{a}.rollout.max_model_len={rows_tokens}",
        f"reward.custom_reward_function.path={HERE / 'verl_reward.py'}", "reward.custom_reward_function.name=compute_score",
        "trainer.critic_warmup=0", "trainer.logger=[console,file]", "trainer.project_name=flowrl_bench",
        "trainer.experiment_name=verl", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        f"trainer.total_training_steps={wl.warmup + wl.steps}", "trainer.total_epochs=1",
        f"trainer.default_local_dir={folder / 'ckpt'}", "trainer.resume_mode=disable",
    ]


def merged(defaults: list[str], extra: list[str]) -> list[str]:
    """The overrides with each of `extra`'s keys in place of the default's (hydra refuses a key given twice)."""
    key = lambda item: item.split("=", 1)[0].lstrip("+")  # noqa: E731
    given = {key(e) for e in extra}
    return [d for d in defaults if key(d) not in given] + extra


def watch_gpu_memory(stop: threading.Event, peaks: list[float]) -> None:
    """The GPU's memory in use (MiB, all processes), sampled every 0.5 s until `stop`; its max in peaks[0]."""
    while not stop.is_set():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True)
        except FileNotFoundError:  # no GPU here
            return
        if out.returncode == 0 and out.stdout.strip():
            peaks[0] = max(peaks[0], float(out.stdout.split()[0]))
        stop.wait(0.5)


def step_lines(path: Path, seen: dict[int, float]) -> list[dict]:
    """verl's file-logger lines so far; records the wall-clock time each new step's line was first seen."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]
    for line in lines:
        seen.setdefault(line["step"], time.perf_counter())
    return lines


TOKEN_CHECK = """
import sys, transformers, tokenizers
from transformers import AutoTokenizer
from verl.utils.tokenizer import hf_tokenizer
from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder
tok = hf_tokenizer(sys.argv[1])
print("verl's tokenizer check:", transformers.__version__, tokenizers.__version__, type(tok).__name__,
      repr(tok.encode("\\n", add_special_tokens=False)), tok.convert_tokens_to_ids("<|im_end|>"), flush=True)
create_continuous_token_builder(tok, hf_model_type="qwen2", chat_template_kwargs={}, mm_processor_kwargs={},
                                processor=None)
"""


def check_tokenizer(model: Path, env: dict) -> None:
    """verl's own token builder on its copy of the model, in verl's packages, before verl starts: on the device
    it refused the copy at its first rollout after 5 min of start-up (2026-12-06, H100 and H200), while the same
    check passes on the CPU with verl's pins; a refusal now stops the run in seconds and prints what it saw."""
    done = subprocess.run([sys.executable, "-c", TOKEN_CHECK, str(model)], env=env, capture_output=True, text=True,
                          timeout=300)
    print("\n".join(line for line in done.stdout.splitlines() if "tokenizer check" in line), flush=True)
    if done.returncode:
        raise RuntimeError("verl's token builder refuses the model copy: " + done.stderr.strip()[-800:])


def verl_env(work: Path) -> dict:
    """The environment of verl's process (run_verl's, and benchmarks/verl_preflight.py's check)."""
    return {**os.environ, "VERL_FILE_LOGGER_PATH": str(work / "metrics.jsonl"), "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([VERL_SITE, str(HERE), os.environ.get("PYTHONPATH", "")]),
            "RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1"}


def verl_args(wl: Workload, model: Path, data: Path, work: Path, extra: list[str], env: dict) -> list[str]:
    """main_ppo's hydra overrides as run_verl passes them: `overrides` with `extra` in place, then the
    environment variables verl's Ray workers get (its runtime_env)."""
    args = merged(overrides(wl, model, data, work), extra)
    env_vars = {k: env[k] for k in ("PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_NO_USAGE_STATS", "HF_HUB_OFFLINE",
                                     "FLOWRL_BENCH_LENGTHS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                     "NVSHMEM_DISABLE_NVLS") if k in env}
    return args + [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}='{v}'" for k, v in env_vars.items()]


def run_verl(wl: Workload, path: str, folder: str, extra: list[str], log: str, deadline_s: float) -> dict:
    """One verl run of warmup + steps steps (killed, its process group, after `deadline_s`; the steps it logged
    are still read back); its per-step metrics, phases and the times to its first step."""
    work = Path(folder) / "verl"
    work.mkdir(parents=True, exist_ok=True)
    model, data = add_chat_template(path, work), write_data(wl, work)
    env = verl_env(work)
    metrics_file = Path(env["VERL_FILE_LOGGER_PATH"])
    check_tokenizer(model, env)
    args = verl_args(wl, model, data, work, extra, env)
    print("verl command: python3 -m verl.trainer.main_ppo " + " ".join(args), flush=True)
    stop, peaks, seen = threading.Event(), [0.0], {}
    watcher = threading.Thread(target=watch_gpu_memory, args=(stop, peaks), daemon=True)
    watcher.start()
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], env=env, cwd=work,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None and time.perf_counter() - start < deadline_s:
                step_lines(metrics_file, seen)
                time.sleep(0.2)
        except SystemExit:  # grpo_vs_verl's SIGTERM (a call's timeout): the steps logged so far still come back
            print("verl: stopped by SIGTERM; reading back the steps it logged", flush=True)
        finally:  # verl's trainer, Ray and vLLM's processes: gone before the next system starts
            stop.set()
            if proc.poll() is None:
                print(f"verl: killed after {deadline_s:.0f} s", flush=True)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], env=env,
                           capture_output=True)
    lines = step_lines(metrics_file, seen)
    if not lines:
        tail = Path(log).read_text().splitlines()[-40:]
        raise RuntimeError(f"verl exited {proc.returncode} with no step logged; log tail:\n" + "\n".join(tail))
    return verl_result(wl, lines, seen, start, peaks[0], proc.returncode)


def verl_result(wl: Workload, lines: list[dict], seen: dict[int, float], start: float, peak_mib: float,
                returncode: int) -> dict:
    """s/step (verl's timing_s/step, mean over the timed steps), its phases, memory, response lengths, and the
    wall-clock times of its step lines."""
    data = {line["step"]: line["data"] for line in lines}
    steps = sorted(data)
    walls = [seen[b] - seen[a] for a, b in zip(steps, steps[1:])]
    first = seen[steps[0]]
    return {**summary(data, wl.warmup), "returncode": returncode, "wall_between_steps_s": walls,
            "first_step_s_since_start": first - bench_workload.START,
            "first_step_s_since_item": first - bench_workload.ITEM_START, "verl_start_to_first_step_s": first - start,
            "gpu_used_peak_gib": peak_mib / 1024}


def largest(data: dict[int, dict], name: str) -> float:
    """The largest value of a metric over the steps, under any prefix (verl 0.9.1's v1 trainer logs the actor's
    memory as actor/perf/..., its older trainer as perf/...)."""
    return max((v for d in data.values() for k, v in d.items() if k == name or k.endswith("/" + name)), default=0.0)


def summary(data: dict[int, dict], warmup: int) -> dict:
    """What a run's step metrics (step -> verl's metrics) say: the steps after `warmup` timed."""
    timed = [data[s] for s in sorted(data) if s > warmup]
    steps = sorted(data)
    timing = {p: mean_or_none([d[f"timing_s/{p}"] for d in timed if f"timing_s/{p}" in d]) for p in PHASES}
    return {"s_per_step": timing["step"], "steps_timed": len(timed),
            "step_s": [data[s].get("timing_s/step") for s in steps], "timing_s": timing,
            "peak_gib": largest(data, "perf/max_memory_allocated_gb"),
            "trainer_reserved_peak_gib": largest(data, "perf/max_memory_reserved_gb"),
            "mfu_actor": mean_or_none([d["perf/mfu/actor"] for d in timed if "perf/mfu/actor" in d]),
            "response_length_mean": mean_or_none([d["response_length/mean"] for d in timed
                                                  if "response_length/mean" in d]),
            "verl_throughput": mean_or_none([d["perf/throughput"] for d in timed if "perf/throughput" in d]),
            "metrics_last": {k: v for k, v in data[steps[-1]].items()
                             if k.split("/")[0] in ("timing_s", "timing_per_token_ms", "perf", "response_length",
                                                    "actor")}}


STEP_LINE = re.compile(r"step:(\d+) - (.*)$")
NUMBER = re.compile(r"^(?:np\.\w+\()?(-?[0-9.eE+-]+|nan|inf)\)?$")


def console_steps(text: str) -> dict[int, dict]:
    """verl's console step lines ("step:3 - timing_s/gen:12.1 - ... ", its console logger beside the file one)
    as step -> metrics: the record of a run whose process (and file logger's folder) did not outlive the call."""
    data: dict[int, dict] = {}
    for raw in text.splitlines():
        found = STEP_LINE.search(raw)
        if not found:
            continue
        metrics = {}
        for part in found.group(2).split(" - "):
            key, _, value = part.strip().rpartition(":")
            number = NUMBER.match(value.strip())
            if key and number:
                metrics[key] = float(number.group(1))
        data[int(found.group(1))] = metrics
    return data


if __name__ == "__main__":  # python benchmarks/verl_system.py VERL_LOG [WARMUP]: a RESULT from verl's own log
    steps = console_steps(Path(sys.argv[1]).read_text(errors="replace"))
    print("RESULT " + json.dumps({"system": "verl", "from": sys.argv[1],
                                  "result": summary(steps, int(sys.argv[2]) if len(sys.argv) > 2 else 1)}))

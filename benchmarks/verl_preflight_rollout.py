"""benchmarks/verl_preflight.py's rollout and advantage stages, in verl's packages: the legacy trainer's gen batch
through AgentLoopWorker (single_turn_agent) in front of the fake vLLM server, every row checked against what the
server returned and what compute_score gives; then that batch joined as RayPPOTrainer.fit does and GRPO's
compute_advantage."""

from __future__ import annotations

import sys
from pathlib import Path

from verl_preflight_fakes import Handle, check, fake_llm_client, run_async


def stage_rollout(ctx):
    import uuid

    import numpy as np

    from verl.experimental.agent_loop import AgentLoopManager, AgentLoopWorker
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config, tokenizer, spec = ctx["config"], ctx["tokenizer"], ctx["spec"]
    client, server = fake_llm_client(ctx)
    worker = AgentLoopWorker(config, client, None, [Handle(ctx["reward_worker"])])

    batch = DataProto.from_single_dict(dict(ctx["batch_dict"]))  # as RayPPOTrainer.fit
    batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)
    gen_batch.meta_info["global_steps"] = 1
    n = config.actor_rollout_ref.rollout.n
    gen_batch = gen_batch.repeat(repeat_times=n, interleave=True)
    if "priority" not in gen_batch.non_tensor_batch:  # AgentLoopManager.generate_sequences
        gen_batch.non_tensor_batch["priority"] = np.arange(len(gen_batch), dtype=np.int64)
    chunks = gen_batch.chunk(config.actor_rollout_ref.rollout.agent.num_workers)

    async def generate():
        return [await worker.generate_sequences(chunk) for chunk in chunks]

    outputs = run_async(generate())
    output = DataProto.concat(outputs)
    metrics = [o.meta_info.pop("metrics") for o in outputs]
    timing = AgentLoopManager._performance_metrics(None, metrics, output)
    output.meta_info = {"timing": timing, **outputs[0].meta_info}

    rows, rollout = len(gen_batch), ctx["rollout"]
    b = output.batch
    P, R = rollout.prompt_length, rollout.response_length
    check(tuple(b["prompts"].shape) == (rows, P) and tuple(b["responses"].shape) == (rows, R),
          f"prompts {tuple(b['prompts'].shape)}, responses {tuple(b['responses'].shape)}; want ({rows}, {P}/{R})")
    for key in ("input_ids", "attention_mask", "position_ids"):
        check(tuple(b[key].shape) == (rows, P + R), f"{key} {tuple(b[key].shape)}")
    check("rm_scores" in b.keys() and "rollout_log_probs" in b.keys(), f"batch keys {sorted(b.keys())}")
    sys.path.insert(0, str(Path(config.reward.custom_reward_function.path).parent))
    from verl_reward import compute_score

    used: dict[tuple, set] = {}
    lengths, eos_rows, im_end_rows = [], 0, 0
    for i in range(rows):
        mask = b["attention_mask"][i]
        prompt = b["prompts"][i][mask[:P].bool()].tolist()
        calls = server.calls.get(tuple(prompt))
        check(calls is not None, f"row {i}: its prompt ({len(prompt)} tokens) was never sent to the server")
        length = int(mask[P:].sum())
        response = b["responses"][i][:length].tolist()
        # the group's n requests share the prompt and may reach the server in any order: the row's is the unused
        # call with its tokens
        taken = used.setdefault(tuple(prompt), set())
        match = [k for k, c in enumerate(calls) if k not in taken and c["ids"][:R] == response]
        check(bool(match), f"row {i}: its response ({length} tokens) is none of the {len(calls)} the server returned "
                           f"for its prompt (lengths {[len(c['ids']) for c in calls]})")
        taken.add(match[0])
        call = calls[match[0]]
        check(b["response_mask"][i].sum().item() == length, f"row {i}: response_mask sums to "
                                                             f"{b['response_mask'][i].sum().item()}, length {length}")
        got = b["rollout_log_probs"][i][:length].tolist()
        check(np.allclose(got, call["logprobs"][:length], atol=1e-5), f"row {i}: rollout_log_probs differ")
        text = tokenizer.decode(response, skip_special_tokens=True)
        truth = gen_batch.non_tensor_batch["reward_model"][i]["ground_truth"]  # rows keep gen_batch's order
        want = compute_score("flowrl_bench", text, truth)
        score = b["rm_scores"][i]
        check(abs(score[length - 1].item() - want) < 1e-6 and abs(score.sum().item() - want) < 1e-6,
              f"row {i}: rm_scores {score[length - 1].item()} at the last token, compute_score of its text {want}")
        check(b["position_ids"][i][P - len(prompt)].item() == 0, f"row {i}: position_ids do not start at the prompt")
        lengths.append(length)
        eos_rows += call["end"] == tokenizer.eos_token_id
        im_end_rows += call["end"] == ctx["im_end"]
    if spec["lengths"] == "fixed":
        check(set(lengths) == {R}, f"fixed lengths: responses of {sorted(set(lengths))[:5]}... tokens, want {R}")
    check(sum(len(v) for v in server.calls.values()) == rows, f"{sum(map(len, server.calls.values()))} requests")
    ctx.update(batch=batch, gen_output=output)
    return None, (f"{rows} rows in {len(chunks)} chunks, response lengths {min(lengths)}..{max(lengths)} (mean "
                  f"{sum(lengths) / rows:.1f}), {eos_rows} ending in eos, {im_end_rows} in <|im_end|>, "
                  f"rm_scores = compute_score on every row; output keys {sorted(b.keys())}")


def stage_advantage(ctx):
    import torch

    from verl.trainer.ppo.ray_trainer import compute_advantage, compute_response_mask
    from verl.trainer.ppo.reward import extract_reward

    config, batch, output = ctx["config"], ctx["batch"], ctx["gen_output"]
    n = config.actor_rollout_ref.rollout.n
    batch = batch.repeat(repeat_times=n, interleave=True)
    batch = batch.union(output)
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = compute_response_mask(batch)
    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    reward_tensor, extra = extract_reward(batch)
    batch.batch["token_level_scores"] = reward_tensor
    if extra:
        import numpy as np
        batch.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch = compute_advantage(batch, adv_estimator=config.algorithm.adv_estimator, gamma=config.algorithm.gamma,
                              lam=config.algorithm.lam, num_repeat=n,
                              norm_adv_by_std_in_grpo=config.algorithm.get("norm_adv_by_std_in_grpo", True),
                              config=config.algorithm)
    adv = batch.batch["advantages"]
    mask = batch.batch["response_mask"].bool()
    check(torch.isfinite(adv).all().item(), "advantages are not finite")
    check(adv[mask].abs().sum().item() > 0, "advantages are all zero")
    return None, f"GRPO advantages {tuple(adv.shape)}, |mean| over response tokens {adv[mask].abs().mean():.3f}"

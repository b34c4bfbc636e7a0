"""verl's command lines on flowrl (`flowrl train --verl KEY=VALUE ...`): for each algorithm, the keys and values
of verl's own example script (widths made tiny, the tiny model in place of the model path, a small data set in
verl's schema in place of GSM8K), mapped, equal to the flowrl config written by hand for the same run, and run
for 2 steps. Where a script sets something flowrl cannot reproduce, the case says so and a test checks the
refusal."""

import json
import re
from pathlib import Path

import pytest

from flowrl import cli
from flowrl.config import load_run_config
from flowrl.config.verl_args import from_verl, parse_value
from flowrl.config.verl_keys import TABLE, table_markdown
from flowrl.graph.algorithm import ALGORITHMS

AR = "actor_rollout_ref"
SCORE = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
        "    return float(len(set(solution_str)) % 2)\n"


@pytest.fixture
def data(tmp_path, tiny_model_path):
    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"{i}+{j}="}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i + j)}, "extra_info": {"index": i}}
            for i in range(4) for j in range(2)]
    for name, part in (("train", rows), ("test", rows[:2])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (tmp_path / "score.py").write_text(SCORE)
    return {"TRAIN": tmp_path / "train.jsonl", "TEST": tmp_path / "test.jsonl", "MODEL": tiny_model_path,
            "OUT": tmp_path / "out", "SCORE": tmp_path / "score.py"}


COMMON = """data.train_files=TRAIN data.val_files=TEST data.max_prompt_length=16 data.filter_overlong_prompts=True
data.truncation='error' actor_rollout_ref.model.path=MODEL actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True custom_reward_function.path=SCORE trainer.logger=console
trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.total_training_steps=2 trainer.default_local_dir=OUT"""
# every case: rollout.name=hf where verl's scripts say vllm (vLLM's start costs CI a minute a case)
CASES = {
    # examples/grpo_trainer/run_qwen2-7b.sh
    "grpo": ("""algorithm.adv_estimator=grpo data.train_batch_size=4 data.max_response_length=4
actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=hf
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.project_name='verl_grpo_example_gsm8k'
trainer.experiment_name='qwen2_7b_function_rm' trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15""",
             """algorithm=grpo train.batch_size=4 roles.rollout.max_new_tokens=4 roles.actor.mini_batch_size=10
roles.actor.micro_batch_size=4 algo.kl_coef=0.001 model.gradient_checkpointing=true roles.actor.offload_params=false
roles.actor.offload_optimizer=false roles.actor.forward_micro_batch_size=8 algo.group_size=5
roles.ref.offload_params=true roles.ref.forward_micro_batch_size=8 checkpoint.every=20 eval.every=5"""),
    # examples/ppo_trainer/run_deepseek7b_llm.sh
    "ppo": ("""algorithm.adv_estimator=gae data.train_batch_size=4 data.max_response_length=4
actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 actor_rollout_ref.rollout.tensor_model_parallel_size=4
actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.gpu_memory_utilization=0.4 critic.optim.lr=1e-5
critic.model.use_remove_padding=True critic.model.path=MODEL critic.model.enable_gradient_checkpointing=True
critic.ppo_micro_batch_size_per_gpu=2 critic.model.fsdp_config.param_offload=False
critic.model.fsdp_config.optimizer_offload=False algorithm.use_kl_in_reward=False trainer.critic_warmup=0
trainer.save_freq=20 trainer.test_freq=1 trainer.use_legacy_worker_impl=auto trainer.total_epochs=15""",
            """algorithm=ppo train.batch_size=4 roles.rollout.max_new_tokens=4 roles.actor.mini_batch_size=2
roles.actor.micro_batch_size=2 roles.actor.offload_params=false roles.actor.offload_optimizer=false algo.kl_coef=0
model.gradient_checkpointing=true roles.actor.forward_micro_batch_size=4 roles.critic.lr=1e-5
roles.critic.weight_decay=0.01 roles.critic.offload_params=false roles.critic.offload_optimizer=false
roles.critic.mini_batch_size=2 roles.critic.micro_batch_size=4
algo.lam=1.0 checkpoint.every=20 eval.every=1"""),
    # tests/special_e2e/run_dapo.sh (recipe.dapo.main_dapo)
    "dapo": ("""algorithm.adv_estimator=grpo reward_model.reward_manager=dapo algorithm.use_kl_in_reward=False
algorithm.kl_ctrl.kl_coef=0.0 actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=0.0
actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28 data.max_response_length=4
reward_model.overlong_buffer.enable=True reward_model.overlong_buffer.len=2
reward_model.overlong_buffer.penalty_factor=1.0 actor_rollout_ref.actor.loss_agg_mode=token-mean
data.train_batch_size=4 data.gen_batch_size=16 algorithm.filter_groups.enable=True
algorithm.filter_groups.metric=seq_reward algorithm.filter_groups.max_num_gen_batches=10
actor_rollout_ref.model.use_fused_kernels=True actor_rollout_ref.rollout.n=4
actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 actor_rollout_ref.rollout.name=hf
actor_rollout_ref.ref.fsdp_config.param_offload=True trainer.save_freq=-1 trainer.total_epochs=2
trainer.resume_mode=disable trainer.val_before_train=False""",
             """algorithm=dapo train.batch_size=4 roles.rollout.max_new_tokens=4 algo.group_size=4
algo.max_sampling_rounds=10 algo.overlong_buffer_len=2 roles.actor.mini_batch_size=8 roles.actor.micro_batch_size=4
roles.actor.forward_micro_batch_size=4 roles.ref.offload_params=true checkpoint.every=0 eval.every=0
checkpoint.resume=false"""),
    # examples/rloo_trainer/run_qwen2-7b.sh, but algorithm.use_kl_in_reward=False: flowrl's RLOO has KL as a loss
    # only (test_a_kl_flowrl_places_elsewhere_is_refused)
    "rloo": ("""algorithm.adv_estimator=rloo data.train_batch_size=4 data.max_response_length=4
actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.name=hf
actor_rollout_ref.rollout.n=5 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
algorithm.use_kl_in_reward=False algorithm.kl_penalty=kl algorithm.kl_ctrl.kl_coef=0.001 trainer.critic_warmup=0
trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=15""",
             """algorithm=rloo train.batch_size=4 roles.rollout.max_new_tokens=4 roles.actor.mini_batch_size=10
roles.actor.micro_batch_size=8 algo.kl_coef=0 model.gradient_checkpointing=true roles.actor.forward_micro_batch_size=16
roles.ref.forward_micro_batch_size=16
algo.group_size=5 algo.loss_agg_mode=token-mean algo.dual_clip=3.0 checkpoint.every=0 eval.every=5"""),
    # examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh
    "reinforce_pp": ("""algorithm.adv_estimator=reinforce_plus_plus data.train_batch_size=4
data.max_response_length=4 actor_rollout_ref.actor.optim.lr=3e-6 actor_rollout_ref.actor.ppo_mini_batch_size=4
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=mse
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.n=4
algorithm.use_kl_in_reward=True trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=15""",
                     """algorithm=reinforce_pp train.batch_size=4 roles.rollout.max_new_tokens=4
roles.actor.lr=3e-6 roles.actor.mini_batch_size=16 roles.actor.micro_batch_size=4 algo.group_size=4 algo.kl_coef=0.001
checkpoint.every=0 eval.every=5"""),
    # examples/gspo_trainer/test_gspo_3b_math.sh
    "gspo": ("""algorithm.adv_estimator=grpo actor_rollout_ref.actor.policy_loss.loss_mode=gspo data.shuffle=true
data.prompt_key=prompt data.return_raw_chat=True data.train_batch_size=4 data.max_response_length=4
actor_rollout_ref.rollout.n=4 algorithm.use_kl_in_reward=false algorithm.kl_ctrl.kl_coef=0.0
actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.actor.kl_loss_coef=0.0
actor_rollout_ref.actor.clip_ratio_low=0.0003 actor_rollout_ref.actor.clip_ratio_high=0.0004
actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40
actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=60 actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=60
actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.mode=async actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.05
actor_rollout_ref.actor.optim.weight_decay=0.1 actor_rollout_ref.actor.ppo_mini_batch_size=2
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.actor.grad_clip=1.0 actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 actor_rollout_ref.rollout.enable_chunked_prefill=true
actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1
actor_rollout_ref.rollout.val_kwargs.top_p=0.7 reward_model.reward_manager=dapo
+reward_model.reward_kwargs.overlong_buffer_cfg.enable=false +reward_model.reward_kwargs.overlong_buffer_cfg.len=2
+reward_model.reward_kwargs.max_resp_len=4 trainer.val_before_train=false trainer.test_freq=10 trainer.save_freq=10
trainer.total_epochs=10 trainer.resume_mode=auto trainer.log_val_generations=2""",
             """algorithm=gspo train.batch_size=4 roles.rollout.max_new_tokens=4 algo.group_size=4
roles.actor.max_tokens_per_micro_batch=40 roles.actor.forward_max_tokens_per_micro_batch=60
roles.ref.forward_max_tokens_per_micro_batch=60 roles.actor.weight_decay=0.1 roles.actor.mini_batch_size=8
checkpoint.every=10 eval.every=10 checkpoint.resume=true"""),
    # examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh, but algorithm.use_kl_in_reward=False: flowrl's ReMax has
    # no KL term (test_a_kl_flowrl_places_elsewhere_is_refused)
    "remax": ("""algorithm.adv_estimator=remax data.train_batch_size=4 data.max_response_length=4
actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.use_dynamic_bsz=True
actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64 actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.rollout.name=hf
actor_rollout_ref.rollout.n=4 actor_rollout_ref.ref.fsdp_config.param_offload=True algorithm.use_kl_in_reward=False
algorithm.kl_penalty=kl algorithm.kl_ctrl.kl_coef=0.001 trainer.val_before_train=False trainer.save_freq=-1
trainer.test_freq=5 trainer.total_epochs=5""",
              """algorithm=remax train.batch_size=4 roles.rollout.max_new_tokens=4 roles.actor.mini_batch_size=8
roles.actor.max_tokens_per_micro_batch=64 model.gradient_checkpointing=true algo.group_size=4
roles.ref.offload_params=true checkpoint.every=0 eval.every=5"""),
}
HAND_COMMON = """data.train_files=TRAIN data.val_files=TEST data.max_prompt_length=16 data.truncation=drop
model.path=MODEL roles.actor.lr=1e-6 roles.actor.weight_decay=0.01 roles.actor.packing=true data.reward=SCORE:compute_score
train.loggers=["console","jsonl"] train.steps=2 train.output_dir=OUT"""


def values(cfg):
    """The run config's values, the algorithm's options with their defaults (an option set to its default is the
    same run as one left unset)."""
    return {**cfg.model_dump(), "algo": ALGORITHMS.get(cfg.algorithm).config_cls.model_validate(cfg.algo).model_dump()}


def words(text, paths):
    for name, path in paths.items():
        text = re.sub(rf"\b{name}\b", str(path), text)
    return text.split()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_verl_example_maps_onto_the_hand_written_flowrl_config_and_runs(case, data, capsys):
    verl, hand = CASES[case]
    verl_words = words(f"{COMMON} {verl}", data)
    hand_words = words(f"{HAND_COMMON} {hand}", data)
    mapped = load_run_config(None, [f"algorithm={from_verl(verl_words).algorithm}", *from_verl(verl_words).words()])
    assert values(mapped) == values(load_run_config(None, hand_words))
    assert cli.main(["train", "--no-progress", "--verl", *verl_words, "--set", "data.reward_workers=0"]) == 0
    out = capsys.readouterr()
    assert f"flowrl: running as: flowrl train {case} " in out.out
    assert "done: 2 steps" in out.out
    rows = [json.loads(line) for line in (data["OUT"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]


def test_each_key_flowrl_cannot_honour_is_named_once_on_its_own_line(data, capsys):
    verl_words = words(f"{COMMON} {CASES['grpo'][0]}", data)
    notes = from_verl(verl_words).notes
    named = [note.split("=")[0] for note in notes]
    assert sorted(named) == sorted([f"{AR}.rollout.tensor_model_parallel_size", f"{AR}.rollout.gpu_memory_utilization",
                                    "trainer.n_gpus_per_node", "trainer.total_epochs", "trainer.project_name",
                                    "trainer.experiment_name"])
    assert all("not honoured" in note for note in notes)


@pytest.mark.parametrize("word, message", [
    ("algorithm.use_kl_in_reward=True", "algorithm.use_kl_in_reward=true: this algorithm has only as a loss"),
    ("actor_rollout_ref.actor.kl_loss_type=mse", "kl_loss_type=mse: flowrl's KL loss is low_var_kl"),
    ("algorithm.adv_estimator=grpo_vectorized", "algorithm.adv_estimator=grpo_vectorized: --verl maps gae"),
    ("trainer.critic_warmup=2", "trainer.critic_warmup=2: flowrl updates the actor from the first step"),
])
def test_a_key_that_changes_the_math_is_refused_in_one_line(word, message, data, capsys):
    base = words(f"{COMMON} {CASES['grpo'][0]}", data)
    assert cli.main(["train", "--verl", *base, word]) == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("flowrl: error: ")


@pytest.mark.parametrize("case, message", [("rloo", "this algorithm has only as a loss in flowrl"),
                                           ("remax", "this algorithm has no KL term in flowrl")])
def test_a_kl_flowrl_places_elsewhere_is_refused(case, message, data):
    """verl's RLOO and ReMax scripts put the KL in the reward; flowrl's RLOO has it as a loss, its ReMax none."""
    verl_words = words(f"{COMMON} {CASES[case][0]}", data) + ["algorithm.use_kl_in_reward=True"]
    with pytest.raises(ValueError, match=message):
        from_verl(verl_words)


def test_plain_flowrl_train_names_a_verl_key_and_what_it_means_under_verl(capsys):
    assert cli.main(["train", f"{AR}.actor.ppo_mini_batch_size=256"]) == cli.EXIT_USER_ERROR
    assert capsys.readouterr().err.strip() == (
        f"flowrl: error: {AR}.actor.ppo_mini_batch_size: a verl key; with --verl it means "
        f"roles.actor.mini_batch_size "
        f"(prompts, x rollout.n (responses))")


def test_a_verl_config_file_is_the_same_as_its_keys(tmp_path, data):
    verl_words = words(f"{COMMON} {CASES['ppo'][0]}", data)
    tree: dict = {}
    for word in verl_words:
        key, _, raw = word.partition("=")
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = parse_value(raw)
    (tmp_path / "verl.yaml").write_text(json.dumps(tree))  # JSON is YAML
    assert from_verl([], str(tmp_path / "verl.yaml")) == from_verl(verl_words)


@pytest.mark.parametrize("raw, value", [("True", True), ("'error'", "error"), ("1e-6", 1e-6), ("-1", -1),
                                        ('["console","wandb"]', ["console", "wandb"]),
                                        ("['a.parquet', 'b.parquet']", ["a.parquet", "b.parquet"]), ("null", None)])
def test_hydra_values_parse_as_verl_reads_them(raw, value):
    assert parse_value(raw) == value


def test_the_docs_table_is_the_mapping():
    """docs/verl.md's table is flowrl.config.verl_keys.TABLE as table_markdown() writes it: regenerate the page's
    table from it when a key changes."""
    page = (Path(__file__).parent.parent / "docs" / "verl.md").read_text()
    assert page.endswith(table_markdown()), "docs/verl.md: its table is not verl_keys.table_markdown()'s"
    assert all(f"| `{entry.key}` |" in page for entry in TABLE)


def test_the_critic_and_the_reference_sizes_map_onto_their_own_roles(data):
    """verl sizes the critic (critic.ppo_*) and the reference (ref.log_prob_micro_batch_size_per_gpu) apart from
    the actor: each becomes its role's own key, counted over all ranks (2 GPUs here)."""
    verl_words = words(f"{COMMON} {CASES['ppo'][0]}", data) + [
        "critic.ppo_mini_batch_size=1", "critic.ppo_epochs=2", "critic.forward_micro_batch_size_per_gpu=3",
        f"{AR}.ref.log_prob_micro_batch_size_per_gpu=5"]
    mapped = from_verl(verl_words)
    o = mapped.overrides
    assert (o["roles.actor.mini_batch_size"], o["roles.actor.micro_batch_size"], o["roles.actor.epochs"],
            o["roles.actor.forward_micro_batch_size"]) == (2, 2, 1, 4)
    assert (o["roles.critic.mini_batch_size"], o["roles.critic.micro_batch_size"], o["roles.critic.epochs"],
            o["roles.critic.forward_micro_batch_size"]) == (1, 4, 2, 6)
    assert o["roles.ref.forward_micro_batch_size"] == 10
    assert not [note for note in mapped.notes if "_batch_size" in note.split("=")[0] or "ppo_epochs" in note], \
        mapped.notes
    cfg = load_run_config(None, [f"algorithm={mapped.algorithm}", *mapped.words()])
    assert (cfg.section("critic").micro_batch_size, cfg.section("ref").forward_micro_batch_size) == (4, 10)
    unset = from_verl(words(f"{COMMON} {CASES['ppo'][0]}", data)).overrides  # the critic's unset: the actor's
    assert (unset["roles.critic.mini_batch_size"], unset["roles.critic.epochs"]) == (2, 1)

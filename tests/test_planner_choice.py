"""The planner chooses: model shapes counted right (MoE too), cluster specs, the memory of TP x DP and vLLM's
pre-allocation, refusals the engines would raise, the simulated step and the choice on one and many GPUs."""

import pytest
import torch
import transformers

import flowrl as fl
from flowrl.algorithms import grpo, grpo_async
from flowrl.engines.memory import GIB, ModelShape
from flowrl.plan.candidates import Candidate, Space, Work
from flowrl.plan.choose import PlannerConfig
from flowrl.plan.cluster import ClusterConfig
from flowrl.plan.costs import DEVICES, CostModel
from flowrl.plan.memory import Roles, fit
from flowrl.plan.simulate import GraphNode, graph_nodes, step_seconds
from fakes import ROLE_CLASSES

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
SMALL_VOCAB, BIG_VOCAB = 151936, 152064
QWEN25 = {  # Qwen2.5 config.json shapes -> the parameter counts their model cards publish
    "0.5B": (dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=SMALL_VOCAB, tie_word_embeddings=True), 494_032_768),
    "1.5B": (dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  intermediate_size=8960, vocab_size=SMALL_VOCAB, tie_word_embeddings=True), 1_543_714_304),
    "3B": (dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                intermediate_size=11008, vocab_size=SMALL_VOCAB, tie_word_embeddings=True), 3_085_938_688),
    "7B": (dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                intermediate_size=18944, vocab_size=BIG_VOCAB, tie_word_embeddings=False), 7_615_616_512),
    "32B": (dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                 intermediate_size=27648, vocab_size=BIG_VOCAB, tie_word_embeddings=False), 32_763_876_352),
}
QWEN3_30B_A3B = dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                     intermediate_size=6144, vocab_size=SMALL_VOCAB, tie_word_embeddings=False)
WORK = Work(rows=128, prompt_len=256, response_len=1024, mean_response_len=512, mini_batch_size=128)
BATCH = {"mini_batch_size": 128, "forward_micro_batch_size": 128}
GRPO_ROLES = Roles(trained=1, frozen=1, rollout=True, compile=True)


def shape(name: str, dtype_bytes: int = 2) -> ModelShape:
    values = QWEN25[name][0]
    return ModelShape.from_config(transformers.AutoConfig.for_model("qwen2", **values).to_dict(), dtype_bytes)


def moe() -> ModelShape:
    return ModelShape.from_config(transformers.AutoConfig.for_model("qwen3_moe", **QWEN3_30B_A3B).to_dict(), 2)


@pytest.mark.parametrize("name", list(QWEN25))
def test_qwen2_5_parameter_counts_are_the_published_ones(name):
    assert shape(name).num_params == QWEN25[name][1]


def test_qwen3_30b_a3b_counts_its_experts():
    s = moe()
    assert s.num_params == 30_532_122_624 and s.num_experts == 128  # "30.5B total"
    assert s.active_params == 3_353_032_704  # "3.3B activated": 8 of 128 experts a token


@pytest.mark.parametrize("model_type,extra", [
    ("qwen2", {}), ("qwen3", {}),
    ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, decoder_sparse_step=2,
                       mlp_only_layers=[2])),
    ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                       shared_expert_intermediate_size=40)),
    ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2))])
def test_the_count_equals_a_built_models_parameters(model_type, extra):
    config = transformers.AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=48, vocab_size=100,
                                               tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    built = transformers.AutoModelForCausalLM.from_config(config)
    assert ModelShape.from_config(config.to_dict(), 2).num_params == sum(p.numel() for p in built.parameters())


def test_cluster_specs_and_nodes():
    c = ClusterConfig.parse("2x8xH100-80G")
    assert (c.nodes, c.gpus_per_node, c.gpus) == (2, 8, 16)
    assert ClusterConfig.parse("1xH200-141G").gpus == 1 and ClusterConfig.parse("H100-80G").gpus == 1
    assert 12 not in c.pool_sizes() and {1, 7, 8, 16} <= set(c.pool_sizes())  # within a node, or whole nodes
    with pytest.raises(fl.PlanError, match="unknown device 'X1'"):
        ClusterConfig.parse("8xX1")
    with pytest.raises(fl.PlanError, match="16 GPUs a node, but a node of H100-80G has 8; use --nodes 2"):
        ClusterConfig.from_counts(16, 1, "H100-80G", gpus_per_node=8)


def test_rollout_tensor_parallel_divides_memory_and_refuses_non_dividing_layouts():
    s, cluster = shape("7B"), ClusterConfig.parse("8xH100-80G")
    tp4 = Candidate(8, 0, "vllm", 4, 0.9, 0, micro_batch_size=64)
    # vLLM pre-allocates 0.9 of the card and holds it at sleep level 0 beside the train engines: never fits
    got = fit(tp4, s, WORK, GRPO_ROLES, cluster, BATCH)
    assert got.refused.startswith("vLLM would not start: gpu_memory_utilization=0.9")
    asleep = fit(Candidate(8, 0, "vllm", 4, 0.5, 1, micro_batch_size=64), s, WORK, GRPO_ROLES, cluster, BATCH)
    assert asleep.refused is None and asleep.peak["global"] >= 0.5 * cluster.gpu_bytes  # the share while awake
    split = fit(Candidate(4, 3, "vllm", 2, 0.5, micro_batch_size=64), s, WORK, GRPO_ROLES, cluster, BATCH)
    assert split.refused == "roles.rollout.tensor_parallel_size=2 does not divide the rollout pool's 3 GPUs"
    # TP 4 on a pool of 8: 2 replicas, each GPU a quarter of the weights: more KV than TP 2 at the same share
    kv4 = fit(Candidate(4, 4, "vllm", 4, 0.5, micro_batch_size=64), s, WORK, GRPO_ROLES, cluster, BATCH).kv_tokens
    kv2 = fit(Candidate(4, 4, "vllm", 2, 0.5, micro_batch_size=64), s, WORK, GRPO_ROLES, cluster, BATCH).kv_tokens
    assert kv4 > 2 * kv2 > 0
    heads = fit(Candidate(8, 0, "vllm", 8, 0.5, 1, micro_batch_size=64), shape("1.5B"), WORK, GRPO_ROLES, cluster,
                BATCH)
    assert "does not divide the model's 12 attention heads" in heads.refused


def test_32b_and_moe_on_64_gpus_choose_layouts_the_engines_accept():
    cluster = ClusterConfig.parse("8x8xH100-80G")
    nodes, depth = _nodes(grpo)
    for s in (shape("32B"), moe()):
        choice = PlannerConfig().build().choose(nodes, depth, s, WORK, GRPO_ROLES, cluster, Space(), BATCH,
                                                CostModel(DEVICES["H100-80G"]))
        best = choice.best
        assert best.fit.refused is None and max(best.fit.peak.values()) <= 0.95 * cluster.gpu_bytes
        assert best.cand.rollout_pool % best.cand.tensor_parallel == 0
        assert best.cand.tensor_parallel <= 8


def test_7b_on_one_h100_is_planned_with_checkpointing_and_offload_and_fp32_is_refused_naming_options():
    nodes, depth = _nodes(grpo)
    one = ClusterConfig.parse("1xH100-80G")
    planner, costs = PlannerConfig().build(), CostModel(DEVICES["H100-80G"])
    best = planner.choose(nodes, depth, shape("7B"), WORK, GRPO_ROLES, one, Space(), BATCH, costs).best.cand
    assert best.gradient_checkpointing and best.offload_optimizer and best.lora_rank == 0  # full parameters
    with pytest.raises(fl.PlanError, match=r"no layout of 7.62B parameters fits .* it would fit with "
                                           r".*roles.actor.lora_rank=64; or model.dtype=bfloat16 \+ "
                                           r"model.gradient_checkpointing=true \+ roles.actor.offload_optimizer=true; "
                                           r"or 2 GPUs"):
        planner.choose(nodes, depth, shape("7B", 4), WORK, GRPO_ROLES, one, Space(), BATCH, costs)


def test_the_simulated_step_by_hand():
    gen = GraphNode("g", "generate", "gen", ())
    upd = GraphNode("u", "update", "train", ("g",), before_buffer=False)
    ref = GraphNode("r", "forward", "train", ("g",), before_buffer=False)
    seconds = {"g": 3.0, "u": 2.0, "r": 0.5}
    split = Candidate(4, 4)
    assert step_seconds([gen, ref, upd], seconds, split, 0, 0.0) == 5.5  # 3 then 0.5 + 2 on the train pool
    assert step_seconds([gen, ref, upd], seconds, split, 1, 0.0) == 3.0  # the buffer overlaps: max(3, 2.5)
    assert step_seconds([gen, ref, upd], seconds, Candidate(8, 0), 1, 0.1) == 5.6  # one pool: one at a time


def test_graph_nodes_read_the_roles_and_the_buffer():
    nodes, depth = _nodes(grpo_async, {"max_staleness": 1})
    kinds = {n.name: (n.category, n.side, n.before_buffer) for n in nodes}
    assert depth == 1
    assert kinds["rollout.generate"] == ("generate", "gen", True)
    assert kinds["actor.update"] == ("update", "train", False) and kinds["ref.logprobs"][0] == "forward"


def test_refine_scales_each_category_by_measured_over_predicted():
    model = CostModel(DEVICES["H100-80G"])
    steps = [{"timing_s/g": 9.0}, {"timing_s/g": 4.0}, {"timing_s/g": 6.0}]  # the first (compiling) left out
    refined = model.refine({"g": 2.0}, steps, {"g": "generate"})
    assert refined.scaled("generate", 1.0) == 2.5  # median(4, 6) / 2
    assert refined.scaled("update", 1.0) == 1.0


def test_flowrl_plan_cluster_writes_a_config_train_takes(tmp_path):
    import cli_process
    from flowrl.config import load_run_config

    done = cli_process.run("plan", "grpo", "--cluster", "2x4xH100-80G", "--explain", "--write",
                           str(tmp_path / "chosen.json"), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "candidates on 2 node(s) x 4 H100-80G" in done.stdout and "chosen:" in done.stdout
    cfg = load_run_config(str(tmp_path / "chosen.json"), [])
    assert sum(p.world_size for p in cfg.placement.pools) == 8 and cfg.train.device == "cuda"
    bad = cli_process.run("plan", "grpo", "--gpus", "16", "--nodes", "1", cwd=tmp_path, timeout=300)
    assert bad.returncode == 2 and "use --nodes 2" in bad.stderr


def _nodes(algo, cfg=None):
    placement = fl.Placement(pools=[fl.Pool(name="t", roles=["actor", "ref"]), fl.Pool(name="g", roles=["rollout"])])
    return graph_nodes(fl.compile_plan(algo, placement, INPUTS, ROLE_CLASSES, cfg))


CASES = [(algo, name, spec) for algo in ("grpo", "ppo", "grpo_async") for name in ("0.5B", "7B", "32B")
         for spec in ("1xH100-80G", "8xH100-80G", "2x8xH200-141G")] + \
        [("grpo", "moe", spec) for spec in ("8xH100-80G", "8x8xH100-80G")]


@pytest.mark.parametrize("algo,name,spec", CASES)
def test_every_chosen_layout_builds_and_fits(algo, name, spec):
    """29 graph x model x cluster cases: the choice fits the card or is refused naming options, and its pools
    pass the per-rank batch split every pool's ranks build with (Pool.share, the factory's build-time check)."""
    from flowrl.algorithms import ppo

    graphs = {"grpo": (grpo, None), "ppo": (ppo, None), "grpo_async": (grpo_async, {"max_staleness": 1})}
    algorithm, cfg = graphs[algo]
    trained = ["actor", "critic"] if algorithm is ppo else ["actor"]
    placement = fl.Placement(pools=[fl.Pool(name="t", roles=[*trained, "ref"]), fl.Pool(name="g", roles=["rollout"])])
    nodes, depth = graph_nodes(fl.compile_plan(algorithm, placement, INPUTS, ROLE_CLASSES, cfg))
    roles = Roles(trained=len(trained), frozen=1, rollout=True, compile=True)
    cluster, s = ClusterConfig.parse(spec), moe() if name == "moe" else shape(name)
    try:
        best = PlannerConfig().build().choose(nodes, depth, s, WORK, roles, cluster, Space(), BATCH,
                                              CostModel(cluster.kind)).best
    except fl.PlanError as err:
        assert "it would fit with" in str(err) and name != "0.5B"
        return
    assert best.fit.refused is None and max(best.fit.peak.values()) <= 0.95 * cluster.gpu_bytes
    assert best.seconds > 0 and best.cand.train_gpus + best.cand.rollout_gpus == cluster.gpus
    for world in {best.cand.train_gpus, best.cand.rollout_pool}:
        pool = fl.Pool(name="p", roles=["actor"], world_size=world)
        for field, total in {**BATCH, "micro_batch_size": best.cand.micro_batch_size}.items():
            pool.share(total, f"train.{field}")  # raises where a rank's share is not whole

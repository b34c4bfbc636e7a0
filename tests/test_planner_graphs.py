"""vLLM's CUDA graphs as a planner choice (their pool's memory, their faster decode step; never on the CPU), and
rollout tensor-parallel groups that would span two nodes refused at plan time, on several clusters."""

from dataclasses import replace

import pytest

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.config import load_run_config
from flowrl.plan.candidates import Candidate, Space, enumerate_candidates
from flowrl.plan.choose import PlannerConfig
from flowrl.plan.cluster import ClusterConfig
from flowrl.plan.costs import CostModel
from flowrl.plan.memory import capture_sizes, cuda_graphs, fit, pool_phases
from flowrl.runtime.layout import auto_plan
from flowrl.runtime.data_tasks import run_task
from flowrl.runtime.trainer import resolve_algorithm
from test_planner_choice import BATCH, GRPO_ROLES, WORK, _nodes, shape

ONE = ClusterConfig.parse("1xH100-80G")
VLLM = Space(engines=("vllm",))


def choose(name, cluster=ONE, space=VLLM, planner=None):
    nodes, depth = _nodes(grpo)
    return (planner or PlannerConfig()).build().choose(nodes, depth, shape(name), WORK, GRPO_ROLES, cluster, space,
                                                       BATCH, CostModel(cluster.kind))


def test_the_graph_pool_is_vllms_capture_sizes_times_the_measured_cost():
    # vLLM's default at max_num_seqs 256: 1, 2, 4, 8..248 by 8 (31), 256..512 by 16 (17): 51, as its log lists them
    assert len(capture_sizes(256)) == 51 and capture_sizes(64) == [1, 2, 4, *range(8, 129, 8)]
    graphs = Candidate(1, 0, "vllm", 1, 0.5, enforce_eager=False)
    # 0.5B's 24 layers: 51 x 24 x 0.33 MiB = 403.9 MiB, the 0.39 GiB vLLM 0.26 logged on the H200
    assert cuda_graphs(graphs, shape("0.5B"), ONE.kind) == int(51 * 24 * 0.33 * 2**20)
    assert cuda_graphs(Candidate(1, 0, "vllm", 1, 0.5), shape("0.5B"), ONE.kind) == 0  # eager: none
    cand, s = Candidate(1, 0, "vllm", 1, 0.5, 1), shape("1.5B")
    eager, graph = (fit(c, s, WORK, GRPO_ROLES, ONE, BATCH) for c in (cand, replace(cand, enforce_eager=False)))
    pool = cuda_graphs(graphs, s, ONE.kind)  # 51 x 28 x 0.33 MiB
    kv_token = 2 * 28 * 2 * 128 * 2  # K and V, 28 layers, 2 KV heads of 128, bf16: 28 KiB a token
    assert eager.kv_tokens - graph.kv_tokens == pytest.approx(pool / kv_token, abs=1)  # graphs take KV cache
    update = [pool_phases(c, s, WORK, GRPO_ROLES, ONE.gpu_bytes, ONE.kind)[0]["global"]["update"]
              for c in (cand, replace(cand, enforce_eager=False))]
    assert update[1] - update[0] == pool  # and stay on the GPU asleep, beside the update


def test_the_1_5b_shape_on_one_h100_picks_cuda_graphs_and_the_plan_writes_them(tmp_path):
    best = choose("1.5B").best
    assert best.cand.engine == "vllm" and not best.cand.enforce_eager
    # the same layout eager: slower by 14 ms a decode step (the audit's 24.9 s against 10.6 s a step)
    eager = PlannerConfig().build().score(replace(best.cand, enforce_eager=True),
                                          *_nodes(grpo), shape("1.5B"), WORK, GRPO_ROLES, ONE, BATCH,
                                          CostModel(ONE.kind))
    assert eager.seconds > best.seconds + 1000 * 0.014 * 0.9
    assert "    vllm  layout" in choose("1.5B").explain() and "  graphs  colocated 1; vllm graphs" in \
        choose("1.5B").explain()
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "model.dtype=bfloat16", "roles.rollout.engine=vllm"])
    algo, task = resolve_algorithm(cfg.algorithm), run_task(cfg)
    choice, values = auto_plan.choose(cfg, algo, task, ONE)
    assert choice.best.cand.engine == "vllm" and values["roles.rollout.enforce_eager"] is False
    assert "vllm graphs" in values["plan.predicted"]["layout"]


def test_a_memory_tight_layout_falls_back_to_eager():
    """7B on one H100 (checkpointing, the optimizer offloaded, vLLM asleep): the graph pool a sleeping vLLM keeps
    is what does not fit under a tighter headroom, and the planner runs vLLM eager instead of giving up."""
    roomy = choose("7B").best
    assert roomy.cand.engine == "vllm" and not roomy.cand.enforce_eager
    eager = fit(replace(roomy.cand, enforce_eager=True), shape("7B"), WORK, GRPO_ROLES, ONE, BATCH)
    between = (max(roomy.fit.peak.values()) + max(eager.peak.values())) / 2 / ONE.gpu_bytes
    tight = choose("7B", planner=PlannerConfig(headroom=between)).best
    assert tight.cand.engine == "vllm" and tight.cand.enforce_eager
    # and inside vLLM's share: a share whose KV cache holds one sequence only without the graph pool
    shares = [s / 1000 for s in range(200, 600)]
    cand = Candidate(1, 0, "vllm", 1, 0.0, 2, True, True, micro_batch_size=32)
    tight_share = next(s for s in shares if fit(replace(cand, gpu_memory_utilization=s),
                                                shape("7B"), WORK, GRPO_ROLES, ONE, BATCH).refused is None)
    graphs = fit(replace(cand, gpu_memory_utilization=tight_share, enforce_eager=False),
                 shape("7B"), WORK, GRPO_ROLES, ONE, BATCH)
    assert "enforce_eager=true frees them" in graphs.refused
    best = choose("7B", space=Space(engines=("vllm",), memory_shares=(tight_share,))).best
    assert best.cand.enforce_eager


def test_a_cpu_plan_never_picks_graphs_or_sleep(tmp_path):
    cpu = ClusterConfig.parse("1xCPU")
    cands = [c for c in enumerate_candidates(cpu, WORK, Space()) if c.engine == "vllm"]
    assert cands and all(c.enforce_eager and c.sleep_level == 0 for c in cands)
    tiny = shape("0.5B")
    refused = fit(Candidate(1, 0, "vllm", 1, 0.5, enforce_eager=False), tiny, WORK, GRPO_ROLES, cpu, BATCH)
    assert "CUDA graphs and vLLM's sleep mode need a CUDA device, the cluster is CPU" in refused.refused
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "roles.rollout.engine=vllm"])
    algo, task = resolve_algorithm(cfg.algorithm), run_task(cfg)
    with pytest.raises(fl.PlanError, match=r"vLLM on a CPU needs a head_dim of \(32, .*the model's is 16"):
        auto_plan.choose(cfg, algo, task, cpu)  # the tiny model's 4 heads of 16: vLLM's CPU kernels have none
    wide = [f"train.output_dir={tmp_path}", "roles.rollout.engine=vllm", "model.tiny_hidden_size=128"]
    cfg = load_run_config(None, [*wide, "roles.rollout.enforce_eager=false"])
    with pytest.raises(fl.PlanError, match="CUDA graphs and vLLM's sleep mode need a CUDA device"):
        auto_plan.choose(cfg, algo, task, cpu)  # the user's enforce_eager=false is kept, and refused on the CPU
    choice, values = auto_plan.choose(load_run_config(None, wide), algo, task, cpu)
    assert values["roles.rollout.enforce_eager"] is True and values["roles.rollout.free_cache_engine"] == 0
    assert values["train.device"] == "cpu" and {p["device"] for p in values["placement"]["pools"]} == {"cpu"}
    assert "graphs" not in choice.explain()


@pytest.mark.parametrize("spec,first,pool,k,bad", [
    ("2x8xH100-80G", 0, 16, 16, "a node has 8 GPUs"),
    ("2x8xH100-80G", 0, 16, 8, None),
    ("2x6xH100-80G", 0, 12, 4, "its group of GPUs 4-7 crosses a node boundary at 6 GPUs per node"),
    ("3x6xH100-80G", 6, 12, 4, "its group of GPUs 10-13 crosses"),  # a rollout pool after a train node
    ("3x6xH100-80G", 6, 12, 6, None),
    ("4x4xH200-141G", 4, 12, 8, "a node has 4 GPUs"),
    ("1x6xH100-80G", 2, 4, 4, None)])  # within one node: any group
def test_tensor_parallel_groups_spanning_nodes_are_found(spec, first, pool, k, bad):
    got = ClusterConfig.parse(spec).tensor_parallel_span(first, pool, k)
    assert (got is None) if bad is None else (bad in got and f"tensor_parallel_size={k}" in got)


@pytest.mark.parametrize("spec", ["2x8xH100-80G", "2x6xH100-80G", "3x6xH100-80G", "4x4xH200-141G", "2x2xA100-80G"])
def test_auto_placement_never_enumerates_a_group_across_nodes(spec):
    cluster = ClusterConfig.parse(spec)
    cands = [c for c in enumerate_candidates(cluster, WORK, Space(engines=("vllm",))) if c.engine == "vllm"]
    assert cands and all(cluster.tensor_parallel_span(0 if c.colocated else c.train_gpus, c.rollout_pool,
                                                      c.tensor_parallel) is None for c in cands)
    assert max(c.tensor_parallel for c in cands) <= cluster.gpus_per_node


@pytest.mark.parametrize("spec,tp,per_node", [("2x8xH100-80G", 16, 8), ("2x4xH100-80G", 8, 4),
                                              ("2x6xH100-80G", 4, 6)])
def test_flowrl_plan_refuses_a_users_tp_that_spans_nodes(tmp_path, spec, tp, per_node):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "model.dtype=bfloat16", "roles.rollout.engine=vllm",
                                 f"roles.rollout.tensor_parallel_size={tp}"])
    algo, task = resolve_algorithm(cfg.algorithm), run_task(cfg)
    with pytest.raises(fl.PlanError) as err:
        auto_plan.choose(cfg, algo, task, ClusterConfig.parse(spec))
    line = str(err.value)
    assert "\n" not in line and f"roles.rollout.tensor_parallel_size={tp} spans nodes" in line
    assert f"{per_node} GPUs" in line


def test_the_cli_says_it_in_one_line(tmp_path):
    import cli_process

    done = cli_process.run("plan", "grpo", "--cluster", "2x8xH100-80G", "--set", "roles.rollout.engine=vllm",
                           "--set", "roles.rollout.tensor_parallel_size=16", cwd=tmp_path, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "roles.rollout.tensor_parallel_size=16 spans nodes: a node has 8 GPUs" in last and "Traceback" not in \
        done.stderr


def test_flowrl_plan_gpus_nodes_refuses_it_too(tmp_path):
    """`flowrl plan --gpus 16 --nodes 2` judges the user's layout with 8 GPUs a node (as flowrl train does under
    torchrun with LOCAL_WORLD_SIZE)."""
    from flowrl.runtime.layout.planning import plan_on_gpus

    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "roles.rollout.engine=vllm",
                                 "roles.rollout.tensor_parallel_size=16", "train.batch_size=16"])
    algo, task = resolve_algorithm(cfg.algorithm), run_task(cfg)
    with pytest.raises(fl.PlanError, match="tensor_parallel_size=16 spans nodes: a node has 8 GPUs"):
        plan_on_gpus(cfg, algo, task, 16, 2, gpus_per_node=8)
    with pytest.raises(fl.PlanError, match="tensor_parallel_size=16 does not divide the model's 4 attention heads"):
        plan_on_gpus(cfg, algo, task, 16, 1, gpus_per_node=16)  # one node of 16: no span; the next check speaks


def test_the_models_max_num_seqs_is_the_rollout_configs_default():
    vllm_rollout = pytest.importorskip("flowrl.engines.vllm.rollout")
    from flowrl.plan.memory import VLLM_MAX_NUM_SEQS

    assert vllm_rollout.VLLMRolloutConfig.model_fields["max_num_seqs"].default == VLLM_MAX_NUM_SEQS


def test_flowrl_trains_check_names_eager_where_the_graphs_do_not_fit(tmp_path):
    """The run's own layout (the 7B with vLLM's graphs asleep beside the optimizer step) over a limit that only
    the same layout eager meets: the check's options name enforce_eager=true alone."""
    from flowrl.config.candidate import Layout
    from flowrl.runtime.layout.memory_check import fixes

    cand = Candidate(1, 0, "vllm", 1, 0.5, 1, True, True, micro_batch_size=32, enforce_eager=False)
    layout = Layout(cand, GRPO_ROLES, ONE, BATCH, {"global": "global"}, ("actor",), ("ref",), "rollout", "actor")
    limit = max(fit(replace(cand, enforce_eager=True), shape("7B"), WORK, GRPO_ROLES, ONE, BATCH).peak.values())
    assert ["roles.rollout.enforce_eager=true"] in fixes(layout, shape("7B"), WORK, limit)


def test_the_cuda_presets_engine_is_the_planners_to_choose_and_a_named_vllm_is_kept(tmp_path):
    """train.device=cuda fills roles.rollout.engine=hf_static (the preset): the planner still weighs vLLM where it
    is installed; a run that names vLLM keeps it."""
    from importlib.util import find_spec

    preset = load_run_config(None, [f"train.output_dir={tmp_path}", "train.device=cuda", "model.dtype=bfloat16"])
    algo, task = resolve_algorithm(preset.algorithm), run_task(preset)
    engines = {s.cand.engine for s in auto_plan.choose(preset, algo, task, ONE)[0].scored}
    assert engines == ({"hf_static", "vllm"} if find_spec("vllm") else {"hf_static"})
    named = load_run_config(None, [f"train.output_dir={tmp_path}", "model.dtype=bfloat16", "roles.rollout.engine=vllm"])
    assert {s.cand.engine for s in auto_plan.choose(named, algo, task, ONE)[0].scored} == {"vllm"}

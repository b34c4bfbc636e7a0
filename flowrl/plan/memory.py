"""The memory model of a candidate: bytes per GPU in each phase of a step, and what the engines refuse at build.

Train pool, per GPU (the train engines' own estimates, flowrl.engines.hf.configs.HFTrainConfig.estimate_memory,
sharded over the pool by FSDP2):
- resident between passes: each trained role's weights and AdamW moments (not with offload_optimizer: they
  wait on the CPU), each frozen role's weights (none where a LoRA actor lends its base);
- an update: resident + the role's gradients, one micro-batch's activations (checkpointed: the layers' inputs
  and the one layer recomputed in full) and its logits; a token budget (max_tokens_per_micro_batch, set on
  every trained and frozen role) makes a micro-batch that many tokens (one row where a row is longer), in the
  update and in the no-grad passes alike; with offload_optimizer the optimizer step then holds the weights,
  the gradients and the moments (AdamW's two, in the parameters' dtype) and no activations or logits;
- the rollout on the same pool: hf_static keeps its own copy of the weights (none on one GPU: it generates
  with the actor's module) and its static KV cache of its rows at full length, through every phase, plus the
  sampling logits while it generates; vLLM pre-allocates `gpu_memory_utilization` of the card (weights, its
  profile run's activations, the CUDA graph pool unless enforce_eager, the rest KV cache) and holds it all the
  time at sleep level 0; at level 1 or 2 it frees it outside generation (1: weights to CPU memory, 2: dropped
  and resent by the sync) but keeps its context and the graph pool (`vllm_asleep`).
  The graph pool (`cuda_graphs`) is vLLM's capture sizes (`capture_sizes`, vLLM's own default rule) times the
  model's layers times the device table's measured cost of one size and layer (DeviceKind.vllm_graph_mib);
  since vLLM 0.21 vLLM profiles it and takes it out of its share (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS), so
  graphs leave less KV cache, and, asleep, more memory beside the train phases.
  vLLM refuses to start unless that share is free when it starts (the train engine is resident then) and
  unless its share holds the weights, the profile and at least one sequence of KV cache.
A rollout pool of its own holds one engine's share alone. Each GPU also carries its device row's overhead
(DeviceKind.overhead_gib: CUDA context, NCCL, allocator fragmentation; OVERHEAD on a GPU). Refusals are the
engines' own build-time checks, in one line each.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.memory import GIB, ModelShape, RankLoad, kv_cache
from flowrl.engines.vllm.process import CPU_HEAD_SIZES
from flowrl.plan.candidates import Candidate, Work
from flowrl.plan.cluster import ClusterConfig
from flowrl.plan.costs import DeviceKind

OVERHEAD = int(DeviceKind.overhead_gib * GIB)  # per GPU: CUDA context, NCCL buffers, the allocator's fragmentation
# what a sleeping vLLM keeps on the GPU beside its CUDA graph pool (its context): the 1.0 GiB this model counted
# with the pool inside, less the 0.39 GiB pool measured for the 0.5B shape (not measured apart)
VLLM_ASLEEP = int(0.6 * GIB)
VLLM_PROFILE_TOKENS = 8192  # vLLM's profile run: max_num_batched_tokens tokens at once
VLLM_MAX_NUM_SEQS = 256  # the rollout's max_num_seqs (flowrl.engines.vllm.rollout.VLLMRolloutConfig's default)
VLLM_MAX_CAPTURE = 512  # vLLM's default largest CUDA graph (tokens; 1024 on Blackwell)


def capture_sizes(max_num_seqs: int = VLLM_MAX_NUM_SEQS) -> list[int]:
    """The batch sizes vLLM captures a CUDA graph for by default (vllm/config/vllm.py, VllmConfig's
    _set_cudagraph_sizes, 0.26-0.32): up to min(2 max_num_seqs, 512), 1, 2, 4, then every 8 below 256 and every
    16 from 256; 51 sizes at max_num_seqs 256, 19 at 64 (as its logs list them)."""
    top = min(2 * max_num_seqs, VLLM_MAX_CAPTURE)
    sizes = [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    return sorted({*sizes, *([max_num_seqs] if max_num_seqs <= top else [])})


def cuda_graphs(cand: Candidate, shape: ModelShape, device: DeviceKind) -> int:
    """Bytes of vLLM's CUDA graph pool per GPU: none eager (or not vLLM); else its capture sizes times the
    layers times the measured cost of one (0.5B shape, 51 sizes: 51 x 24 x 0.33 MiB = 0.39 GiB as measured)."""
    if cand.engine != "vllm" or cand.enforce_eager:
        return 0
    return int(len(capture_sizes()) * shape.num_layers * device.vllm_graph_mib * 2**20)


def vllm_asleep(cand: Candidate, shape: ModelShape, device: DeviceKind) -> int:
    """What a sleeping vLLM keeps on each GPU: its context and its CUDA graph pool."""
    return VLLM_ASLEEP + cuda_graphs(cand, shape, device)


@dataclass(frozen=True)
class Roles:
    """What a plan asks of its pools: trained roles, frozen roles, whether one follows weights (a rollout)."""

    trained: int = 1
    frozen: int = 0
    frozen_lent: bool = False  # the frozen role reads its base's module under LoRA (a reference policy)
    rollout: bool = True
    compile: bool = False


@dataclass(frozen=True)
class Fit:
    peak: dict[str, int]  # pool -> bytes per GPU at its highest phase
    refused: str | None = None  # an engine's build-time refusal, one line
    kv_tokens: int = 0  # KV cache tokens one rollout replica holds
    layout_refused: bool = False  # refused for its layout (TP, nodes, batch split, device), not for memory

    def fits(self, gpu_bytes: int) -> bool:
        return self.refused is None and max(self.peak.values()) <= gpu_bytes


def refusal(cand: Candidate, shape: ModelShape, work: Work, cluster: ClusterConfig, batch: dict[str, int]
            ) -> str | None:
    """The first build-time check an engine would fail for this layout, as the one line it prints; else None."""
    k, pool = cand.tensor_parallel, cand.rollout_pool
    if pool % k:
        return f"roles.rollout.tensor_parallel_size={k} does not divide the rollout pool's {pool} GPUs"
    span = cluster.tensor_parallel_span(0 if cand.colocated else cand.train_gpus, pool, k)
    if span:
        return span
    if cand.engine == "vllm" and not cluster.kind.cuda and (not cand.enforce_eager or cand.sleep_level):
        return (f"roles.rollout.enforce_eager=false / free_cache_engine={cand.sleep_level}: CUDA graphs and vLLM's "
                f"sleep mode need a CUDA device, the cluster is {cluster.device}")
    if cand.engine == "vllm" and not cluster.kind.cuda and shape.head_dim not in CPU_HEAD_SIZES:
        return f"roles.rollout.engine=vllm: vLLM on a CPU needs a head_dim of {CPU_HEAD_SIZES}, the model's is " \
               f"{shape.head_dim}"
    if shape.num_heads % k or (shape.num_kv_heads % k and k % shape.num_kv_heads):
        return (f"roles.rollout.tensor_parallel_size={k} does not divide the model's {shape.num_heads} attention "
                f"heads and {shape.num_kv_heads} KV heads")
    if cand.offload_params and cand.train_gpus == 1:
        return "roles.actor.offload_params needs FSDP2, over 2 or more ranks"
    for world in {cand.train_gpus, cand.rollout_pool}:
        for name, total in batch.items():
            if total % world:
                return f"train.{name}={total} must be divisible by the world_size {world} of a pool"
    return None


def fit(cand: Candidate, shape: ModelShape, work: Work, roles: Roles, cluster: ClusterConfig,
        batch: dict[str, int]) -> Fit:
    """Per-GPU peaks of the candidate's pools, or the refusal an engine would raise at build."""
    refused = refusal(cand, shape, work, cluster, batch)
    layout_refused = refused is not None
    phases, kv_tokens, vllm_refusal = pool_phases(cand, shape, work, roles, cluster.gpu_bytes, cluster.kind)
    refused = refused or (vllm_refusal if roles.rollout else None)
    card = cluster.gpu_bytes
    if roles.rollout and cand.colocated and cand.engine == "vllm" and phases["global"]["generate"] > card \
            and refused is None:
        resident = phases["global"]["generate"] - cluster.kind.overhead_bytes - \
            rollout_bytes(cand, shape, work, card, cluster.kind)[1]
        refused = (f"vLLM would not start: gpu_memory_utilization={cand.gpu_memory_utilization:g} of the card "
                   f"is not free beside the train engines' {resident / GIB:.1f} GiB")
    return Fit({pool: max(each.values()) for pool, each in phases.items()}, refused, kv_tokens, layout_refused)


def pool_phases(cand: Candidate, shape: ModelShape, work: Work, roles: Roles, card: int, device: DeviceKind
                ) -> tuple[dict[str, dict[str, int]], int, str | None]:
    """Bytes per GPU of each pool in each phase of a step (the device's overhead included), the KV tokens of one
    rollout replica, and a vLLM refusal; colocated, an idle rollout keeps what it holds between generations
    through the train phases."""
    train, overhead = train_phases(cand, shape, work, roles), device.overhead_bytes
    if not roles.rollout:
        return {"train": {p: overhead + b for p, b in train.items()}}, 0, None
    rollout_held, rollout_generating, kv_tokens, vllm_refusal = rollout_bytes(cand, shape, work, card, device)
    if cand.colocated:
        idle = vllm_asleep(cand, shape, device) if cand.engine == "vllm" and cand.sleep_level else rollout_held
        phases = {"generate": overhead + train["resident"] + rollout_generating,
                  **{p: overhead + b + idle for p, b in train.items()}}
        return {"global": phases}, kv_tokens, vllm_refusal
    return {"train": {p: overhead + b for p, b in train.items()},
            "gen": {"generate": overhead + rollout_generating}}, kv_tokens, vllm_refusal


def train_phases(cand: Candidate, shape: ModelShape, work: Work, roles: Roles) -> dict[str, int]:
    """Bytes per GPU of the train pool: resident, during an update, during an offloaded optimizer step."""
    world = cand.train_gpus
    load = RankLoad(world, rows=-(-work.rows // world), seq_len=work.seq_len,
                    tokens=-(-cand.micro_batch_size // world) * work.seq_len,
                    gradient_checkpointing=cand.gradient_checkpointing)
    engine = HFTrainConfig.model_validate({"offload_params": cand.offload_params, "lora_rank": cand.lora_rank,
                                           "compile": roles.compile,
                                           "max_tokens_per_micro_batch": cand.token_budget})
    parts = engine.estimate_memory(shape, load)
    frozen = engine.estimate_memory(shape, load, trainable=False, base_lent=roles.frozen_lent)
    moments = 0 if cand.offload_optimizer else parts["optimizer"]
    resident = roles.trained * (parts["weights"] + moments) + roles.frozen * frozen["weights"]
    phases = {"resident": resident,
              "update": resident + parts["gradients"] + parts["activations"] + parts["logits"],
              "forward": resident + frozen["activations"] + parts["logits"]}
    if cand.offload_optimizer:
        phases["optimizer step"] = resident + parts["gradients"] + parts["optimizer"]
    return phases


def rollout_bytes(cand: Candidate, shape: ModelShape, work: Work, card: int, device: DeviceKind
                  ) -> tuple[int, int, int, str | None]:
    """(held between generations, held while generating, KV tokens of one replica, a vLLM refusal)."""
    rows = -(-work.rows // max(1, cand.replicas))  # no replica: a tensor_parallel_size above the pool, refused
    kv_token = kv_cache(shape, RankLoad(1, rows=1, seq_len=1, tokens=1))
    if cand.engine != "vllm":
        shared = cand.colocated and cand.train_gpus == 1
        held = (0 if shared else shape.weight_bytes) + rows * work.seq_len * kv_token
        return held, held + 2 * rows * shape.vocab_size * 4, rows * work.seq_len, None
    k = cand.tensor_parallel
    reserve = int(cand.gpu_memory_utilization * card)
    profile = VLLM_PROFILE_TOKENS * (34 * shape.hidden_size + 2 * 4 * shape.vocab_size // k)
    graphs = cuda_graphs(cand, shape, device)
    free = reserve - shape.weight_bytes // k - profile - graphs
    kv_tokens = max(0, free) * k // kv_token
    if kv_tokens < work.seq_len:
        return reserve, reserve, kv_tokens, (
            f"vLLM would find no room for one {work.seq_len}-token sequence's KV cache in "
            f"gpu_memory_utilization={cand.gpu_memory_utilization:g} of {card / GIB:.0f} GiB at "
            f"tensor_parallel_size={k} (weights {shape.weight_bytes / k / GIB:.1f} GiB a GPU"
            + (f", CUDA graphs {graphs / GIB:.2f} GiB: enforce_eager=true frees them)" if graphs else ")"))
    return reserve, reserve, kv_tokens, None

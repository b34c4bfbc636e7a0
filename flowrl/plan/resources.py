"""Resources: how much GPU memory each role of a plan needs per GPU, and placements built from a GPU count.

The estimate follows what the engines hold, from the model's shape and the run's batch sizes (`Workload`):

- a trainable role (its registration says `trainable`): parameters, gradients and AdamW's two moments in the
  parameter dtype, each sharded over the pool's ranks (FSDP2); activations of one micro-batch (per rank) of
  `seq_len` tokens, about 34 bytes per token, layer and hidden unit in bf16 without activation
  checkpointing (Korthikanti et al.), 2 with it; and one chunk of fp32 logits (logprobs are chunked);
- a role that follows another's weights (the rollout): its own copy of the weights unless it shares its
  source's module (same pool, one rank), and the KV cache of its share of the rows at full length;
- any other role on a pool (reference, reward model): its weights, sharded, and one micro-batch's activations
  of a forward pass (no backward: about 4 bytes per token, layer and hidden unit); none of the weights for
  the base of a LoRA actor on the actor's pool (it is the actor's module with the adapters off).

The train engine's options change a trainable role's figures: with LoRA (`lora_rank`) gradients and AdamW
moments are the adapters' only; `offload_params` (FSDP2 CPU offload) keeps parameter shards, gradients and
optimizer state in CPU memory, and the GPU holds the unsharded root (embeddings, lm_head) and two decoder
layers at a time (the one computing and the one prefetched); `offload_optimizer` brings AdamW's moments to
the GPU for the optimizer step only, when activations and logits are freed, so it counts only what they
exceed the activations and logits by.

Estimates, not measurements: they decide whether a placement can fit before anything loads, and each figure
is printed by `flowrl plan --gpus N`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.errors import PlanError
from flowrl.plan.placement import Placement, Pool
from flowrl.plan.planner import Plan

GIB = 2**30
ACTIVATION_BYTES = {False: 34, True: 2}  # per token, layer, hidden unit: bf16 training, without / with recompute


@dataclass(frozen=True)
class ModelShape:
    num_params: int
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int
    num_heads: int = 0  # the rest: for LoRA's adapter sizes
    intermediate_size: int = 0
    tied_embeddings: bool = True

    @classmethod
    def from_config(cls, config: dict, dtype_bytes: int) -> "ModelShape":
        """From a Hugging Face config.json's fields (a decoder-only transformer with tied or untied lm_head)."""
        hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or hidden // heads
        inter = config.get("intermediate_size", 4 * hidden)
        bias = config.get("attention_bias", config.get("model_type") == "qwen2")  # Qwen2 has q, k, v biases
        attention = hidden * head_dim * (heads * 2 + kv_heads * 2) + bias * head_dim * (heads + 2 * kv_heads)
        per_layer = attention + 3 * hidden * inter + 2 * hidden
        embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
        return cls(layers * per_layer + embeddings + hidden, layers, hidden, kv_heads, head_dim, vocab, dtype_bytes,
                   heads, inter, config.get("tie_word_embeddings", True))

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    def layer_params(self) -> int:
        return (self.num_params - self.embedding_params()) // self.num_layers

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """Adapter parameters: rank * (inputs + outputs) of each targeted linear layer of each decoder layer."""
        h, q, kv, inter = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        sizes = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + inter,
                 "up_proj": h + inter, "down_proj": inter + h}
        return self.num_layers * rank * sum(sizes.get(name, 0) for name in targets)


@dataclass(frozen=True)
class Workload:
    rows: int  # responses per step
    micro_batch_size: int  # responses per forward/backward pass (global)
    seq_len: int  # prompt + response tokens
    logprob_chunk_tokens: int = 4096
    gradient_checkpointing: bool = False
    offload_params: bool = False
    offload_optimizer: bool = False
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()


def estimate(plan: Plan, shape: ModelShape, work: Workload) -> dict[str, dict[str, dict[str, int]]]:
    """Bytes per GPU, by pool, role and component."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for role, pool in plan.pools.items():
        spec, ranks = plan.specs[role], pool.world_size
        weights = shape.num_params * shape.dtype_bytes
        tokens = -(-work.micro_batch_size // ranks) * work.seq_len
        if spec.trainable:
            parts = _trained(shape, work, ranks, tokens)
        elif spec.weights_from is not None:
            kv = (-(-work.rows // ranks) * work.seq_len * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim
                  * shape.dtype_bytes)
            parts = {"weights": 0 if plan.shares_weights(role) else weights, "kv_cache": kv}
        else:
            source = plan.pools.get(spec.base_of) if spec.base_of is not None else None
            base = work.lora_rank > 0 and source is not None and source.name == pool.name
            parts = {"weights": 0 if base else weights // ranks,
                     "activations": tokens * shape.num_layers * shape.hidden_size * 4}
        out.setdefault(pool.name, {})[role] = parts
    return out


def _trained(shape: ModelShape, work: Workload, ranks: int, tokens: int) -> dict[str, int]:
    """A trainable role's bytes per GPU under the train engine's options (LoRA, offload)."""
    weights = shape.num_params * shape.dtype_bytes
    trained = (shape.lora_params(work.lora_rank, work.lora_targets) if work.lora_rank else shape.num_params) \
        * shape.dtype_bytes
    activations = tokens * shape.num_layers * shape.hidden_size * ACTIVATION_BYTES[work.gradient_checkpointing]
    logits = 3 * min(tokens, work.logprob_chunk_tokens) * shape.vocab_size * 4
    if work.offload_params:  # shards in CPU memory: the unsharded root and two layers at a time on the GPU
        on_gpu = (shape.embedding_params() + 2 * shape.layer_params()) * shape.dtype_bytes
        return {"weights": on_gpu, "gradients": on_gpu * trained // weights, "optimizer": 0,
                "activations": activations, "logits": logits}
    optimizer = 2 * trained // ranks
    if work.offload_optimizer:  # on the GPU for the step only, when activations and logits are freed
        optimizer = max(0, optimizer - activations - logits)
    return {"weights": weights // ranks, "gradients": trained // ranks, "optimizer": optimizer,
            "activations": activations, "logits": logits}


def check_fits(plan: Plan, per_gpu: dict[str, dict[str, dict[str, int]]], gpu_bytes: int) -> None:
    """A PlanError naming the pool, what it needs and what one GPU has, when an estimate does not fit."""
    for pool, roles in per_gpu.items():
        need = sum(sum(parts.values()) for parts in roles.values())
        if need > gpu_bytes:
            raise PlanError(f"placement: pool {pool!r} needs about {need / GIB:.3g} GiB per GPU "
                            f"({', '.join(f'{r} {sum(p.values()) / GIB:.3g}' for r, p in roles.items())}), "
                            f"but a GPU has {gpu_bytes / GIB:.3g} GiB; use more GPUs for it, activation "
                            f"checkpointing or smaller micro-batches")


def gpu_placement(roles: tuple[str, ...], followers: tuple[str, ...], gpus: int, nodes: int = 1,
                  split: float | None = None) -> Placement:
    """Every role on all `gpus` (the hybrid engine), or with `split`, the roles that follow weights (the rollout)
    on that fraction of the GPUs and the others on the rest."""
    if gpus < 1 or nodes < 1 or gpus % nodes:
        raise PlanError(f"placement: --gpus {gpus} must be a positive multiple of --nodes {nodes}")
    if split is None or not followers:
        return Placement(pools=[Pool(name="global", roles=list(roles), world_size=gpus, device="cuda")])
    generate = round(gpus * split)
    if not 0 < generate < gpus:
        raise PlanError(f"placement: a split of {split} leaves no GPU for one side of {gpus} GPUs")
    return Placement(pools=[Pool(name="train", roles=[r for r in roles if r not in followers],
                                 world_size=gpus - generate, device="cuda"),
                            Pool(name="generate", roles=list(followers), world_size=generate, device="cuda")])


def describe(per_gpu: dict[str, dict[str, dict[str, int]]], pools: dict[str, Pool]) -> str:
    lines = ["memory per GPU (estimate):"]
    for name, roles in per_gpu.items():
        total = sum(sum(parts.values()) for parts in roles.values())
        lines.append(f"  pool {name} ({pools[name].world_size} x {pools[name].device}): {total / GIB:.3g} GiB")
        for role, parts in roles.items():
            detail = ", ".join(f"{k} {v / GIB:.3g}" for k, v in parts.items())
            lines.append(f"    {role}: {detail}")
    return "\n".join(lines)

"""Memory estimates: the bytes one GPU holds for an engine, from the model's shape and one rank's load.

Each engine config owns its estimate (`TrainEngineConfig.estimate_memory`,
`RolloutEngineConfig.estimate_memory`), since only the engine knows what it keeps: LoRA adapters, offloaded
shards, chunked logits, a KV cache. The helpers here hold the arithmetic every transformer engine shares;
flowrl.plan.resources says how a plan's roles load each rank and sums the estimates per pool.

- trained: parameters, gradients and AdamW's two moments in the parameter dtype, each sharded over the
  pool's ranks (FSDP2); activations of one micro-batch (per rank): without activation checkpointing,
  24 h + 8 i bytes per token and layer in bf16 for a SwiGLU layer of hidden size h and intermediate size i
  (the MLP keeps its input, gate and up outputs, the activation and the product: 2 h + 8 i; attention and the
  two RMSNorms, which transformers computes in fp32, about 22 h); 18 h + 6 i for torch.compile'd passes
  (inductor fuses the elementwise ops: the MLP keeps its input, the gate and up outputs and the product, 2 h +
  6 i, attention its matmuls' inputs and the norms' fp32 inputs, about 16 h); 34 h where i is unknown
  (Korthikanti et al., a 4h GELU MLP); with checkpointing 2 h a layer (each layer's input) plus one layer's full
  activations (the layer the backward pass recomputes); and the logits of the tokens computed at once, 12 bytes
  per token and vocabulary entry eager (3 fp32 copies: logits, log-softmax, its gradient), 6 compiled (the
  chunk's bf16 logits and one fp32 copy: the compiled log-softmax fuses the rest). Calibrated on the 0.5B shape
  (h 896, i 4864): eager, 33.5 GiB updating 4 x 4352 tokens and 17.4 GiB for 4 x 1280 on an H200
  (docs/long_context.md), where this predicts 34.1 and 17.6; compiled, torch's allocated peaks of 16.5, 22.8 and
  33.4 GiB for micro-batches of 16 x 384, 32 x 384 and 16 x 1152 tokens (H200, docs/benchmarks.md), 0.98-0.99 of
  this; and on an H100 (2026-12-07) the 64 x 1280-token micro-batches that 34 h had accepted (71 GiB predicted)
  ran out of memory at 77.6 GiB allocated, where the planner's phase model (flowrl.plan.memory) now predicts 95 GiB,
  and with checkpointing and the optimizer offloaded peaked at 14.4 GiB (0.5B: 16.9 predicted, the planner's
  2 GiB overhead included) and 30.6 GiB (1.5B: 31.3);
- frozen (reference, reward model): its weights, sharded, and one micro-batch's forward activations (about
  4 bytes per token, layer and hidden unit);
- a rollout: its own copy of the weights unless it shares its source's module, and the KV cache of its rows
  at full length.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
GPT_ACTIVATION_BYTES = 34  # per token, layer and hidden unit without recompute, when the MLP's size is unknown
LOGIT_BYTES = 12  # per token and vocabulary entry of the logits computed at once: 3 fp32 copies (eager)
COMPILED_LOGIT_BYTES = 6  # compiled: the bf16 logits and one fp32 copy
RECOMPUTE_BYTES = 2  # per token, layer and hidden unit with activation checkpointing: the layer's input
FORWARD_BYTES = 4  # per token, layer, hidden unit of a no-grad forward pass


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
    active_params: int = 0  # parameters one token computes with (a mixture of experts: its top-k); 0: all
    num_experts: int = 0  # routed experts of a mixture-of-experts layer; 0: a dense model

    @classmethod
    def from_config(cls, config: dict, dtype_bytes: int) -> "ModelShape":
        """From a Hugging Face config.json's fields (a decoder-only transformer with tied or untied lm_head;
        Qwen2 q/k/v biases, Qwen3 q/k norms, and mixture-of-experts layers from the expert fields:
        num_experts or num_local_experts, num_experts_per_tok, moe_intermediate_size, a shared expert,
        decoder_sparse_step and mlp_only_layers)."""
        hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or hidden // heads
        inter = config.get("intermediate_size") or 4 * hidden
        model_type = str(config.get("model_type", ""))
        bias = config.get("attention_bias")
        bias = model_type.startswith("qwen2") if bias is None else bias  # Qwen2 has q, k, v biases
        attention = hidden * head_dim * (heads * 2 + kv_heads * 2) + bias * head_dim * (heads + 2 * kv_heads)
        attention += 2 * head_dim * model_type.startswith("qwen3")  # Qwen3's q and k RMSNorms
        dense, (sparse, active, experts) = 3 * hidden * inter, _moe_mlp(config, hidden, inter)
        num_sparse = _sparse_layers(config, layers) if experts else 0
        tied = config.get("tie_word_embeddings", True)
        embeddings = vocab * hidden * (1 if tied else 2)
        base = layers * (attention + 2 * hidden) + (layers - num_sparse) * dense + embeddings + hidden
        return cls(base + num_sparse * sparse, layers, hidden, kv_heads, head_dim, vocab, dtype_bytes, heads, inter,
                   tied, base + num_sparse * active, experts)

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    def compute_params(self) -> int:
        """Parameters each token computes with: all of a dense model, the routed top-k of a mixture of experts."""
        return self.active_params or self.num_params

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
class RankLoad:
    """What one rank of a pool processes per step."""

    ranks: int  # the pool's world size: FSDP2 shards over it
    rows: int  # responses per rank per step
    seq_len: int  # prompt + response tokens
    tokens: int  # tokens of one micro-batch on one rank
    gradient_checkpointing: bool = False


def trained(shape: ModelShape, load: RankLoad, *, trained_params: int | None = None,
            logit_tokens: int | None = None, compiled: bool = False) -> dict[str, int]:
    """A fully sharded trained engine: `trained_params` (default: all) get gradients and AdamW moments; the
    logits of `logit_tokens` tokens at a time (default: the whole micro-batch) are live at once; `compiled`
    passes save fewer activations."""
    trained_bytes = (shape.num_params if trained_params is None else trained_params) * shape.dtype_bytes
    return {"weights": shape.weight_bytes // load.ranks, "gradients": trained_bytes // load.ranks,
            "optimizer": 2 * trained_bytes // load.ranks, "activations": activations(shape, load, compiled),
            "logits": logits(shape, load, logit_tokens, compiled)}


def activations(shape: ModelShape, load: RankLoad, compiled: bool = False) -> int:
    """One micro-batch's saved activations for the backward pass (see the module docstring)."""
    h, i = shape.hidden_size, shape.intermediate_size
    if not i:
        full = GPT_ACTIVATION_BYTES * h
    else:
        full = 18 * h + 6 * i if compiled else 24 * h + 8 * i
    if load.gradient_checkpointing:  # every layer's input, and the layer being recomputed in full
        return load.tokens * (shape.num_layers * RECOMPUTE_BYTES * h + full)
    return load.tokens * shape.num_layers * full


def logits(shape: ModelShape, load: RankLoad, chunk_tokens: int | None = None, compiled: bool = False) -> int:
    per_entry = COMPILED_LOGIT_BYTES if compiled else LOGIT_BYTES
    return per_entry * min(load.tokens, chunk_tokens or load.tokens) * shape.vocab_size


def frozen(shape: ModelShape, load: RankLoad, holds_weights: bool = True) -> dict[str, int]:
    """A no-grad engine: its weights sharded (none when it reads another engine's module), one forward pass."""
    return {"weights": shape.weight_bytes // load.ranks if holds_weights else 0,
            "activations": load.tokens * shape.num_layers * shape.hidden_size * FORWARD_BYTES}


def _moe_mlp(config: dict, hidden: int, inter: int) -> tuple[int, int, int]:
    """(parameters, parameters one token uses, routed experts) of one mixture-of-experts MLP; (0, 0, 0) dense."""
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts") or 0
    if not experts:
        return 0, 0, 0
    expert = 3 * hidden * (config.get("moe_intermediate_size") or inter)
    top_k = config.get("num_experts_per_tok") or 1
    shared = config.get("shared_expert_intermediate_size") or 0  # Qwen2-MoE: one shared expert and its gate
    shared = 3 * hidden * shared + hidden if shared else 0
    shared += 3 * hidden * (config.get("moe_intermediate_size") or inter) * (config.get("n_shared_experts") or 0)
    router = hidden * experts
    return experts * expert + router + shared, top_k * expert + router + shared, experts


def _sparse_layers(config: dict, layers: int) -> int:
    """Decoder layers with a mixture-of-experts MLP (Qwen-MoE's decoder_sparse_step and mlp_only_layers)."""
    step, dense = config.get("decoder_sparse_step") or 1, set(config.get("mlp_only_layers") or ())
    return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)


def kv_cache(shape: ModelShape, load: RankLoad) -> int:
    return load.rows * load.seq_len * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes

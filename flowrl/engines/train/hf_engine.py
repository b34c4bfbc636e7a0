"""HFTrainEngine: the TrainEngine protocol over a transformers model.

One engine per rank. With torch.distributed initialised and world size > 1
the model is sharded with FSDP2 (`fully_shard` on each decoder layer, then the
root) over a 1-D mesh of all ranks; this works on CPU with gloo as well as on
GPUs with NCCL. Every rank then passes its own rows: `mini_batch_size` and
`micro_batch_size` count rows per rank, and all ranks must hold equally many.

update() is exact: micro-batch losses of a mean (`loss_fn.combine == "mean"`)
are weighted by `loss_fn.weight(mb)` over the mini-batch's total weight
(summed over ranks), those of a sum ("sum", token-sum) are added, so one
step's gradient is the gradient of the loss on the whole mini-batch, however
it is split (over ranks too: FSDP averages gradients, so each rank's loss is
scaled by the world size). So micro-batches may also be formed by a token
budget instead of a row count (flowrl.engines.train.token_batching; every rank runs
as many), and each may run packed, its rows as one sequence with per-row
attention (flowrl.engines.train.packing).

Weights in and out, checkpoints and the export are its base's (flowrl.engines.train.engine_state).
Checkpoints are sharded (flowrl.engines.train.sharded_checkpoint): every rank writes
its own shards and a checkpoint loads at any world size. Options: CPU offload
of the sharded parameters (FSDP2's CPUOffloadPolicy) or of the optimizer state
between steps, and LoRA (flowrl.engines.train.lora), where only the adapters train,
save and load, and the weight sync and export read merged weights.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Literal

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch.distributed.tensor import DTensor

from flowrl.engines.hf.attention import use_flowrl_sdpa
from flowrl.engines.train.engine_state import TrainEngineState
from flowrl.engines.train.fsdp import move_optimizer_state, shard_device, shard_model
from flowrl.engines.train.logprobs import full_logits_logprobs, token_logprobs
from flowrl.engines.train.lr_schedules import check_schedule, lr_factor
from flowrl.engines.train.model_outputs import check_outputs, default_outputs, gathered_columns, response_width
from flowrl.engines.train.model_inputs import column_multiple, masked_inputs, packed_inputs, trim_padding, used_columns
from flowrl.engines.train.packing import packed_outputs
from flowrl.engines.train.rank_agreement import all_reduce_max, all_reduce_sum, check_same_rows
from flowrl.engines.protocols import LossFn
from flowrl.engines.train.regional_compile import CompiledLayers
from flowrl.engines.train.token_batching import budget_micro_batches
from flowrl.engines.sampling import RowSampling, apply_sampling

from flowrl.engines.hf.options import HFTrainOptions


class HFTrainEngine(TrainEngineState):
    """Actor (logprobs, entropy), critic (values) or reward model (scores) engine; AdamW, then the config's
    LR schedule: it ramps linearly over config.warmup_steps steps (step s, from 0, uses
    lr * min(1, (s + 1) / warmup_steps)), then stays or decays (flowrl.engines.train.lr_schedules). `eps` and
    `betas` are AdamW's (fixed; tests raise eps to make a step follow the gradient's scale).
    """

    def __init__(self, model: torch.nn.Module, config: HFTrainOptions, *, kind: Literal["actor", "critic", "reward"],
                 device: str | torch.device = "cpu", betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 by_length: bool = True):
        """`config`: the options (HFTrainOptions, which document each option and its default once;
        flowrl.engines.hf.configs.HFTrainConfig builds this engine); `model` is a peft LoRA model
        (flowrl.engines.train.lora.apply) when config.lora_rank > 0. The rest is how the engine is placed and run, not a run config option:
        by_length: group rows of similar length into micro-batches (and trim their padding); False keeps
        the batch's row order, as fixed-width micro-batches of verl without dynamic batch size do. FSDP2-sharded
        engines compute full logits whatever config.logprob_chunk_tokens says."""
        _check_kind(kind)
        self.config, self.kind, self.by_length = config, kind, by_length
        self.logprob_chunk_tokens, self.packing = config.logprob_chunk_tokens, config.packing
        self.max_tokens = config.max_tokens_per_micro_batch
        self.forward_max_tokens = config.forward_max_tokens_per_micro_batch or config.max_tokens_per_micro_batch
        self.grad_clip = config.grad_clip
        self.world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.sharded = self.world_size > 1
        self.device = shard_device(torch.device(device)) if self.sharded else torch.device(device)
        self.column_multiple = column_multiple(self.device)  # widths aligned on CUDA (model_inputs.COLUMN_MULTIPLE)
        self.model, self.lora = model, config.lora_rank > 0
        self.offload_optimizer = config.offload_optimizer and self.device.type != "cpu"
        use_flowrl_sdpa(model)  # unpadded causal passes run SDPA's flash kernel, compiled too
        if config.offload_params and not self.sharded and self.device.type != "cpu":
            raise ValueError("offload_params needs FSDP2, which shards over 2 or more ranks (torchrun); with one "
                             "process set it false")
        if self.sharded:  # fully_shard moves each group to the device as it shards it: no full copy there
            shard_model(self.model, self.device.type, self.world_size, offload=config.offload_params)
        else:
            self.model.to(self.device)
        self._compile(config.compile)
        self._optimizer(config, betas, eps)

    def _compile(self, compile: bool) -> None:
        """One process: each decoder layer compiled (flowrl.engines.train.regional_compile); FSDP2: the whole
        model; the module is compiled only while this engine's passes run (a rollout engine sharing it is not)."""
        self.compiled = compile
        self._layers = CompiledLayers(self.model) if compile and not self.sharded else None
        self._whole = compile and not self._layers
        self.model_fn = torch.compile(self.model) if self._whole else self.model
        self.decoder_fn = torch.compile(self.model.get_decoder()) if self._whole and self.kind == "actor" else None

    def _optimizer(self, config: HFTrainOptions, betas: tuple[float, float], eps: float) -> None:
        """AdamW over the trained parameters, then the LR schedule (flowrl.engines.train.lr_schedules)."""
        self.hyperparameters = dict(lr=config.lr, weight_decay=config.weight_decay, betas=betas, eps=eps)
        trained = [p for p in self.model.parameters() if p.requires_grad] or list(self.model.parameters())
        # one fused kernel per step on CUDA (torchtitan's default too); torch's foreach loop elsewhere
        self.optimizer = torch.optim.AdamW(trained, **self.hyperparameters,
                                           fused=self.device.type == "cuda" and not config.offload_params or None)
        check_schedule(config.lr_schedule, config.warmup_steps, config.lr_decay_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, functools.partial(
            lr_factor, warmup_steps=config.warmup_steps, schedule=config.lr_schedule,
            decay_steps=config.lr_decay_steps))

    @torch.no_grad()
    def forward(self, batch: TensorDict, *, temperature: float = 1.0, micro_batch_size: int = 8,
                outputs: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
        """No-grad outputs aligned to the response, on the device of batch["prompt_ids"]: each of `outputs`
        (flowrl.engines.train.model_outputs; None: an actor's "logprobs", a critic's "values", a reward model's
        "scores"). An actor's are computed chunk-wise, under each row's sampling distribution (its
        SAMPLED_WITH columns, flowrl.engines.sampling; rows without them: `temperature`, untruncated)."""
        _check_positive(temperature=temperature, micro_batch_size=micro_batch_size)
        outputs = check_outputs(self.kind, outputs or default_outputs(self.kind))
        check_same_rows(batch.batch_size[0], self.device, self.sharded)
        groups = self._micro_batches(batch, micro_batch_size, self.forward_max_tokens)
        outs = [self._outputs(batch[rows], temperature, outputs) for rows in groups]
        order = torch.cat(groups)
        home = batch["prompt_ids"].device
        unsort = torch.empty_like(order)
        unsort[order] = torch.arange(order.numel())
        return {key: torch.cat([out[key] for out in outs])[unsort.to(self.device)].to(home) for key in outs[0]}

    def update(self, batch: TensorDict, loss_fn: LossFn, *, temperature: float = 1.0,
               mini_batch_size: int = 8, micro_batch_size: int = 8, epochs: int = 1,
               shuffle_seed: int | None = None, old_logprobs_from_current: bool = False) -> dict[str, float]:
        """One optimizer step per mini-batch per epoch; mean metrics plus grad_norm, lr, skipped_steps.

        old_logprobs_from_current: each micro-batch's old logprobs are its current ones, detached
        (the on-policy single-step case, where they are equal; saves a forward pass).
        """
        _check_positive(temperature=temperature, mini_batch_size=mini_batch_size,
                        micro_batch_size=micro_batch_size, epochs=epochs)
        if loss_fn.combine not in ("mean", "sum"):
            raise ValueError(f"loss_fn.combine must be 'mean' or 'sum', got {loss_fn.combine!r}")
        check_outputs(self.kind, loss_fn.needs)
        num_rows = batch.batch_size[0]
        check_same_rows(num_rows, self.device, self.sharded)
        generator = None if shuffle_seed is None else torch.Generator().manual_seed(shuffle_seed)
        sums: dict[str, list] = {}  # key: [running sum (float or 0-d tensor), count]
        grad_norms, skipped, lr = [], 0, self.scheduler.get_last_lr()[0]
        for _ in range(epochs):
            order = torch.arange(num_rows) if generator is None else torch.randperm(num_rows, generator=generator)
            for rows in order.split(mini_batch_size):
                lr = self.scheduler.get_last_lr()[0]
                with self._compiling():  # the backward passes too (activation checkpointing recomputes)
                    grad_norm = self._step(batch[rows], loss_fn, temperature, micro_batch_size, sums,
                                           old_logprobs_from_current)
                skipped += grad_norm is None
                grad_norms += [] if grad_norm is None else [grad_norm]
        metrics = {key: float(total) / count for key, (total, count) in sums.items()}
        metrics["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        metrics["lr"] = lr
        metrics["skipped_steps"] = float(skipped)
        return metrics

    def _outputs(self, mb: TensorDict, temperature: float, outputs: tuple[str, ...],
                 span: tuple[int, int] | None = None,
                 sampling: RowSampling | None = None) -> dict[str, torch.Tensor]:
        """Outputs [B, R] on this engine's device for the micro-batch (on any device), 0 on padding, computed
        without the columns that are padding in every row: `span`, else found from mb's masks (on the host
        when mb is there, so no device sync); each row's sampling likewise: `sampling`, else read from mb."""
        trimmed = trim_padding(mb, span or used_columns(mb), self.column_multiple,
                               gathered_columns(outputs)).to(self.device)
        mask = trimmed["response_mask"].bool()
        sampling = (sampling or RowSampling.of(mb, temperature)).to(self.device)
        with self._compiling():
            out = self._outputs_dense(trimmed, sampling, outputs)
        width = mb["response_mask"].shape[1]  # a negative pad cuts the aligning columns (COLUMN_MULTIPLE) off
        return {key: response_width(value, mask, width) for key, value in out.items()}

    def _outputs_dense(self, mb: TensorDict, sampling: RowSampling,
                       outputs: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Outputs of the trimmed micro-batch; an actor's under each row's sampling distribution."""
        if self.packing:
            return packed_outputs(self, mb, sampling, outputs)
        response_ids, ids = mb["response_ids"], {column: mb[column] for column in gathered_columns(outputs)}
        num_prompt, num_response = mb["prompt_ids"].shape[1], response_ids.shape[1]
        temperature_N, truncation = sampling.per_token(num_response)
        if self.kind == "actor" and not (self.logprob_chunk_tokens and not self.sharded):
            # FSDP2 runs lm_head inside the root module's forward: the full model, padding masked
            inputs = self._dynamic(masked_inputs(mb))
            keep = num_response + 1
            if self._whole:  # as indices, of a dynamic size: an int is guarded on, a compile per response width
                width = inputs["input_ids"].shape[1]
                keep = self._dynamic({"keep": torch.arange(width - keep, width, device=self.device)})["keep"]
            logits_BRV = self.model_fn(**inputs, logits_to_keep=keep).logits[:, :-1]
            logits_NV = apply_sampling(logits_BRV.reshape(-1, logits_BRV.shape[-1]), temperature_N, truncation,
                                       response_ids.reshape(-1))
            return full_logits_logprobs(logits_NV.view(logits_BRV.shape), response_ids, outputs, ids)
        input_ids, column_BL = packed_inputs(mb)
        self._dynamic({"input_ids": input_ids})
        # the column of each response token, and of the token before it, which predicts it
        at_BR = column_BL[:, num_prompt:]
        before_BR = (at_BR - 1).clamp(min=0)
        if self.kind in ("critic", "reward"):
            head_BL = self.model_fn(input_ids=input_ids, use_cache=False).logits[..., 0]
            if self.kind == "critic":  # the value of the state before each response token
                return {"values": head_BL.gather(1, before_BR).float()}
            # the score after each response token (a reward model reads the last one)
            return {"scores": head_BL.gather(1, at_BR).float()}
        decoder = self.model.get_decoder() if self.decoder_fn is None else self.decoder_fn
        hidden_BLH = decoder(input_ids=input_ids, use_cache=False).last_hidden_state
        hidden_BRH = hidden_BLH.gather(1, before_BR[..., None].expand(-1, -1, hidden_BLH.shape[-1]))
        return token_logprobs(hidden_BRH, self.model.get_output_embeddings().weight, response_ids, temperature_N,
                              outputs, self.logprob_chunk_tokens, compiled=self.compiled, truncation=truncation,
                              ids=ids)

    def _compiling(self) -> contextlib.AbstractContextManager:
        """The block runs the compiled decoder layers (compile on, one process)."""
        return self._layers.active() if self._layers else contextlib.nullcontext()

    def _dynamic(self, inputs: dict) -> dict:
        """The whole model compiled (FSDP2): the micro-batch's rows and width are dynamic from the first compile
        (as hf_static's decode step: _mark_dynamic), so a pass compiles once per grad mode; torch.compile's
        default compiled the first shape static, then again dynamic at the next micro-batch shape (each a full
        inductor compile, 20-40 s for a 0.5B model on a cold H200). Marked dims are not duck-sized with the
        model's own. Compiled layers are dynamic by their own compile (flowrl.engines.train.regional_compile)."""
        if self._whole:
            for value in inputs.values():
                if isinstance(value, torch.Tensor):
                    for dim in range(min(value.dim(), 2)):
                        torch._dynamo.maybe_mark_dynamic(value, dim)
        return inputs

    def _step(self, mini: TensorDict, loss_fn: LossFn, temperature: float, micro_batch_size: int,
              sums: dict[str, list], old_from_current: bool = False) -> float | None:
        """One optimizer step on a mini-batch; the grad norm, or None when the step was skipped."""
        groups = self._micro_batches(mini, micro_batch_size, self.max_tokens)
        micro = [mini[rows] for rows in groups]
        weights = [float(loss_fn.weight(mb)) for mb in micro]
        total = all_reduce_sum(sum(weights), self.device, self.sharded)
        if total <= 0:
            return None
        # what needs the host is read before the mini-batch moves in one go: no device sync per micro-batch
        spans = [used_columns(mb) for mb in micro]
        samplings = [RowSampling.of(mb, temperature) for mb in micro]
        self.optimizer.zero_grad(set_to_none=True)
        on_device = mini.to(self.device)
        for mb, span, sampling, weight in zip([on_device[rows] for rows in groups], spans, samplings, weights):
            out = self._outputs(mb, temperature, tuple(loss_fn.needs), span=span, sampling=sampling)
            if weight == 0:  # keep FSDP's collectives in step with the other ranks; no NaN from 0/0
                sum(value.sum() for value in out.values()).mul(0.0).backward()
                continue
            if old_from_current:
                mb = mb.clone(False)
                mb.set("old_logprobs", out["logprobs"].detach(), inplace=False)
            loss, metrics = loss_fn(out, mb)
            share = 1.0 if loss_fn.combine == "sum" else weight / total
            (loss * (share * self.world_size)).backward()
            for key, value in metrics.items():  # summed where they are; read once, after the update
                entry = sums.setdefault(key, [0.0, 0])
                entry[0] = entry[0] + (value.detach() if isinstance(value, torch.Tensor) else value)
                entry[1] += 1
        return self._clip_and_step()

    def _clip_and_step(self) -> float | None:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if isinstance(norm, DTensor):  # FSDP2: a partial norm over shards; reduce it across ranks
            norm = norm.full_tensor()
        if not math.isfinite(norm.item()):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm)
        if self.offload_optimizer:  # AdamW's moments come to the device for the step only
            move_optimizer_state(self.optimizer, self.device)
        self.optimizer.step()
        # the gradients go at once, not at the next update's start: a colocated vLLM wakes between the two, and a
        # 7B shape's 15 GiB of gradients beside it ran an H100 out of memory (the planner counts none there)
        self.optimizer.zero_grad(set_to_none=True)
        if self.offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")
        self.scheduler.step()
        return norm.item()

    def _micro_batches(self, batch: TensorDict, micro_batch_size: int, max_tokens: int) -> list[torch.Tensor]:
        """Row indices of each micro-batch: `max_tokens` per micro-batch when set (as many on every rank), else
        `micro_batch_size` rows in `_order`."""
        if max_tokens:
            agree = functools.partial(all_reduce_max, device=self.device, sharded=self.sharded)
            return budget_micro_batches(batch, max_tokens, packed=self.packing, agree=agree)
        return list(self._order(batch).split(micro_batch_size))

    def _order(self, batch: TensorDict) -> torch.Tensor:
        """Rows longest first (with `by_length`), so each micro-batch's padding trims away; the loss is a
        weighted sum over micro-batches, so their makeup leaves the step unchanged."""
        if not self.by_length:
            return torch.arange(batch.batch_size[0])
        lengths = batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)
        return torch.argsort(lengths.cpu(), descending=True, stable=True)


def _check_kind(kind: str) -> None:
    if kind not in ("actor", "critic", "reward"):
        raise ValueError(f"kind must be 'actor', 'critic' or 'reward', got {kind!r}")


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")

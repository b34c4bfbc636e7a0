"""What HFTrainEngine reads and writes of its weights and training state: the full weights (a weight sync, an
export), this rank's FSDP2 shards (the reshard), the LoRA adapter, sharded checkpoints and the HF export.

A base of flowrl.engines.train.hf_engine.HFTrainEngine, which sets what these read: `model` (the module, FSDP2
sharded where `sharded`), `optimizer`, `scheduler`, `lora`, `device`, `offload_optimizer` and
`hyperparameters` (the settings a resumed run keeps over the checkpoint's).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from flowrl.engines.models.folders import atomic_dir
from flowrl.engines.train import lora as lora_utils, sharded_checkpoint
from flowrl.engines.train.fsdp import full_tensors, move_optimizer_state
from flowrl.engines.weights.reshard import local_shards
from flowrl.engines.weights.reshard_sync import WeightShards, model_heads


class TrainEngineState:
    """Weights and training state in and out of a train engine (see the module docstring)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    lora: bool
    sharded: bool
    device: torch.device
    offload_optimizer: bool
    hyperparameters: dict[str, Any]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters as CPU copies, on every rank (collective when sharded); merged under LoRA."""
        if self.lora:
            return {key: value.to("cpu", copy=True) for key, value in self.named_full_tensors()}
        if not self.sharded:
            return {key: value.detach().to("cpu", copy=True) for key, value in self.model.state_dict().items()}
        # cpu_offload=True would leave every rank but 0 with an empty dict; each rank needs the weights.
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {key: value.detach().cpu() for key, value in state.items()}

    def named_full_tensors(self, merge: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Each state-dict entry unsharded on this engine's device, one at a time (a streamed weight sync reads
        these); collective when sharded, so every rank iterates them all. Under LoRA, the base model's
        entries with the adapters merged (`merge`=False: the peft model's own entries)."""
        tensors = full_tensors(self.model, self.device if self.sharded else None)
        return lora_utils.merged(tensors, lora_utils.scaling(self.model)) if self.lora and merge else tensors

    def weight_shards(self) -> WeightShards | None:
        """This rank's FSDP2 shards of each entry, for a sync that moves each rank only what it keeps
        (flowrl.engines.weights.reshard_sync); None where the sync must gather: unsharded, or LoRA (merged weights
        exist only whole)."""
        if not self.sharded or self.lora:
            return None
        entries = [(name, tuple(t.shape), t.dtype) for name, t in self.model.state_dict().items()]
        return WeightShards(entries, local_shards(self.model), *model_heads(self.model.config), self.device)

    def save_adapter(self, folder: str) -> str:
        """The LoRA adapter in peft's format to `folder`, on every rank (collective when sharded)."""
        if not self.lora:
            raise ValueError("this train engine has no LoRA adapter to save (its lora_rank is 0)")
        tensors = lora_utils.adapter_tensors(self.named_full_tensors(merge=False))
        return str(lora_utils.save_adapter(self.model, tensors, folder))

    def save(self, path: str) -> None:
        """Model (under LoRA: the adapters only), optimizer and scheduler state to folder `path`: every rank
        writes its own shards (collective), and the folder appears whole or not at all."""
        sharded_checkpoint.save(path, self.model, self.optimizer, self.scheduler, trainable_only=self.lora)

    def load(self, path: str) -> None:
        """Restores what save() wrote, at any world size (collective)."""
        sharded_checkpoint.load(path, self.model, self.optimizer, self.scheduler, trainable_only=self.lora)
        if self.offload_optimizer:
            move_optimizer_state(self.optimizer, "cpu")
        self._apply_hyperparameters()

    def _apply_hyperparameters(self) -> None:
        """After loading a checkpoint, this engine's own settings win over the saved ones (a resumed run with a
        new lr trains with it); the schedule's position is the checkpoint's."""
        h = self.hyperparameters
        self.scheduler.base_lrs = [h["lr"]] * len(self.optimizer.param_groups)
        factors = [fn(self.scheduler.last_epoch) for fn in self.scheduler.lr_lambdas]
        for group, factor in zip(self.optimizer.param_groups, factors):
            group.update(initial_lr=h["lr"], lr=h["lr"] * factor, weight_decay=h["weight_decay"], betas=h["betas"],
                         eps=h["eps"])
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def save_pretrained(self, path: str, tokenizer=None) -> None:
        """Exports full HF weights (and the tokenizer, if given) to folder `path`; rank 0 writes. Under LoRA the
        base model with the adapters merged."""
        if self.lora:
            model, state = self.model.get_base_model(), self.full_state_dict()
        else:
            model = self.model
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if (dist.get_rank() if self.sharded else 0) == 0:
            with atomic_dir(path, marked=True) as tmp:
                model.save_pretrained(tmp, state_dict=state)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        if self.sharded:
            dist.barrier()

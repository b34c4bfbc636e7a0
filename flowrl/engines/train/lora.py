"""LoRA through peft: adapters on the actor's linear layers; only they train, checkpoint and sync.

- `apply` wraps a causal LM with peft's get_peft_model (rank, alpha, target module names); the base
  weights are frozen, so the optimizer, gradients and checkpoints hold the adapters only.
- `merged` turns the wrapped model's tensors (a stream of (name, tensor), as the weight sync reads them)
  into the base model's: W + alpha / rank * B @ A for each adapted linear layer, under the base model's
  names. Computed from the tensors: the trained module is never merged in place. This is what a rollout
  copy in transformers loads and what an exported Hugging Face folder holds.
- `save_adapter` writes the adapter in peft's format (adapter_config.json, adapter_model.safetensors):
  what vLLM loads as a LoRARequest.
- `BaseModelEngine` is the reference policy: the actor's own module with its adapters disabled
  (peft's disable_adapter), so no second copy of the weights is loaded.
"""

from __future__ import annotations

import pathlib
from typing import Any, Iterable, Iterator

import torch

INSTALL = "pip install -e '.[lora]'"
PREFIX = "base_model.model."  # where peft puts the wrapped model's names
ADAPTER = "default"


def apply(model: torch.nn.Module, rank: int, alpha: float, targets: list[str], field: str) -> Any:
    """`model` with LoRA adapters of `rank` on the linear layers named `targets`; a name no linear layer has is a
    ValueError naming `field`."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError(f"LoRA needs peft: {INSTALL}", name="peft") from err
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear)})
    unknown = [name for name in targets if name not in linear]
    if unknown or not targets:
        raise ValueError(f"{field}: {unknown[0] if unknown else '[]'!r} names no linear layer of "
                         f"{type(model).__name__}; its linear layers are {linear}")
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def scaling(model: Any) -> float:
    config = model.peft_config[ADAPTER]
    return config.lora_alpha / config.r


def merged(named: Iterable[tuple[str, torch.Tensor]], scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's (name, tensor) pairs from a peft model's: each adapted weight merged, names unwrapped.

    A layer's base weight waits until its lora_A and lora_B have passed (they follow it in state-dict order),
    so at most one layer's tensors are held at a time."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        name = name.removeprefix(PREFIX)
        for part, marker in (("W", ".base_layer.weight"), ("A", f".lora_A.{ADAPTER}.weight"),
                             ("B", f".lora_B.{ADAPTER}.weight")):
            if name.endswith(marker):
                layer = name[:-len(marker)]
                parts = pending.setdefault(layer, {})
                parts[part] = tensor
                if len(parts) == 3:
                    yield f"{layer}.weight", _merge(pending.pop(layer), scale)
                break
        else:
            yield name.replace(".base_layer.", "."), tensor
    assert not pending, f"adapted layers without all of weight, lora_A and lora_B: {sorted(pending)}"


def _merge(parts: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    weight = parts["W"]
    delta = parts["B"].float() @ parts["A"].float()
    return (weight.float() + scale * delta).to(weight.dtype)


def adapter_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (no adapter name: `...q_proj.lora_A.weight`)."""
    return {name.replace(f".{ADAPTER}.", "."): tensor for name, tensor in named if ".lora_" in name}


def save_adapter(model: Any, tensors: dict[str, torch.Tensor], folder: str | pathlib.Path) -> pathlib.Path:
    """The adapter in peft's format: adapter_config.json and adapter_model.safetensors (vLLM's LoRARequest)."""
    from safetensors.torch import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.peft_config[ADAPTER].save_pretrained(str(folder))
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()},
              str(folder / "adapter_model.safetensors"))
    return folder


class BaseModelEngine:
    """The reference policy under LoRA: `actor`'s module with its adapters disabled (the starting weights, since
    only the adapters train). Forward passes only."""

    def __init__(self, actor: Any):
        self.actor = actor

    @property
    def model(self) -> torch.nn.Module:
        return self.actor.model

    def forward(self, batch: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        with self.actor.model.disable_adapter():
            return self.actor.forward(batch, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        raise ValueError("the reference policy under LoRA is the actor's base model; it does not train")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {name: value for name, value in self.named_full_tensors()}

    def named_full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The base model's tensors (the adapters left out, none merged)."""
        for name, tensor in self.actor.named_full_tensors(merge=False):
            if ".lora_" not in name:
                yield name.removeprefix(PREFIX).replace(".base_layer.", "."), tensor

    def save(self, path: str) -> None:
        raise ValueError("the reference policy under LoRA has no state of its own to save")

    def load(self, path: str) -> None:
        raise ValueError("the reference policy under LoRA has no state of its own to load")

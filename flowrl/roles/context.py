"""BuildContext: what a role's `build(ctx)` may use to make itself in one process.

The runtime's role factory fills it from the run configuration; roles read
only what they need (their own section `config`, the model source, the task).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from flowrl.engines.configs import ModelSource
from flowrl.engines.models.folders import load_tokenizer
from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S


@dataclass
class UpdateSettings:
    """The sizes of one role's engine passes (its section's: flowrl.roles.configs.TrainRoleConfig.update_settings),
    as one rank takes them."""

    mini_batch_size: int = 32
    micro_batch_size: int = 16
    forward_micro_batch_size: int = 0  # rows per no-grad forward pass (logprobs, values, scores); 0: micro's

    epochs: int = 1
    balance_batch: bool = False  # rows move between the pool's ranks to even their tokens (engines.rank_balance)

    @property
    def forward_rows(self) -> int:
        return self.forward_micro_batch_size or self.micro_batch_size


@dataclass
class BuildContext:
    model: ModelSource
    sections: dict[str, Any] = field(default_factory=dict)  # each role's section (a RoleConfig), by role name
    device: str = "cpu"
    settings: UpdateSettings = field(default_factory=UpdateSettings)  # the role being built's (see `named`)
    role_settings: dict[str, UpdateSettings] = field(default_factory=dict)  # each train role's, from its section
    seed: int = 0
    task: Any = None
    reward_model: ModelSource | None = None  # a learned reward model's folder, if the run gives one
    name: str = ""  # the role being built
    config: Any = None  # its section, roles.<name> (flowrl.graph.role_config.RoleConfig)
    roles: dict[str, Any] = field(default_factory=dict)  # roles already built in this process
    shared: frozenset[str] = frozenset()  # roles that generate with their weight source's own module here
    reward_fn_timeout_s: float | None = None  # the task's reward function: a call past it stops the run
    role_models: dict[str, ModelSource] = field(default_factory=dict)  # roles.<name>.model, where a section sets one
    sync_timeout_s: float = SYNC_TIMEOUT_S  # sync.timeout_s: a weight transfer between ranks that stops fails within it

    @cached_property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.model.path)

    def named(self, name: str) -> "BuildContext":
        """This context for building role `name` (the same built-roles table and tokenizer)."""
        ctx = replace(self, name=name, config=self.sections.get(name),
                      settings=self.role_settings.get(name, self.settings))
        own = self.role_models.get(name)
        if own is not None:  # the role's own model (a reward model's, a judge's); batches keep the policy's tokens
            ctx = replace(ctx, model=own, reward_model=own)
            ctx.__dict__["tokenizer"] = self.tokenizer
        elif "tokenizer" in self.__dict__:
            ctx.__dict__["tokenizer"] = self.__dict__["tokenizer"]
        return ctx

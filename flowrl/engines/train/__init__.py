"""The train engine: FSDP2, packing, token budgets, log-probabilities, LoRA, checkpoints."""

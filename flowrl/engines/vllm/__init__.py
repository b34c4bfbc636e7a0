"""The vLLM rollout engine, in this process, and its streaming form."""

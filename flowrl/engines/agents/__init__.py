"""Multi-turn agent loops over a rollout engine (batch and asyncio)."""

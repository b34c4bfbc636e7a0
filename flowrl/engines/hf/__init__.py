"""The transformers rollout engines: `generate`, and the static-cache compiled decode."""

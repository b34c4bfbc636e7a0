"""Rollout as a service: replicas behind a router, an OpenAI-compatible endpoint, black-box agent episodes."""

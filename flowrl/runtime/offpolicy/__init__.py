"""Bounded staleness: `fl.buffer`, streamed rollouts and their runner."""

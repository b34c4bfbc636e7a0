"""Streaming rollouts: the protocol, the shared request worker, the thread streamer."""

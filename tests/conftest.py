"""Shared fixtures."""

import pytest

from flowrl.models.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny char-level Qwen2 checkpoint (built once per test session, no download)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")

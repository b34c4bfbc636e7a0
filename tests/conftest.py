"""Shared fixtures."""

import pytest
import torch

from flowrl.engines.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny char-level Qwen2 checkpoint (built once per test session, no download)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models: OpenMP threads cost more than they give, and spin badly on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

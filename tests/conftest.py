"""Shared fixtures."""

import functools
import gc
import os
import sys
from pathlib import Path

# Before torch loads, and inherited by every process a test starts (the CLI, torchrun ranks, Ray's nodes and
# workers): tiny models on one OpenMP thread each (see the one_thread fixture below).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Before anything imports Ray (it reads the variable at import), for this process and the nodes and drivers
# it starts: every local cluster of the session registers its nodes at 127.0.0.1 and listens there only
# (flowrl.runtime.ray.loopback; test_ray_loopback checks the nodes' addresses).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# One authentication mode for every cluster of the session, all at 127.0.0.1: Ray 2.60 turns token auth on
# for a new local ray.init() by writing RAY_AUTH_MODE=token into this process's environment and its cached
# config; test_multinode's two-node cluster (Ray Client) runs with it disabled, and a module that sets it back
# mid-session leaves the environment (read by the next GCS) and the cached config (the driver) disagreeing:
# "Failed to start GCS ... InvalidAuthToken".
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Collection imports every library the tests use (torch, transformers, vLLM, Ray: over a million objects), and
# the cycle collector's full passes over them as they pile up are ~15% of an import's time; off until collection
# ends (pytest_collection_finish collects once and freezes the heap).
gc.disable()

import pytest  # noqa: E402
import torch  # noqa: E402

from flowrl.engines.models.tiny_model import build_tiny_model


def pytest_collection_modifyitems(items):
    """test_multinode's two-node cluster ends the session's local one (ray_local): its tests run last, so the
    local cluster starts once, not again for the Ray modules after it (~5-10 s on 2 cores)."""
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "") == "test_multinode")


def pytest_collection_finish(session):
    """Every library the tests use is imported by now and stays for the session: its half a million objects
    leave the cycle collector's sight (gc.freeze), so a full collection scans only what the tests make. vLLM
    runs about seven per engine start, each 1.5 s over the imports alone on a busy 2-core machine."""
    gc.enable()  # off since this file's import
    gc.collect()
    gc.freeze()
    if not getattr(gc.unfreeze, "notes_thaws", False):
        gc.unfreeze = noting_thaws(gc.unfreeze)


THAWED: list[bool] = []  # gc.unfreeze ran since frozen_heap last froze the heap


def noting_thaws(unfreeze):
    """gc.unfreeze, noting that it ran (vLLM's shutdown and flowrl's thaw_heap call it through the module): so
    frozen_heap knows the heap was thawed at no cost, where gc.get_freeze_count() walks the whole permanent
    generation (0.07-0.12 s over the session's ~400,000 frozen objects, after each of ~1,800 tests)."""
    @functools.wraps(unfreeze)
    def thaw():
        THAWED.append(True)
        unfreeze()

    thaw.notes_thaws = True
    return thaw


@pytest.fixture(autouse=True)
def frozen_heap():
    """A vLLM engine's shutdown unfreezes the whole heap (gc.unfreeze): frozen again for the next test."""
    yield
    if THAWED:
        THAWED.clear()
        gc.collect()
        gc.freeze()


@pytest.fixture(scope="session")
def ray_session():
    """Ray, shut down at the session's end (see ray_local)."""
    ray = pytest.importorskip("ray")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(ray_session):
    """One local Ray cluster (2 CPUs, at 127.0.0.1) for the session: started by the first module that asks, kept
    for the next; its workers find the tests' helper modules (fakes, ...) on PYTHONPATH and import flowrl's with
    the cycle collector off (tests/quick_imports.py: ~1 s less per worker). A module that needs a
    cluster of its own (test_multinode) shuts it down first, and the next module asking starts it again."""
    ray = ray_session
    if not ray.is_initialized():
        path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 runtime_env={"env_vars": {"PYTHONPATH": path},
                              "worker_process_setup_hook": "quick_imports.import_flowrl_worker"})
    return ray


@pytest.fixture(scope="session")
def torchrun_parity(request, tmp_path_factory):
    """The TORCHRUN_RUNS (name -> config overrides) of every module in the session, trained in ONE launch of two
    gloo ranks (rank_parity.launch; a launch costs ~15 s of imports on 2 cores): (folder, {name: metric rows or
    error line}); run NAME's output is folder/NAME."""
    import rank_parity

    runs = {}
    modules = {item.module for item in request.session.items if getattr(item, "module", None)}
    for module in sorted(modules, key=lambda m: m.__name__):
        runs.update(getattr(module, "TORCHRUN_RUNS", {}))
    folder = tmp_path_factory.mktemp("torchrun")
    return folder, rank_parity.launch(folder, runs)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny char-level Qwen2 checkpoint (built once per test session, no download)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def gqa_model_path(tiny_model_path, tmp_path_factory):
    """The tiny model's tokenizer with a grouped-query model (4 query heads over 2 key/value heads)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from flowrl.engines.models.folders import load_tokenizer

    config = Qwen2Config(vocab_size=len(load_tokenizer(tiny_model_path)), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, attn_implementation="sdpa", tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gqa") / "model"
    Qwen2ForCausalLM(config).save_pretrained(path)
    load_tokenizer(tiny_model_path).save_pretrained(path)
    return path


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tiny models: OpenMP threads cost more than they give, and spin badly on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """After pytest's summary: triton (imported with vllm) is a nanobind module whose leak check prints ~30
    lines of "nanobind: leaked N functions/types" as the interpreter tears down its modules, a report on
    triton's bindings, not on anything the tests did; triton offers no switch for it (nanobind's
    set_leak_warnings is C++ only). At exit (after pytest has put its own stderr back) fd 2 goes to /dev/null."""
    import atexit

    if "triton" in sys.modules:
        atexit.register(quiet_stderr)


def quiet_stderr():
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)

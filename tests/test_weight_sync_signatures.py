"""Every rollout engine's `weight_sync` takes what the protocol declares, (train, timeout_s): the role calls it so
(flowrl.roles.configs), and a server engine that took only `train` failed on the device's first local run with
roles.rollout.engine=vllm_server (2026-12-06, H100: "weight_sync() takes 2 positional arguments but 3 were
given"), a path no CPU test had built."""

import importlib
import inspect
import pkgutil

import flowrl.engines
from flowrl.engines.protocols import RolloutEngine


def engine_classes() -> list[type]:
    found = {}
    for info in pkgutil.walk_packages(flowrl.engines.__path__, "flowrl.engines."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional package (vllm) missing here
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "weight_sync" in cls.__dict__ and cls is not RolloutEngine:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


def test_every_engines_weight_sync_takes_the_protocols_arguments():
    wanted = inspect.signature(RolloutEngine.weight_sync)
    classes = engine_classes()
    names = {cls.__name__ for cls in classes}
    assert {"HFRolloutEngine", "VLLMRolloutEngine", "VLLMServerEngine"} <= names, names
    for cls in classes:
        got = inspect.signature(cls.weight_sync)
        assert list(got.parameters) == list(wanted.parameters), f"{cls.__qualname__}: {got}"
        assert got.parameters["timeout_s"].default == wanted.parameters["timeout_s"].default, cls.__qualname__
        got.bind(None, object(), 5.0)  # the call the role makes


def test_every_weight_transport_declares_how_it_sends_and_receives():
    """The Ray worker reads what a transport needs from the transport (flowrl.runtime.ray.worker): whether every
    train rank sends its shards, and `receive_into(engine)`, which returns what the rollout rank logs."""
    from flowrl.engines.vllm.server_weights import ServerNcclTransport
    from flowrl.engines.weights.buckets import CollectiveTransport
    from flowrl.engines.weights.reshard_sync import ReshardTransport

    declared = {cls.__name__: cls.sends_shards for cls in (CollectiveTransport, ReshardTransport, ServerNcclTransport)}
    assert declared == {"CollectiveTransport": False, "ReshardTransport": True, "ServerNcclTransport": False}
    for cls in (CollectiveTransport, ReshardTransport, ServerNcclTransport):
        signature = inspect.signature(cls.receive_into)
        assert len(signature.parameters) == 2 and signature.return_annotation == "dict[str, float]", cls.__name__

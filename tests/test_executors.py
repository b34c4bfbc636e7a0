"""Executors and weight transports are registered components with configs: executor.name and sync.transport
pick them by name, and what differs between them is a property of the config, not an `if` in the trainer."""

import sys
from typing import ClassVar

import pytest

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.config import load_run_config
from flowrl.engines.weights.transport_configs import TRANSPORTS, CollectiveTransportConfig, TransportConfig
from flowrl.engines.weights.in_process import StreamedSync
from flowrl.runtime.executor_configs import (EXECUTORS, ExecutorConfig, LocalExecutorConfig, RayExecutorConfig,
                                      executor_config)
from fakes import ROLE_CLASSES
from test_planner_executor import INPUTS, make_roles


def test_train_executor_picks_the_registered_config_with_its_train_options(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # any `import ray` below fails: choosing imports no Ray
    local = executor_config(load_run_config(None, []))
    assert type(local) is LocalExecutorConfig and not local.uses_cluster_gpus
    ray = executor_config(load_run_config(None, ["executor.name=ray", "train.device=cuda", "executor.ship_files=false",
                                                 "executor.placement_timeout_s=5", "sync.bucket_mb=8"]))
    assert type(ray) is RayExecutorConfig and ray.uses_cluster_gpus  # the cluster's GPUs, not this process's
    assert (ray.options.ship_files, ray.options.placement_timeout_s, ray.sync.bucket_mb) == (False, 5.0, 8)
    assert not executor_config(load_run_config(None, ["executor.name=ray"])).uses_cluster_gpus  # CPU pools
    with pytest.raises(ValueError, match="executor.name: 'ray' starts its own workers from one process"):
        ray.check_world(2)
    local.check_world(2)  # torchrun runs the local executor on every rank


def test_an_executor_registered_by_a_user_is_chosen_by_name():
    class Counting(ExecutorConfig):
        OPTIONS: ClassVar[tuple[str, ...]] = ()
        built: ClassVar[list] = []

        def build(self, plan, factory, world, evaluation):
            self.built.append(plan.algorithm)
            return "an executor"

    EXECUTORS.register("counting", Counting, replace=True)
    cfg = load_run_config(None, ["executor.name=counting"])
    chosen = executor_config(cfg)
    assert type(chosen) is Counting and chosen.build(fl.compile_plan(grpo, fl.Placement.colocated(
        ("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES), None, 1, None) == "an executor"
    assert Counting.built == ["grpo"]


def test_sync_transport_picks_the_registered_config_and_says_what_it_reaches():
    assert type(TransportConfig.model_validate({"transport": "collective"})) is CollectiveTransportConfig
    assert TRANSPORTS.names() == ["auto", "collective", "in_process"]
    reach = {name: (TransportConfig.model_validate({"transport": name}).reaches(apart=False),
                    TransportConfig.model_validate({"transport": name}).reaches(apart=True))
             for name in TRANSPORTS.names()}
    assert reach == {"auto": (True, True), "collective": (False, True), "in_process": (True, False)}
    assert isinstance(TransportConfig.model_validate({}).build(apart=False), StreamedSync)
    with pytest.raises(ValueError, match=r"sync: .*transport: unknown 'rdma'; registered: \['auto', 'collective'"):
        load_run_config(None, ["sync.transport=rdma"])


def test_the_local_executor_refuses_a_transport_that_cannot_reach_its_rollout():
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    cfg = load_run_config(None, ["sync.transport=collective"])
    with pytest.raises(ValueError, match="sync.transport=collective does not fit the placement: rollout and actor "
                                         "are in one process; use auto"):
        executor_config(cfg).build(plan, None, 1, None)


def test_the_local_executor_config_builds_the_plans_roles():
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)

    class Factory:  # what a RoleFactory offers the local executor
        def per_rank(self, pool):
            return self

        def build(self, names):
            return {name: role for name, role in make_roles().items() if name in names}

    executor = executor_config(load_run_config(None, [])).build(plan, Factory(), 1, None)
    assert isinstance(executor, fl.LocalExecutor) and set(executor.roles) == {"actor", "rollout", "ref", "reward"}

"""executor.gc_freeze: the local executor freezes the process's heap after its first step and thaws it at close; the
collector's seconds are logged per node (flowrl.runtime.observe.gc_heap)."""

import gc
import weakref

import torch

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.config import load_run_config
from flowrl.data import PromptStream
from flowrl.runtime.observe import gc_heap
from flowrl.runtime.executor_configs import executor_config
from fakes import ROLE_CLASSES, FakeTokenizer, ParityTask
from test_planner_executor import INPUTS, make_roles


class Node:  # a weak-referenceable object that can sit in a reference cycle
    pass


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_the_clock_adds_up_each_collection():
    clock = gc_heap.GcClock().install()
    clock.install()  # once only
    before = clock.collections
    gc.collect()
    assert clock.collections == before + 1 and clock.seconds > 0
    gc.callbacks.remove(clock._callback)


def test_a_frozen_cycle_waits_for_the_thaw_and_later_cycles_are_collected():
    gc.unfreeze()  # conftest froze the imports (its autouse fixture freezes them again after the test)
    try:
        held = cycle()
        frozen = weakref.ref(held)
        assert gc_heap.freeze_heap() is True and gc.get_freeze_count() > 0  # the first freeze: it owns the thaw
        assert gc_heap.freeze_heap() is False  # a later one does not
        later = weakref.ref(cycle())
        del held  # garbage now, but frozen while it was alive
        gc.collect()
        assert frozen() is not None  # frozen: no collection walks it
        assert later() is None  # made after the freeze: collected as usual
    finally:
        gc_heap.thaw_heap()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert frozen() is None


def test_the_local_executor_freezes_after_its_first_step_and_thaws_at_close():
    plan = fl.compile_plan(grpo.options(group_size=4), fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS,
                           ROLE_CLASSES, {"group_size": 4})
    runs = {}
    gc.unfreeze()  # as above
    for freeze in (True, False):
        assert gc.get_freeze_count() == 0
        executor = fl.LocalExecutor(plan, make_roles(), gc_freeze=freeze)
        stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=3, seed=1)
        made_in_step = []
        original = executor.roles["reward"].fn
        executor.roles["reward"].fn = lambda *a, **k: made_in_step.append(weakref.ref(cycle())) or original(*a, **k)
        batch, logged = executor.run_step(0, stream)
        assert (gc.get_freeze_count() > 0) == freeze
        if freeze:  # the step's garbage was collected before the freeze, not frozen with the rest
            assert made_in_step and all(ref() is None for ref in made_in_step)
        second, logged = executor.run_step(1, stream)
        executor.close()
        assert gc.get_freeze_count() == 0
        gc_keys = {f"timing_s/gc/{node.name}" for node in plan.nodes}
        assert {key for key in logged if key.startswith("timing_s/gc/")} == gc_keys
        assert all(logged[f"timing_s/gc/{node.name}"] >= 0 for node in plan.nodes)
        runs[freeze] = (batch, second)
    for key in ("response_ids", "scores", "advantages"):  # the same step with and without the freeze
        assert torch.equal(runs[True][1][key], runs[False][1][key]), key
    gc.freeze()  # frozen by another owner first (vLLM at its start, the conftest): its thaw, not the executor's
    executor = fl.LocalExecutor(plan, make_roles(), gc_freeze=True)
    executor.run_step(0, PromptStream(ParityTask(), FakeTokenizer(), batch_size=3, seed=1))
    executor.close()
    assert gc.get_freeze_count() > 0


def test_train_gc_freeze_reaches_both_executors():
    for executor in ("local", "ray"):
        assert executor_config(load_run_config(None, [f"executor.name={executor}"])).options.gc_freeze is True
        assert executor_config(load_run_config(None, [f"executor.name={executor}",
                                                      "executor.gc_freeze=false"])).options.gc_freeze is False

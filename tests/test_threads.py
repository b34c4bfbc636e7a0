"""executor.cpu_threads: the thread count of torch's CPU ops, from the config, OMP_NUM_THREADS or the machine."""

import multiprocessing
import os

import pytest
import torch

import cli_process
from flowrl.config import load_run_config
from flowrl.runtime import threads, trainer


@pytest.fixture
def no_omp(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))  # a process allowed 8 cores
    return monkeypatch


def test_the_affinity_is_shared_among_the_ranks_on_the_node(no_omp):
    assert threads.cpu_threads() == 8
    no_omp.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun --nproc-per-node 2
    assert threads.cpu_threads() == 4
    assert threads.cpu_threads(ranks_on_node=3) == 2  # 8 // 3
    assert threads.cpu_threads(ranks_on_node=16) == 1  # never 0


def test_the_tiny_model_gets_one_thread_and_explicit_values_win(no_omp):
    assert threads.cpu_threads(tiny_model=True) == 1
    no_omp.setenv("OMP_NUM_THREADS", "3")
    assert threads.cpu_threads() == 3 and threads.cpu_threads(tiny_model=True) == 3  # the user's OMP_NUM_THREADS
    assert threads.cpu_threads(5) == 5  # executor.cpu_threads over everything
    no_omp.setenv("OMP_NUM_THREADS", "")  # set but empty: as unset
    assert threads.cpu_threads() == 8


def _threads_after_setup(overrides, out):
    """In a fresh process: vLLM's CPU backend, once started in a process, turns torch.set_num_threads into a
    no-op there (a test process may have run it). Forked from cli_process's server, which imported the trainer
    (never vLLM) once: a spawned process paid ~7 s of CPU in imports."""
    os.environ.pop("OMP_NUM_THREADS", None)
    trainer.setup(load_run_config(None, overrides)).executor.close()
    out.put(torch.get_num_threads())


def test_training_sets_torch_threads_from_the_config_or_the_model(tmp_path):
    context = multiprocessing.get_context(cli_process.START_METHOD)
    for extra, expected in ((["executor.cpu_threads=2"], 2), ([], 1)):  # auto: 1 for the built-in tiny model
        out = context.Queue()
        process = context.Process(target=_threads_after_setup,
                                  args=([f"train.output_dir={tmp_path}", "eval.every=0", *extra], out))
        process.start()
        assert out.get(timeout=300) == expected, extra
        process.join(timeout=60)


def test_a_negative_count_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="executor.cpu_threads"):
        load_run_config(None, ["executor.cpu_threads=-1"])

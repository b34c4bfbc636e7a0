"""The training loop: compile, build, resume, step, log, checkpoint."""

from __future__ import annotations

import os
import random
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import transformers
from tqdm import tqdm

from flowrl.config import RunConfig, refuse_contradictions, used_sections, warn_no_effect
from flowrl.data.imports import import_attribute
from flowrl.data.prompts import PromptStream
from flowrl.data.redact import redact
from flowrl.data.tasks import Task, check_task
from flowrl.engines.configs import EngineConfig
from flowrl.engines.models.folders import load_tokenizer
from flowrl.graph.algorithm import ALGORITHMS, Algorithm
from flowrl.roles.configs import RolloutConfig
from flowrl.runtime.data_tasks import eval_task, fit_prompts, run_task
from flowrl.runtime import distributed, threads
from flowrl.runtime.store import checkpoint, dumps, resume
from flowrl.runtime.observe import profiling
from flowrl.runtime.evaluation import EVAL_SEED_OFFSET, Evaluator, eval_plan, plays_episodes, sample_count
from flowrl.runtime.executor import Executor
from flowrl.runtime.executor_configs import executor_config
from flowrl.runtime.observe.loggers import Loggers, open_loggers, trim_metrics
from flowrl.runtime.layout.memory_check import check_run
from flowrl.runtime.layout.planning import make_plan
from flowrl.runtime.layout.plan_record import PlanRecord
from flowrl.runtime.store.run_lock import RunLock
from flowrl.runtime.shutdown import Shutdown, Stopped
from flowrl.runtime.factory import make_factory, model_path

SHOWN = {"reward/mean": "reward", "eval/reward/mean": "eval", "actor/pg_loss": "pg_loss", "critic/vf_loss": "vf_loss",
         "response_length/mean": "len", "timing_s/step": "s/step"}


def resolve_algorithm(name: str) -> Algorithm:
    """A registered name ("grpo", see flowrl.graph.algorithm.ALGORITHMS), "package.module:attribute" (a module
    in the working folder is found too) or "path/to/file.py:attribute" (flowrl.data.imports)."""
    import flowrl.algorithms  # noqa: F401 (the prebuilt ones register themselves in ALGORITHMS)

    if name in ALGORITHMS:
        algo = ALGORITHMS.get(name)
    else:
        algo = import_attribute(name, "algorithm: ", ALGORITHMS.names())
    if not isinstance(algo, Algorithm):
        raise ValueError(f"algorithm: {name!r} is a {type(algo).__name__}, not an @flowrl.graph.algorithm")
    return algo


@dataclass
class Session:
    """Everything one run holds, built before the first step."""

    cfg: RunConfig
    algo: Algorithm
    executor: Executor
    stream: PromptStream
    evaluate: Evaluator | None
    model_path: Path
    start: int
    main: bool
    loggers: Loggers | None = None  # train.loggers, opened on rank 0 when the loop starts

    @property
    def out(self) -> Path:
        return Path(self.cfg.train.output_dir)


def engines_run_on_pinned_cpu_kernels(cfg: RunConfig) -> bool:
    """Whether every role's engine runs under the CPU kernels the quick start pins (each engine config declares
    it: `runs_on_pinned_cpu_kernels`; vLLM's at tensor_parallel_size above 1 does not)."""
    engines = (getattr(cfg.section(name), "engine", None) for name in cfg.roles)
    return all(engine.runs_on_pinned_cpu_kernels() for engine in engines if isinstance(engine, EngineConfig))


def setup(cfg: RunConfig, algo: Algorithm | None = None, task: Task | None = None) -> Session:
    """Compile (no model loaded yet), build the roles, resume; the first graph or config error stops here.

    `algo` and `task` override cfg.algorithm and cfg.task.name with objects (for use from Python).
    """
    algo = algo or resolve_algorithm(cfg.algorithm)
    task = check_task(task, "task") if task is not None else run_task(cfg)
    runner = executor_config(cfg)
    cluster_gpus = runner.uses_cluster_gpus  # the GPUs are the cluster's, not this process's
    if cfg.train.device == "cuda" and not cluster_gpus and not torch.cuda.is_available():
        raise ValueError("train.device: 'cuda', but torch sees no CUDA device here")
    distributed.check_rendezvous(cfg.executor.rendezvous_timeout_s)
    if cfg.model.path is None and cfg.train.device == "cpu" and engines_run_on_pinned_cpu_kernels(cfg):
        threads.pin_cpu_kernels()  # the quick start: the same figures on x86 CPUs
    threads.set_cpu_threads(cfg.executor.cpu_threads, tiny_model=cfg.model.path is None)  # before any model loads
    rank, world = distributed.setup("cpu" if cluster_gpus else cfg.train.device, cfg.executor.node_timeout_s)
    runner.check_world(world)
    plan = make_plan(cfg, algo, task, world, gpus=runner.cluster_gpus() if cluster_gpus and cfg.placement == "auto"
                     else None)
    cfg.check_roles(plan.specs)
    warn_no_effect(cfg, used_sections(plan.specs))
    runner.warn_no_effect(cfg)
    refuse_contradictions(cfg)
    envs = [name for name, spec in plan.specs.items()
            if isinstance(section := cfg.section(name, spec), RolloutConfig) and section.env is not None]
    if envs and not plays_episodes(plan):
        warnings.warn(f"roles.{envs[0]}.env has no effect: algorithm {algo.name!r} never calls {envs[0]}.interact",
                      stacklevel=2)
    found = resume.find(cfg)  # before any model is built: a refused resume changes nothing on disk
    _check_writable(Path(cfg.train.output_dir))
    _seed(cfg.train.seed)
    transformers.utils.logging.disable_progress_bar()
    path = model_path(cfg, task) if rank == 0 else None
    distributed.barrier()  # rank 0 builds the tiny model once; the others then load it
    path = path or model_path(cfg, task)
    check_run(cfg, plan, path, runner.gpu_bytes)  # on CUDA: the planner's memory model judges the layout
    local, tokenizer = _per_rank_config(cfg, world), load_tokenizer(path)
    fit_prompts(cfg, tokenizer, task, _context(path))  # data sets: over-long prompts dropped or refused
    evaluation = eval_plan(plan, task, cfg.role_classes(algo.roles), graph=algo.evaluation) \
        if cfg.eval.every else None
    factory = make_factory(local, plan, task, path, extra=evaluation.specs if evaluation else None)
    executor = runner.build(plan, factory, world, evaluation)
    try:
        deadline = cfg.data.reward_fn_timeout_s  # a task's example() has its reward's
        stream = PromptStream(task, tokenizer, local.train.batch_size, seed=cfg.train.seed, rank=rank,
                              world_size=world, chat_template=cfg.task.chat_template, example_timeout_s=deadline)
        evaluate = None
        if evaluation is not None:
            eval_source, eval_size = eval_task(task, local.eval.prompts, world)
            eval_stream = PromptStream(eval_source, tokenizer, eval_size, rank=rank, world_size=world,
                                       seed=cfg.train.seed + EVAL_SEED_OFFSET, chat_template=cfg.task.chat_template,
                                       example_timeout_s=deadline)
            evaluate = Evaluator.build(executor, evaluation, next(eval_stream),
                                       sample_count(cfg.eval.samples, eval_size * world), task,
                                       cfg.role_classes(algo.roles))
        start = resume.restore(found, executor, stream, main=rank == 0) if found else 0
    except BaseException:
        executor.close()
        raise
    return Session(cfg, algo, executor, stream, evaluate, path, start, main=rank == 0)


def _context(path: Path) -> int | None:
    """The model's context in tokens (its config's max_position_embeddings), None where it gives none."""
    return getattr(transformers.AutoConfig.from_pretrained(str(path), local_files_only=True),
                   "max_position_embeddings", None)


OnStep = Callable[[int, dict[str, float]], None]


def train(cfg: RunConfig, algo: Algorithm | None = None, progress: bool = True,
          on_step: OnStep | None = None, task: Task | None = None) -> list[dict[str, float]]:
    """Run cfg.train.steps steps (resuming if a checkpoint exists); returns this run's metrics per step.

    The output folder is locked while it runs (flowrl.runtime.store.run_lock); SIGTERM and SIGINT stop it after the
    step in progress, with a checkpoint (flowrl.runtime.shutdown: raises Stopped)."""
    _check_writable(Path(cfg.train.output_dir))
    lock = RunLock(cfg.train.output_dir).acquire() if os.environ.get("RANK", "0") == "0" else None
    try:
        with Shutdown(cfg.checkpoint.shutdown_timeout_s) as shutdown:
            s = setup(cfg, algo, task)
            try:
                return _loop(s, progress, on_step, shutdown)
            finally:
                s.executor.close()
                if s.loggers is not None:
                    s.loggers.close()
    finally:
        if lock is not None:
            lock.release()


def _loop(s: Session, progress: bool, on_step: OnStep | None, shutdown: Shutdown) -> list[dict[str, float]]:
    cfg = s.cfg
    if s.main:
        trim_metrics(s.out / "metrics.jsonl", s.start)
    # disable=None: a bar on a terminal only, so logs written to a file hold the step lines, not bar fragments
    bar = tqdm(range(s.start, cfg.train.steps), initial=s.start, total=cfg.train.steps,
               disable=None if progress and s.main else True, desc=s.algo.name, dynamic_ncols=True)
    if s.main:
        s.loggers = open_loggers(cfg.train.loggers, s.out, redact(cfg.model_dump(mode="json")),
                                 write=bar.write if progress else None, line=_format)
    dumper = dumps.from_config(cfg.debug, s.out, s.model_path)
    profiler = profiling.from_config(cfg.debug, s.out, cfg.train.device)
    if s.start == 0 and s.evaluate is not None:
        _log(s, bar, {**_evaluate(s, 0, dumper), "step": 0}, progress)
    history: list[dict[str, float]] = []
    predicted = cfg.plan.predicted
    record = PlanRecord(predicted, s.out, cfg.train.device, s.main) if predicted is not None else None
    for step in bar:
        profiler.begin(step + 1)
        batch, logged = s.executor.run_step(step, s.stream)
        profiler.end(step + 1, logged)
        dumps.rollouts(dumper, cfg.debug, batch, step + 1)
        logged = distributed.mean_over_ranks(logged)
        if s.evaluate is not None and _eval_due(cfg, step + 1):
            logged.update(_evaluate(s, step + 1, dumper))
        logged["step"] = step + 1
        if record is not None:
            record.step(logged, history)
        history.append(logged)
        _log(s, bar, logged, progress)
        if on_step is not None:
            on_step(step + 1, logged)
        if cfg.checkpoint.export and step + 1 == cfg.train.steps:
            _export(s)  # before the last checkpoint: a run killed in between redoes the last step and exports
        if _due(cfg, step + 1):
            _save(s, step + 1)
        if step + 1 < cfg.train.steps and shutdown.requested():  # collective: the ranks stop at one step
            where = _save(s, step + 1) if not _due(cfg, step + 1) else checkpoint.step_dir(s.out / "checkpoints",
                                                                                            step + 1)
            raise Stopped(f"stopped by {shutdown.name or 'a signal'} after step {step + 1}; checkpoint {where}; "
                          f"resume with train.output_dir={s.out}", shutdown.signum or 15)
    return history


def _save(s: Session, step: int) -> Path:
    saved = checkpoint.save(s.out / "checkpoints", step, s.executor.train_engines(),
                            {"stream": s.stream.state(), "versions": s.executor.versions,
                             "config": redact(s.cfg.model_dump(mode="json"))},  # no token in state.json
                            keep=s.cfg.checkpoint.keep, is_main=s.main)
    distributed.barrier()
    return saved


def _export(s: Session) -> None:
    """The exported roles' models as Hugging Face folders: final/, or final/<role> when several are."""
    exported = s.executor.plan.exported()
    for role in exported:
        path = s.out / "final" if len(exported) == 1 else s.out / "final" / role
        s.executor.save_pretrained(role, str(path), load_tokenizer(s.model_path))


def _evaluate(s: Session, step: int, dumper: dumps.Dumps | None = None) -> dict[str, float]:
    logged = s.evaluate(step)
    if dumper is not None and s.cfg.debug.dump_eval:
        dumper.write("eval", s.evaluate.last_batch, step)
    return distributed.mean_over_ranks(logged)


def _eval_due(cfg: RunConfig, step: int) -> bool:
    return step == cfg.train.steps or step % cfg.eval.every == 0


def _per_rank_config(cfg: RunConfig, world: int) -> RunConfig:
    """Prompt counts are global in the config; each rank draws its share (the update's batch sizes are split
    by the role factory: RoleFactory.per_rank, as in a Ray pool)."""
    if world == 1:
        return cfg
    t, e = cfg.train, cfg.eval
    train = t.model_copy(update={"batch_size": distributed.per_rank(t.batch_size, world, "train.batch_size")})
    evaluation = e.model_copy(update={"prompts": distributed.per_rank(e.prompts, world, "eval.prompts")})
    return cfg.model_copy(update={"train": train, "eval": evaluation})


def _log(s: Session, bar: tqdm, logged: dict[str, float], progress: bool) -> None:
    """Rank 0 hands the row to train.loggers (metrics.jsonl, the step line, ...) and updates the bar."""
    if not s.main:
        return
    s.loggers.log(logged)
    bar.set_postfix({short: f"{logged[k]:.3g}" for k, short in SHOWN.items() if k in logged})


def _due(cfg: RunConfig, step: int) -> bool:
    every = cfg.checkpoint.every
    return step == cfg.train.steps or (every > 0 and step % every == 0)


def _check_writable(folder: Path) -> None:
    """The output folder exists or can be made, and takes files: checked before any model is built. The probe
    file has a name of its own, so the ranks of one run can check the same folder at once."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".flowrl_write_check"):
            pass
    except OSError as err:
        raise ValueError(f"train.output_dir {str(folder)!r}: cannot write there ({err.strerror or err})") from None


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


LINE = ("eval/reward/mean", "reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/clipfrac", "actor/grad_norm",
        "critic/vf_loss", "response_length/mean", "sampling/groups", "actor/sft_loss", "eval/sft/loss",
        "rm/bt_loss", "rm/accuracy", "eval/rm/accuracy")


def _format(logged: dict[str, float]) -> str:
    body = " ".join(f"{k}={logged[k]:.4g}" for k in LINE if k in logged)
    timing = f" time={logged['timing_s/step']:.2f}s" if "timing_s/step" in logged else ""
    return f"step {int(logged['step'])}: {body}{timing}"

"""What a new user (often coming from verl) types and expects: bare key=value overrides, `flowrl algorithms`,
`file.py:Class` tasks and modules beside the user, wandb online on request, engine options in `flowrl config`,
an exported tokenizer the size of the model's vocabulary, and one clean line where libraries print noise."""

import sys
import warnings

import pytest

from flowrl import cli
from flowrl.config import load_run_config, warn_no_effect
from flowrl.data.tasks import make_task
from flowrl.graph.algorithm import ALGORITHMS

pytestmark = pytest.mark.filterwarnings("error::FutureWarning")  # flowrl's deprecations: none from its own code

TASK_FILE = '''
from dataclasses import dataclass


@dataclass
class OnePlusOne:
    meta_keys: tuple = ("answer",)
    chars: str = "0123456789+="

    def example(self, seed, index):
        return "1+1=", {"answer": "2"}

    def reward(self, responses, meta):
        return [float(r.startswith("2")) for r in responses]
'''


def test_bare_key_value_words_are_overrides_like_set():
    args = cli.parse(["train", "ppo", "train.steps=3", "--set", "train.seed=5", "algo.clip=0.1"])
    cfg = cli.config_from_args(args)
    assert (args.algorithm, cfg.algorithm, cfg.train.steps, cfg.train.seed, cfg.algo) == \
        ("ppo", "ppo", 3, 5, {"clip": 0.1})
    default = cli.parse(["plan", "train.steps=3"])  # no algorithm named: the default one, not "train.steps=3"
    chosen = cli.config_from_args(default)  # (args.algorithm stays None: a --config file's algorithm may name it)
    assert (default.algorithm, chosen.algorithm, chosen.train.steps) == (None, "grpo", 3)


def test_other_unknown_words_still_fail_naming_them(capsys):
    with pytest.raises(SystemExit) as done:
        cli.parse(["train", "grpo", "--stepz", "3"])
    assert done.value.code == 2 and "unrecognized arguments: --stepz 3" in capsys.readouterr().err


def test_flowrl_algorithms_lists_every_registered_one_with_its_summary(capsys):
    assert cli.main(["algorithms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ALGORITHMS.names()
    grpo = next(line for line in lines if line.startswith("grpo "))
    # algorithms/grpo.py's docstring, to its first full stop
    assert grpo.split(None, 1)[1] == ("GRPO (DeepSeekMath): group-normalized scores, a symmetric clip, KL to the "
                                      "reference as a loss")


def test_flowrl_config_lists_every_registered_engines_options(capsys):
    assert cli.main(["config"]) == 0
    out = capsys.readouterr().out
    assert "roles.rollout.micro_batch_size" in out  # the default engine, hf
    assert "# roles.rollout.engine=vllm" in out and "roles.rollout.gpu_memory_utilization" in out
    assert "# roles.rollout.engine=hf_static" in out and "roles.rollout.compile " in out


def test_task_from_a_file_path(tmp_path):
    (tmp_path / "my_tasks.py").write_text(TASK_FILE)
    task = make_task(f"{tmp_path}/my_tasks.py:OnePlusOne", 4)
    assert task.example(0, 0) == ("1+1=", {"answer": "2"}) and task.reward(["2", "3"], [{}, {}]) == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"^task.name: cannot load '.*/absent.py:OnePlusOne': ImportError: no file"):
        make_task(f"{tmp_path}/absent.py:OnePlusOne", 4)


def test_task_module_beside_the_user_needs_no_pythonpath(tmp_path, monkeypatch):
    (tmp_path / "beside_tasks.py").write_text(TASK_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "beside_tasks", raising=False)
    assert make_task("beside_tasks:OnePlusOne", 4).example(0, 0)[0] == "1+1="
    monkeypatch.delitem(sys.modules, "beside_tasks")
    with pytest.raises(ValueError, match="No module named 'not_beside'"):
        make_task("not_beside:OnePlusOne", 4)


def test_wandb_goes_online_when_wandb_mode_says_so(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from flowrl.runtime.observe.loggers import WandbLogger

    for name in ("WANDB_API_KEY", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login either
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.raises(Exception, match="API key"):  # online needs a login; offline would not ask for one
        WandbLogger(tmp_path / "wandb", {})
    monkeypatch.setenv("WANDB_MODE", "disabled")
    WandbLogger(tmp_path / "wandb", {}).close()
    assert not list((tmp_path / "wandb").glob("wandb/offline-run-*"))


def test_node_timeout_under_the_local_executor_warns():
    from flowrl.runtime.executor_configs import executor_config

    local = load_run_config(None, ["executor.node_timeout_s=30"])
    with pytest.warns(UserWarning, match="executor.node_timeout_s has no effect: executor.name is not 'ray'"):
        executor_config(local).warn_no_effect(local)
    ray = load_run_config(None, ["executor.node_timeout_s=30", "executor.name=ray"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_no_effect(ray, ("actor", "rollout"))
        executor_config(ray).warn_no_effect(ray)


def test_the_tiny_models_tokenizer_has_the_models_vocabulary_size(tiny_model_path, tmp_path):
    import shutil

    from transformers import AutoConfig, AutoTokenizer

    from flowrl.engines.models.folders import load_tokenizer

    exported = tmp_path / "final"  # as the trainer's export writes it: the run's tokenizer beside the weights
    load_tokenizer(tiny_model_path).save_pretrained(exported)
    shutil.copy(tiny_model_path / "config.json", exported)
    for folder in (tiny_model_path, exported):
        # AutoTokenizer loads a qwen2 folder with Qwen2Tokenizer, which added "<|endoftext|>" as unk: 15 for 14
        assert len(AutoTokenizer.from_pretrained(folder)) == AutoConfig.from_pretrained(folder).vocab_size


def test_a_critics_new_head_is_one_line_not_a_load_report(tiny_model_path, capfd):
    from flowrl.engines.models.folders import load_value_model
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no backbone weight is missing
        model = load_value_model(tiny_model_path)
    err = capfd.readouterr().err
    assert model.score.out_features == 1 and hf_logging.get_verbosity() == before
    assert "LOAD REPORT" not in err and "MISSING" not in err and "not sharded" not in err, err
    assert [line for line in err.splitlines() if line.strip() and "Loading weights" not in line] == [
        f"flowrl: value head 'score' newly initialised on {tiny_model_path}'s backbone (as a critic's is)"]


def test_flowrls_own_warnings_print_as_one_line_others_as_python_shows_them(monkeypatch):
    import flowrl.config

    monkeypatch.delenv("RANK", raising=False)
    own = (UserWarning("train.x has no effect"), UserWarning, flowrl.config.__file__, 9, "  src")
    assert cli.format_warning(*own) == "flowrl: warning: train.x has no effect\n"
    theirs = cli.format_warning(UserWarning("careful"), UserWarning, "/elsewhere/lib.py", 3, "call()")
    assert theirs == "/elsewhere/lib.py:3: UserWarning: careful\n  call()\n"
    monkeypatch.setenv("RANK", "1")  # torchrun's other ranks: rank 0 says it
    assert cli.format_warning(*own) == ""
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after the test
    assert cli.main(["plan", "executor.ship_files=false"]) == 0  # main installs it
    assert warnings.formatwarning is cli.format_warning


def test_a_finished_run_is_one_line_and_under_torchrun_no_failure(tmp_path, monkeypatch, capsys):
    from flowrl.runtime.store.resume import RunFinished

    finished = RunFinished("train.output_dir 'x' holds a finished run")
    for name in ("TORCHELASTIC_RUN_ID", "RANK"):
        monkeypatch.delenv(name, raising=False)
    assert cli.finished(finished) == cli.EXIT_FINISHED
    assert capsys.readouterr().err == "flowrl: train.output_dir 'x' holds a finished run\n"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # what torchrun sets in its ranks
    for rank, said in (("0", "flowrl: train.output_dir 'x' holds a finished run\n"), ("1", "")):
        monkeypatch.setenv("RANK", rank)
        assert cli.finished(finished) == 0 and capsys.readouterr().err == said


def test_vllms_rotary_reload_warning_is_dropped_and_no_other(monkeypatch):
    pytest.importorskip("vllm")
    import inspect
    import logging

    from vllm.model_executor.model_loader.reload import layerwise
    from flowrl.engines.vllm.rollout import RELOAD_LOGGER

    assert layerwise.logger.name == RELOAD_LOGGER  # where vLLM says it, after every weight sync
    assert 'logger.warning("%s: Failed to load weights", layer.__class__.__name__)' in inspect.getsource(layerwise)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    layerwise.logger.addHandler(handler)
    try:
        for layer in ("RotaryEmbedding", "QKVParallelLinear"):
            layerwise.logger.warning("%s: Failed to load weights", layer)
    finally:
        layerwise.logger.removeHandler(handler)
    assert seen == ["QKVParallelLinear: Failed to load weights"]

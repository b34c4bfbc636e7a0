"""No silence, no wrong exit status (issue 40.6): a reward's sys.exit(0), a deprecated key that disagrees with its
new place, a torchrun environment a rank cannot join with (said on that rank), eval_samples past the evaluation set,
max_new_tokens past the model's context, and a task's example() that never returns. Each is one line from the
real CLI, in a process of its own (tests/cli_process.py)."""

import json
import os
import warnings

import pytest

import cli_process
from flowrl.config import load_run_config
from flowrl.data.prompts import PromptStream
from flowrl.engines.models.tiny_model import build_char_tokenizer
from flowrl.runtime.evaluation import sample_count

FAST = ["eval.every=0", "checkpoint.export=false", "train.batch_size=4", "train.steps=1"]
TESTS = os.path.dirname(__file__)


def flowrl(tmp_path, *args, env=None):
    env = {**os.environ, "PYTHONPATH": TESTS, **(env or {})}
    done = cli_process.run("train", f"train.output_dir={tmp_path / 'run'}", *args, cwd=tmp_path, env=env, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.startswith("flowrl")]
    return done, lines


def test_a_reward_that_calls_sys_exit_0_is_one_line_naming_it_and_a_failure(tmp_path):
    done, lines = flowrl(tmp_path, "task.name=broken_tasks:ExitingReward", *FAST)
    assert done.returncode == 2, done.stderr  # was 0 with no output: the run looked finished
    assert len(lines) == 1 and lines[0].startswith("flowrl: error: reward function ExitingReward.reward raised "
                                                   "SystemExit: 0 (scoring "), done.stderr
    assert not (tmp_path / "run" / "final").exists()


def test_a_deprecated_key_and_its_new_place_that_disagree_are_refused_and_agreeing_ones_warn_once(tmp_path):
    with pytest.raises(ValueError, match=r"^actor.lr=0.001 and roles.actor.lr=0.002 disagree; give it once, "
                                         r"as roles.actor.lr$"):
        load_run_config(None, ["actor.lr=1e-3", "roles.actor.lr=2e-3"])
    with pytest.raises(ValueError, match=r"^data.judge_max_score=5 and roles.llm_judge.max_score=10 disagree"):
        load_run_config(None, ["data.judge_max_score=5", "roles.llm_judge.max_score=10"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_run_config(None, ["actor.lr=1e-3", "roles.actor.lr=0.001"])  # one value, spelled twice
    assert cfg.section("actor").engine.lr == 1e-3
    assert [str(w.message) for w in caught] == ["actor.lr is deprecated; use roles.actor.lr"]


@pytest.mark.parametrize("env, says", [
    ({"RANK": "1"}, "flowrl: error (rank 1): RANK=1 without WORLD_SIZE: "),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "flowrl: error (rank 1): MASTER_ADDR is not set: WORLD_SIZE=2 needs"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "flowrl: error (rank 5): RANK=5 is outside WORLD_SIZE=2: ranks are 0..1"),
])
def test_a_rank_that_cannot_join_says_so_itself(tmp_path, env, says):
    """The line was printed on rank 0 only: these ranks exited 0 (RANK=1 alone trained, unlocked) or 2 in silence."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done, lines = flowrl(tmp_path, *FAST, env={**env, "PATH": base.get("PATH", "")})
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(says), done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_eval_samples_past_the_evaluation_set_is_clamped_with_one_warning(tmp_path):
    assert sample_count(3, 4) == 3
    done, lines = flowrl(tmp_path, "eval.every=1", "eval.prompts=4", "eval.samples=100000",
                         "checkpoint.export=false", "train.batch_size=4", "train.steps=1")
    assert done.returncode == 0, done.stderr
    assert lines == ["flowrl: warning: eval.samples=100000 is more than the 4 prompts of the evaluation set; "
                     "using 4 samples per prompt"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/pass@4" in row for row in rows) and not any("eval/pass@100000" in row for row in rows)


def test_max_new_tokens_past_the_models_context_is_refused_before_any_step(tmp_path):
    done, lines = flowrl(tmp_path, "roles.rollout.max_new_tokens=100000", *FAST)
    assert done.returncode == 2 and lines == [
        "flowrl: error: roles.rollout.max_new_tokens=100000 leaves no room for a prompt in the model's context of 64 "
        "tokens (max_position_embeddings); set it below 64"], done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_a_task_example_that_never_returns_stops_at_its_deadline_naming_the_task_and_row(tmp_path):
    done, lines = flowrl(tmp_path, "task.name=broken_tasks:HangingExample", "data.reward_fn_timeout_s=1", *FAST)
    assert done.returncode == 1 and lines == [
        "flowrl: error: TimeoutError: task broken_tasks:HangingExample: example(seed=0, index=2) did not return "
        "within 1 s (data.reward_fn_timeout_s); the run stops here (rerun with --debug for the traceback)"], done.stderr


def test_a_task_example_that_raises_is_one_line_naming_the_task_and_row():
    import broken_tasks

    stream = PromptStream(broken_tasks.MissingKeyExample(), build_char_tokenizer("0123456789+="), 2, seed=3,
                          example_timeout_s=5.0)
    with pytest.raises(ValueError, match=r"^task broken_tasks:MissingKeyExample: example\(seed=3, index=0\) raised "
                                         r"KeyError: 'difficulty'$"):
        next(stream)

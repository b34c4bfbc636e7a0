"""Errors that name the file, row or parameter (issue 40.7): data files and the task API, `checkpoints/latest`
as bytes and as a folder, a cut model file, an export of a checkpoint of another model shape, a config file's
`algorithm:` against the command line's. Each is the real CLI in a process of its own (tests/cli_process.py);
each asserts the one line it prints. Before, these were `IndexError: index -1`, `KeyError: 'difficulty'`,
`too many dimensions 'str'`, loaders' tracebacks naming no file, `CheckpointException ranks:dict_keys([0])`, or
a silently replaced algorithm."""

import json
import os
import shutil

import pytest

import cli_process
from flowrl.engines.models.tiny_model import build_tiny_model

TESTS = os.path.dirname(__file__)
FAST = ["eval.every=0", "checkpoint.export=false", "train.batch_size=4", "algo.group_size=2",
        "roles.rollout.max_new_tokens=3"]


def flowrl(cwd, *args):
    """`flowrl ARGS`: the finished process and its stderr lines that start with "flowrl"."""
    env = {**os.environ, "PYTHONPATH": TESTS}
    done = cli_process.run(*args, cwd=cwd, env=env, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done, [line for line in done.stderr.splitlines() if line.startswith("flowrl")]


def train(cwd, *sets, run="run"):
    return flowrl(cwd, "train", "grpo", "--no-progress", "--output-dir", str(cwd / run),
                  *sum((["--set", s] for s in [*FAST, *sets]), []))


def row(i, **change):
    return {"data_source": "x", "prompt": [{"role": "user", "content": f"{i}+0="}],
            "reward_model": {"ground_truth": str(i)}, **change}


def jsonl(path, *rows):
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


DATA_FILES = {  # file name -> (its rows, the line after "flowrl: error: data.train_files: ")
    "not_utf8.jsonl": ([row(0), b'{"data_source": "x", "prompt": "1+\xff=", "reward_model": {"ground_truth": "1"}}'],
                       "cannot read '{f}': line 2 is not UTF-8 text (byte 0xff at column 35)"),
    "torn.jsonl": ([row(0), row(1), b'{"data_source": "x", "pro'],
                   "cannot read '{f}': line 3 is not JSON (Invalid control character at column 26)"),
    "empty_prompt.jsonl": ([row(0), row(1, prompt="")], "{f} row 1: 'prompt' is empty"),
    "no_messages.jsonl": ([row(0, prompt=[])], "{f} row 0: 'prompt' is empty"),
    "nested.jsonl": ([row(0), row(1), row(2, prompt=[[{"role": "user", "content": "1"}]])],
                     "{f} row 2: 'prompt' must be a string or a list of chat messages with 'role' and 'content'"),
    "no_truth.jsonl": ([row(0), row(1, reward_model={})],
                       "{f} row 1: 'reward_model' must be {{style, ground_truth}} with a ground_truth"),
    "bad.parquet": ([], "cannot read '{f}': ArrowInvalid: Parquet magic bytes not found in footer. Either the "
                        "file is corrupted or this is not a parquet file."),
}


@pytest.mark.parametrize("name", list(DATA_FILES))
def test_a_bad_data_file_is_one_line_naming_the_file_and_the_line_or_row(tmp_path, name):
    rows, says = DATA_FILES[name]
    path = tmp_path / name
    jsonl(path, *rows) if rows else path.write_bytes(b"PAR1 not a parquet file")
    done, lines = train(tmp_path, f"data.train_files={path}", "data.reward=exact_match", "train.steps=1")
    assert done.returncode == 2 and lines == [f"flowrl: error: data.train_files: {says.format(f=path)}"], done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_data_set_scorer_returning_words_is_one_line_naming_the_file_row_and_scorer(tmp_path):
    (tmp_path / "scorers.py").write_text("def words(**_):\n    return 'good'\n")
    jsonl(tmp_path / "t.jsonl", *(row(i) for i in range(4)))
    done, lines = train(tmp_path, f"data.train_files={tmp_path / 't.jsonl'}", "train.steps=1",
                        f"data.reward={tmp_path / 'scorers.py'}:words")
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"flowrl: error: reward function DatasetTask.reward raised ValueError: reward scorer "
                               f"'{tmp_path / 'scorers.py'}:words' failed on {tmp_path / 't.jsonl'} row "), lines
    assert "could not convert string to float: 'good'" in lines[0]


@pytest.mark.parametrize("task, says", [
    ("MissingKeyExample", "task broken_tasks:MissingKeyExample: example(seed=0, index=0) raised KeyError: "
                          "'difficulty'"),
    ("EmptyPrompt", "prompt 1 of task broken_tasks:EmptyPrompt ('') encodes to no tokens; a prompt needs at least "
                    "one"),
    ("WordReward", "reward function WordReward.reward returned list of str ('good'...); expected one number per "
                   "response (too many dimensions 'str')"),
])
def test_a_task_api_mistake_is_one_line_naming_the_task_and_the_prompt_or_function(tmp_path, task, says):
    """Were `KeyError: 'difficulty'`, `IndexError: index -1` and `too many dimensions 'str'` naming nothing."""
    done, lines = train(tmp_path, f"task.name=broken_tasks:{task}", "train.steps=1")
    assert done.returncode == 2 and lines == [f"flowrl: error: {says}"], done.stderr


def test_a_cut_model_file_is_named(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    weights = model / "model.safetensors"
    whole = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:whole // 2])  # a copy or download that stopped half-way
    done, lines = train(tmp_path, f"model.path={model}", "train.steps=1")
    header = int.from_bytes(weights.read_bytes()[:8], "little")
    assert done.returncode == 2 and lines == [
        f"flowrl: error: model_path '{model}': model.safetensors is cut short: {whole // 2} bytes where its header "
        f"needs {whole} (copy it again)"], (done.stderr, header)


@pytest.fixture(scope="module")
def run_and_model(tmp_path_factory):
    """A one-step run of a tiny model of its own (model.path), signed checkpoint step_000001."""
    folder = tmp_path_factory.mktemp("named")
    model = build_tiny_model(folder / "model")
    done, _ = train(folder, f"model.path={model}", "train.steps=1")
    assert done.returncode == 0, done.stderr
    return folder, model


@pytest.mark.parametrize("pointer", ["bytes", "folder"])
def test_latest_as_bytes_or_as_a_folder_is_a_warning_naming_it_and_the_run_resumes(run_and_model, tmp_path, pointer):
    folder, model = run_and_model
    shutil.copytree(folder / "run", tmp_path / "run")
    latest = tmp_path / "run" / "checkpoints" / "latest"
    latest.unlink()
    latest.mkdir() if pointer == "folder" else latest.write_bytes(b"\xff\xfe\x00not a name")
    done, lines = train(tmp_path, f"model.path={model}", "train.steps=2")
    assert done.returncode == 0, done.stderr  # a folder there failed the save: "could not be written (Is a directory)"
    warned = f"flowrl: warning: checkpoint pointer {latest} is not a small text file naming a step folder; " \
             f"looking for the newest intact checkpoint instead"
    kept = [f"flowrl: warning: checkpoint pointer {latest} is a folder, not the file flowrl writes: left as it is, "
            f"not updated (resume finds the newest intact step folder without it)"] if pointer == "folder" else []
    moved = f"flowrl: resuming with changed settings: train.output_dir '{folder / 'run'}' -> '{tmp_path / 'run'}'"
    assert lines == [warned, moved, f"flowrl: resumed from step 1 ({tmp_path / 'run' / 'checkpoints' / 'step_000001'})",
                     *kept], done.stderr
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "manifest.json").is_file()
    assert latest.is_dir() if pointer == "folder" else latest.read_text() == "step_000002"


def test_export_of_a_checkpoint_of_another_model_shape_names_the_parameter(run_and_model, tmp_path):
    folder, model = run_and_model
    shutil.copytree(folder / "run", tmp_path / "run")
    shutil.copytree(model, tmp_path / "model_before")
    shutil.rmtree(model)
    try:
        build_tiny_model(model, hidden_size=32)  # the folder the run started from now holds another model
        done, lines = flowrl(tmp_path, "export", str(tmp_path / "run"), "--output", str(tmp_path / "out"))
    finally:
        shutil.rmtree(model)
        shutil.copytree(tmp_path / "model_before", model)
    step = tmp_path / "run" / "checkpoints" / "step_000001"
    assert done.returncode == 2 and lines == [
        f"flowrl: error: checkpoint {step}: parameter 'model.embed_tokens.weight' has shape [17, 64] in "
        f"{step / 'actor'} but [17, 32] in the model it is loaded into, built from '{model}' as its state.json says; that model is "
        f"not the one the run trained (another model shape)"], done.stderr
    assert not (tmp_path / "out").exists()


def test_a_config_files_algorithm_and_another_on_the_command_line_are_refused(tmp_path):
    (tmp_path / "ppo.yaml").write_text("algorithm: ppo\n")
    done = cli_process.run("plan", "grpo", "--config", "ppo.yaml", cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stderr == (
        "flowrl: error: algorithm: the command line names 'grpo' but ppo.yaml says algorithm: 'ppo'; name one (drop "
        "it from the file or from the command line)\n")  # was: grpo planned, the file's ppo dropped without a word
    same = cli_process.run("plan", "ppo", "--config", "ppo.yaml", cwd=tmp_path, timeout=120)
    from_file = cli_process.run("plan", "--config", "ppo.yaml", cwd=tmp_path, timeout=120)
    assert same.returncode == 0 and from_file.returncode == 0, (same.stderr, from_file.stderr)
    assert "critic.update" in same.stdout and from_file.stdout == same.stdout  # PPO's critic: the file's algorithm

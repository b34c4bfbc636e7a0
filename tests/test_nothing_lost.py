"""Nothing lost, nothing run (issue 40): export never deletes what it did not write, a killed run's scorer
processes do not keep its folder locked, a checkpoint's files are verified as they are loaded. Real processes
and real folders."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cli_process
from flowrl.config import load_run_config
from flowrl.runtime.store import checkpoint
from flowrl.runtime.store.export import export
from flowrl.runtime.store.run_lock import RunLock
from flowrl.runtime.trainer import train

TESTS = str(Path(__file__).parent)
FAST = ["eval.every=0", "checkpoint.export=false", "train.batch_size=4"]


def config(path, *overrides):
    return load_run_config(None, [f"train.output_dir={path}", *FAST, *overrides])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished one-step run (signed checkpoint, final/)."""
    folder = tmp_path_factory.mktemp("run")
    train(config(folder, "train.steps=1", "checkpoint.export=true"), progress=False)
    return folder


def tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_export_refuses_the_run_folder_a_folder_inside_or_above_it_and_a_folder_it_did_not_write(run, tmp_path):
    before = tree(run)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    for output, says in ((run, "is the run folder"), (run / "final", "is inside the run folder"),
                         (run / "checkpoints", "is inside the run folder"), (run.parent, "is above the run"),
                         (mine, "is a non-empty folder that flowrl did not export")):
        done = cli_process.run("export", str(run), "--output", str(output), cwd=tmp_path, timeout=300)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "exported" not in done.stdout
    assert tree(run) == before and (mine / "thesis.txt").read_text() == "years of work"
    first = cli_process.run("export", str(run), "--output", str(tmp_path / "out"), cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    again = cli_process.run("export", str(run), "--output", str(tmp_path / "out"), cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr  # a previous export (it has the marker) is replaced
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / ".flowrl_export").is_file()


def children(pid):
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_9_of_a_run_scoring_a_data_set_leaves_no_scorer_and_no_lock(tmp_path):
    rows = [{"data_source": "exact", "prompt": [{"role": "user", "content": f"{i}+0="}],
             "reward_model": {"ground_truth": str(i)}} for i in range(4)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "scorers.py").write_text("import time\ndef slow(**_):\n    time.sleep(0.2)\n    return 1.0\n")
    sets = [*FAST, "train.steps=400", "checkpoint.every=1", f"data.train_files={tmp_path / 't.jsonl'}",
            f"data.reward={tmp_path / 'scorers.py'}:slow", "data.reward_workers=2", "algo.group_size=2",
            "roles.rollout.max_new_tokens=3"]
    args = [sys.executable, "-m", "flowrl", "train", "grpo", "--no-progress", "--output-dir", str(tmp_path / "run"),
            *sum((["--set", s] for s in sets), [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 300
    while not (tmp_path / "run" / "checkpoints" / "latest").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    scorers = children(run.pid)
    assert scorers, "the run started no scoring process"
    run.send_signal(signal.SIGKILL)
    run.wait()
    settled = time.monotonic() + 3  # the watch polls every 0.5 s: 3 s for each scorer to end, no more
    while any(alive(pid) for pid in scorers) and time.monotonic() < settled:  # a dead pid stays dead
        time.sleep(0.1)
    left = [pid for pid in scorers if alive(pid)]
    for pid in left:  # a failing run leaves nothing behind either
        os.kill(pid, signal.SIGKILL)
    assert not left  # none outlives the trainer
    RunLock(tmp_path / "run").acquire().release()  # the folder is free: a rerun takes it


class Payload:
    """Unpickling it creates the file `path` (what an attacker's pickle would do, harmlessly)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_metadata_pickle_swapped_in_after_the_signature_check_never_runs(tmp_path, monkeypatch):
    train(config(tmp_path / "run", "train.steps=1"), progress=False)
    ran, check = tmp_path / "payload_ran", checkpoint.damage

    def check_then_swap(path):  # the attacker wins the race: the files change right after they were checked
        problem = check(path)
        (path / "actor" / ".metadata").write_bytes(pickle.dumps(Payload(ran)))
        return problem

    monkeypatch.setattr(checkpoint, "damage", check_then_swap)
    metadata = tmp_path / "run" / "checkpoints" / "step_000001" / "actor" / ".metadata"
    signed = metadata.read_bytes()
    with pytest.raises(ValueError, match=r"actor/.metadata changed after its signature was checked; refused"):
        export(tmp_path / "run", tmp_path / "out")
    metadata.write_bytes(signed)  # and again, on resume
    with pytest.raises(ValueError, match=r"actor/.metadata changed after its signature was checked; refused"):
        train(config(tmp_path / "run", "train.steps=2"), progress=False)
    assert not ran.exists() and not (tmp_path / "out").exists()


def test_links_in_a_run_folder_are_not_followed_and_an_empty_key_is_refused(tmp_path, monkeypatch):
    train(config(tmp_path / "run", "train.steps=1"), progress=False)
    secret = tmp_path / "secret_key"
    secret.write_text("TOPSECRET-do-not-print")
    latest = tmp_path / "run" / "checkpoints" / "latest"
    latest.unlink()
    latest.symlink_to(secret)
    with pytest.warns(UserWarning, match="is a symlink, which flowrl never follows") as warned:
        assert checkpoint.latest(tmp_path / "run" / "checkpoints").name == "step_000001"
    assert not any("TOPSECRET" in str(w.message) for w in warned)
    latest.unlink()
    latest.write_bytes(b"\xff\xfeTOPSECRET")  # bytes, not a name
    with pytest.warns(UserWarning, match="is not a small text file naming a step folder"):
        checkpoint.latest(tmp_path / "run" / "checkpoints")
    lock = tmp_path / "run" / ".flowrl.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(secret)
    with pytest.raises(ValueError, match=r"\.flowrl\.lock cannot be opened .*a symlink, which flowrl never follows"):
        RunLock(tmp_path / "run").acquire()
    assert secret.read_text() == "TOPSECRET-do-not-print"  # not truncated
    empty = tmp_path / "empty_key"
    empty.write_text("")
    monkeypatch.setenv("FLOWRL_KEY_FILE", str(empty))
    with pytest.raises(ValueError, match=r"signing key .*empty_key .* holds 0 bytes"):
        export(tmp_path / "run", tmp_path / "out")


def metrics(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("timing_s/")} for row in rows]


def test_a_metrics_row_cut_by_a_kill_is_dropped_with_a_warning_and_every_whole_row_is_kept(tmp_path):
    """Issue 40.8: a run killed (SIGKILL) with its last metrics row cut short: the rerun keeps every whole row,
    drops the cut bytes saying so (they were dropped without a word, and bytes of no row were lost), and its
    metrics equal an uninterrupted run's. A row is one write(), so the cut is made by hand after the kill: the
    first half of the row that came next, as a kill in the middle of writing it leaves it."""
    sets = [*FAST, "train.steps=4", "checkpoint.every=1"]
    args = ["train", "grpo", "--no-progress", *sum((["--set", s] for s in sets), [])]
    straight = cli_process.run(*args, "--output-dir", str(tmp_path / "straight"), cwd=tmp_path, timeout=300)
    assert straight.returncode == 0, straight.stderr
    run, path = tmp_path / "killed", tmp_path / "killed" / "metrics.jsonl"
    proc = cli_process.start([*args, "--output-dir", str(run)], cwd=tmp_path)
    deadline = time.monotonic() + 300
    while proc.is_alive() and (not path.exists() or len(path.read_bytes().splitlines()) < 2) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()  # SIGKILL
    proc.join()
    whole = path.read_bytes().splitlines()
    assert 2 <= len(whole) < 4, whole  # killed part-way
    cut = (tmp_path / "straight" / "metrics.jsonl").read_bytes().splitlines()[len(whole)][:40]
    with open(path, "ab") as f:
        f.write(cut)
    again = cli_process.run(*args, "--output-dir", str(run), cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr
    warned = [line for line in again.stderr.splitlines() if "cut short" in line]
    assert warned == [f"flowrl: warning: {path}: its last row was cut short (40 bytes after the last whole row and "
                      f"no newline, as a kill while writing it leaves them); dropped it: that step is redone"]
    assert metrics(run) == metrics(tmp_path / "straight")  # every whole row kept, the cut one redone once

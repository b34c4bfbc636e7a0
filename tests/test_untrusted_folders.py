"""Untrusted run folders are data, never code (issue 29.3): crafted checkpoints whose pickles or names would
run code are refused before anything loads; secrets stay out of state files and error lines; the reward
client follows no redirect."""

import json
import pickle
import sys
import warnings

import pytest
import torch

from flowrl.config import load_run_config
from flowrl.data.scoring.http_reward import HttpScorer
from flowrl.data.scoring.pool import Sample
from flowrl.data.redact import redact
from flowrl.runtime.store import checkpoint, signing
from flowrl.runtime.offpolicy.buffering import Pipeline
from flowrl.runtime.store.export import export
from flowrl.runtime.trainer import train
from reward_servers import scores, serve

pytestmark = pytest.mark.filterwarnings("error::FutureWarning")  # flowrl's deprecations: none from its own code


class Payload:
    """Unpickling it creates the file `path` (what an attacker's pickle would do, harmlessly)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def config(path, *overrides):
    return load_run_config(None, [f"train.output_dir={path}", "eval.every=0", "checkpoint.export=false",
                                  "train.batch_size=8", *overrides])


def crafted_checkpoint(run, payload_file, task="arithmetic"):
    """A step folder as an attacker would hand it over: a pickle as DCP's .metadata and a manifest whose
    sums match (anyone can compute them)."""
    step = run / "checkpoints" / "step_000001"
    (step / "actor").mkdir(parents=True)
    (step / "actor" / ".metadata").write_bytes(pickle.dumps(Payload(payload_file)))
    cfg = config(run, "train.steps=2", f"task.name={task}").model_dump(mode="json")
    (step / "state.json").write_text(json.dumps({"step": 1, "config": cfg, "stream": {}, "versions": {}}))
    (step / "manifest.json").write_text(json.dumps(checkpoint._manifest(step)))
    return step


def test_a_crafted_checkpoint_is_refused_by_resume_and_export_and_its_pickle_never_runs(tmp_path):
    ran = tmp_path / "payload_ran"
    step = crafted_checkpoint(tmp_path / "run", ran)
    with pytest.raises(ValueError, match=r"no intact checkpoint among \['step_000001'\] \(the newest: not signed"), \
            pytest.warns(UserWarning, match=r"step_000001 is refused \(not signed"):
        train(config(tmp_path / "run", "train.steps=2"), progress=False)
    with pytest.raises(ValueError, match=r"step_000001 is not usable \(not signed .* `flowrl trust "):
        export(step, tmp_path / "out")
    (step / "manifest.sig").write_text("0" * 64)  # a forged signature
    with pytest.raises(ValueError, match=r"its signature does not match your key"):
        export(step, tmp_path / "out")
    assert not ran.exists() and not (tmp_path / "out").exists()


def test_a_buffer_file_is_loaded_as_tensors_only(tmp_path):
    ran = tmp_path / "payload_ran"
    (tmp_path / "buffer.pt").write_bytes(pickle.dumps(Payload(ran)))
    with pytest.raises(ValueError, match=r"buffer.pt: not a buffer of tensors and plain values; refused"):
        Pipeline(None, dict, overlap=False).load(str(tmp_path))
    assert not ran.exists()


def test_export_imports_no_name_found_in_a_run_folder(tmp_path, monkeypatch):
    (tmp_path / "evil_task.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w')\nclass Task: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    step = crafted_checkpoint(tmp_path / "run", tmp_path / "payload_ran", task="evil_task:Task")
    checkpoint.trust(step)  # even signed, as if by this user: the name is not imported
    with pytest.raises(ValueError, match=r"names task 'evil_task:Task'; flowrl export imports no code named in a "
                                         r"run folder: pass --task evil_task:Task"):
        export(step, tmp_path / "out")
    assert "evil_task" not in sys.modules and not (tmp_path / "imported").exists()


def test_secrets_stay_out_of_state_files_and_error_lines(tmp_path):
    url = "http://alice:hunter2@127.0.0.1:9/score?token=tok123&n=1"
    assert redact(url) == "http://***@127.0.0.1:9/score?token=***&n=1"
    train(config(tmp_path, "train.steps=1", f"data.reward={url}"), progress=False)
    state = (tmp_path / "checkpoints" / "step_000001" / "state.json").read_text()
    assert "hunter2" not in state and "tok123" not in state and "http://***@127.0.0.1:9" in state
    rows = train(config(tmp_path, "train.steps=2", f"data.reward={url}"), progress=False)  # resumes: same config
    assert [row["step"] for row in rows] == [2]
    sample = Sample("x", "src", "x", "x", None, "row 0")
    with pytest.raises(ValueError) as failed:
        HttpScorer(url, timeout_s=1, attempts=1).score([sample])
    assert "hunter2" not in str(failed.value) and "tok123" not in str(failed.value)


def test_the_reward_client_follows_no_redirect(tmp_path):
    reached = []

    def elsewhere(handler):
        reached.append(handler.path)
        scores([1.0])(handler)

    with serve(elsewhere) as other:
        def redirect(handler):
            handler.send_response(307)
            handler.send_header("Location", other.replace("127.0.0.1", "localhost"))
            handler.send_header("Content-Length", "0")
            handler.end_headers()

        with serve(redirect) as url:
            with pytest.raises(ValueError, match=r"HTTP 307 a redirect to http://localhost:\d+/score, not followed"):
                HttpScorer(url).score([Sample("x", "src", "x", "x", None, "row 0")])
    assert reached == []


def test_the_key_is_made_once_and_private(tmp_path, monkeypatch):
    monkeypatch.setenv(signing.KEY_ENV, str(tmp_path / "cfg" / "key"))
    first = signing.sign(b"manifest")
    assert (tmp_path / "cfg" / "key").stat().st_mode & 0o777 == 0o600
    assert signing.sign(b"manifest") == first and signing.verify(b"manifest", first)
    assert not signing.verify(b"manifest!", first)


def test_a_secret_on_the_command_line_stays_out_of_the_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from flowrl.runtime.observe.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(sys, "argv", ["flowrl", "train", "--set", "data.reward=http://u:hunter2@127.0.0.1:9/s"])
    logger = WandbLogger(tmp_path / "wandb", redact({"data": {"reward": "http://u:hunter2@127.0.0.1:9/s"}}))
    logger.log({"step": 1, "reward/mean": 0.5})
    logger.close()
    files = [p for p in (tmp_path / "wandb").rglob("*") if p.is_file()]
    assert files and not [p for p in files if b"hunter2" in p.read_bytes()]
    assert any(b"http://***@127.0.0.1:9/s" in p.read_bytes() for p in files)  # the config, masked


def test_export_writes_the_current_keys_and_needs_no_environment_module(tmp_path):
    """A run that named an environment module of its own exports where that module is gone, and export itself
    raises no deprecation warning (this file turns them into errors): it writes only the current keys."""
    from flowrl.engines.train.sharded_checkpoint import read_model
    from transformers import AutoModelForCausalLM

    env_file = tmp_path / "my_env.py"
    env_file.write_text("class Env:\n    pass\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the env has no effect on GRPO's graph: said, not our point
        train(config(tmp_path / "run", "train.steps=1", "checkpoint.every=1", f"roles.rollout.env={env_file}:Env"),
              progress=False)
    env_file.unlink()
    export(tmp_path / "run", tmp_path / "out")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    saved = read_model(tmp_path / "run" / "checkpoints" / "step_000001" / "actor")
    assert saved and all(torch.equal(exported[k], v) for k, v in saved.items())

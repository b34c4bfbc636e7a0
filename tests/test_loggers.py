"""train.loggers: each logger's output read back (jsonl, console, tensorboard, wandb offline, mlflow file store)."""

import json
import struct
import time

import pytest

from flowrl.config import load_run_config
from flowrl.runtime.observe import loggers as loggers_module
from flowrl.runtime.observe.loggers import open_loggers

ROWS = [{"step": 0, "eval/reward/mean": 0.25}, {"step": 1, "reward/mean": 0.5, "reward/mean#2": 1.0},
        {"step": 2, "reward/mean": 0.75}]


def write_rows(names, out, **kw):
    loggers = open_loggers(names, out, {"train": {"steps": 2}}, **kw)
    for row in ROWS:
        loggers.log(row)
    loggers.close()


def test_jsonl_and_console(tmp_path):
    lines = []
    write_rows(["jsonl", "console"], tmp_path, write=lines.append, line=lambda row: f"step {row['step']}")
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == ROWS
    assert lines == ["step 0", "step 1", "step 2"]
    write_rows(["console"], tmp_path / "quiet")  # no writer (progress off): prints nothing, fails nothing


def test_tensorboard_scalars_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_rows(["tensorboard"], tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("eval/reward/mean")] == [(0, 0.25)]


def wandb_records(path):
    """The protobuf records of a .wandb file: a 7-byte header, then 32 KiB blocks of (crc, length, type) chunks."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, block, buf = path.read_bytes(), 7, 32768, b""
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        buf, pos = buf + raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def test_wandb_offline_run_read_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_rows(["wandb"], tmp_path)
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    for _ in range(100):  # wandb's service may still be flushing the file after finish() returns
        try:
            records = list(wandb_records(runs[0]))
        except Exception:  # a record half written
            records = []
        if records and records[-1].WhichOneof("record_type") == "exit":
            break
        time.sleep(0.2)
    rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    history = [{k: v for k, v in row.items() if k == "_step" or not k.startswith("_")} for row in rows]
    assert history == [{"_step": 0, "eval/reward/mean": 0.25}, {"_step": 1, "reward/mean": 0.5, "reward/mean#2": 1.0},
                       {"_step": 2, "reward/mean": 0.75}]
    config = {i.key: i.value_json for r in records if r.WhichOneof("record_type") == "run" for i in r.run.config.update}
    assert json.loads(config["train"]) == {"steps": 2}


def test_mlflow_file_store_read_back(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    write_rows(["mlflow"], tmp_path)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.search_runs([client.get_experiment_by_name("flowrl").experiment_id])[0]
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "reward/mean_2")] == [1.0]
    assert run.info.status == "FINISHED"


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(loggers_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"train.loggers: 'wandb' needs the wandb package: pip install -e '\.\[wandb\]'"):
        open_loggers(["jsonl", "wandb"], tmp_path, {})


def test_config_accepts_known_loggers_only():
    assert load_run_config(None, ['train.loggers=["jsonl", "tensorboard"]']).train.loggers == ["jsonl", "tensorboard"]
    assert load_run_config(None, ["train.loggers=jsonl,mlflow"]).train.loggers == ["jsonl", "mlflow"]
    assert load_run_config(None, []).train.loggers == ["console", "jsonl"]
    with pytest.raises(ValueError, match=r"train.loggers.1: Input should be 'console', 'jsonl'"):
        load_run_config(None, ["train.loggers=jsonl,neptune"])


def test_a_training_run_writes_to_the_chosen_loggers(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flowrl.runtime.trainer import train

    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "train.steps=2", "eval.every=0",
                                 "train.batch_size=4", "train.loggers=jsonl,tensorboard"])
    history = train(cfg, progress=True)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["reward/mean"] == history[1]["reward/mean"]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("reward/mean")
    assert [e.step for e in scalars] == [1, 2]
    assert [e.value for e in scalars] == pytest.approx([row["reward/mean"] for row in history])
    assert "step 1:" not in capsys.readouterr().out  # no console logger: no step lines

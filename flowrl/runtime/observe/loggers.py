"""Experiment tracking: `train.loggers` picks where each step's metrics go.

Every logger takes a row of metrics with its "step" (`log(row)`) and is closed
at the end of the run. `console` prints the step line, `jsonl` appends to
output_dir/metrics.jsonl, `tensorboard` writes event files under
output_dir/tensorboard, `wandb` a run under output_dir/wandb,
offline unless WANDB_MODE says otherwise (`wandb sync` uploads an offline run later; WANDB_MODE=online logs
to the server as it trains) and `mlflow` a run in the local file store
output_dir/mlruns (`mlflow ui --backend-store-uri output_dir/mlruns`). The last
three need their package; without it the run stops before the first step with
one line naming the extra to install.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Protocol

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


class Logger(Protocol):
    def log(self, row: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _scalars(row: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k != "step"}


class ConsoleLogger:
    def __init__(self, write: Callable[[str], None] | None, line: Callable[[dict[str, float]], str]):
        self.write, self.line = write, line

    def log(self, row: dict[str, float]) -> None:
        if self.write is not None:
            self.write(self.line(row))

    def close(self) -> None:
        pass


class JsonlLogger:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, row: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        pass


def trim_metrics(path: Path, last_step: int) -> None:
    """metrics.jsonl as a run resuming from `last_step` continues it: every whole row up to that step kept, the
    rows of later steps dropped (they are redone; a run that starts anew, last_step 0, redoes them all), and a
    last row a kill cut short (no newline at the end; a kill while it was written) dropped with a warning naming
    it, so the next row does not land on its bytes. Lines flowrl did not write (not a row with a "step") are
    kept as they are, each on a line of its own."""
    if not path.is_file():
        return
    whole, _, tail = path.read_bytes().rpartition(b"\n")
    lines = whole.split(b"\n") if whole else []
    if tail and _step_of(tail) is None and tail.lstrip().startswith(b"{"):
        warnings.warn(f"{path}: its last row was cut short ({len(tail)} bytes after the last whole row and no "
                      f"newline, as a kill while writing it leaves them); dropped it: that step is redone",
                      stacklevel=2)
    elif tail:
        lines.append(tail)  # a whole row, or bytes of another writer's, given the newline it lacked
    kept = [line for line in lines
            if line.strip() and ((step := _step_of(line)) is None or 0 < last_step and step <= last_step)]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(b"".join(line + b"\n" for line in kept))
    os.replace(tmp, path)


def _step_of(line: bytes) -> int | None:
    """A metrics row's step; None for bytes that are not a row (cut short, or not flowrl's)."""
    try:
        row = json.loads(line)
        return int(row["step"]) if isinstance(row, dict) else None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        return None


class TensorBoardLogger:
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def log(self, row: dict[str, float]) -> None:
        for key, value in _scalars(row).items():
            self.writer.add_scalar(key, value, int(row["step"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, folder: Path, config: dict[str, Any], project: str = "flowrl"):
        import wandb

        from flowrl.data.redact import redact

        folder.mkdir(parents=True, exist_ok=True)
        # wandb's run metadata records the command line; one holding a secret (--set data.reward=...?token=) is
        # kept out by recording no metadata for that run
        secret_args = redact(sys.argv) != sys.argv
        self.run = wandb.init(project=project, dir=str(folder), config=config, mode=wandb_mode(),
                              reinit="create_new", settings=wandb.Settings(x_disable_meta=secret_args))

    def log(self, row: dict[str, float]) -> None:
        self.run.log(_scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


def wandb_mode() -> str:
    """WANDB_MODE (online, offline, disabled, ...) when it is set, else offline: no account needed."""
    return os.environ.get("WANDB_MODE") or "offline"


_MLFLOW_BAD = re.compile(r"[^\w\-\. /:]")


class MLflowLogger:
    def __init__(self, folder: Path, config: dict[str, Any]):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # a local folder, no database to set up
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=folder.resolve().as_uri())
        experiment = self.client.get_experiment_by_name("flowrl")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("flowrl")
        self.run_id = self.client.create_run(experiment_id).info.run_id
        self.client.log_text(self.run_id, json.dumps(config, indent=1), "config.json")

    def log(self, row: dict[str, float]) -> None:
        step = int(row["step"])
        for key, value in _scalars(row).items():  # "name#2" is no valid MLflow name: "name_2"
            self.client.log_metric(self.run_id, _MLFLOW_BAD.sub("_", key), value, step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Loggers:
    """Every chosen logger at once."""

    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers

    def log(self, row: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log(row)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def open_loggers(names: list[str], out: Path, config: dict[str, Any],
                 write: Callable[[str], None] | None = None,
                 line: Callable[[dict[str, float]], str] = json.dumps) -> Loggers:
    """The loggers `names` writing under `out`; ValueError naming the extra when a package is missing."""
    for name in names:
        package = _PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ValueError(f"train.loggers: {name!r} needs the {package} package: pip install -e '.[{name}]' "
                             f"in the flowrl checkout")
    made = {"console": lambda: ConsoleLogger(write, line), "jsonl": lambda: JsonlLogger(out / "metrics.jsonl"),
            "tensorboard": lambda: TensorBoardLogger(out / "tensorboard"),
            "wandb": lambda: WandbLogger(out / "wandb", config), "mlflow": lambda: MLflowLogger(out / "mlruns", config)}
    return Loggers([made[name]() for name in dict.fromkeys(names)])

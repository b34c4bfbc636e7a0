"""benchmarks/verl_preflight.py runs verl 0.9.1's CPU-side rollout path (config, tokenizer, dataset, agent loop,
reward, advantage, the v1 trainer's TransferQueue path, its metrics file) over the benchmark's model copy, parquet
and overrides, in verl's own packages: /tmp/verlenv, a separate environment with verl and its pins (CPU torch), the
project never imports verl. Without it these tests are skipped."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "verl_preflight.py"
VERL_PYTHON = Path("/tmp/verlenv/bin/python")
STAGES = ("imports", "config", "tokenizer", "logprobs", "dataset", "reward", "rollout", "advantage", "v1", "metrics")

pytestmark = pytest.mark.skipif(not VERL_PYTHON.exists(), reason="no verl environment at /tmp/verlenv (verl 0.9.1 "
                                                                  "and its pins, CPU torch): see verl_preflight.py")


def preflight(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--verl-python", str(VERL_PYTHON), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def check(spec: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The check half alone, on a spec the launcher wrote."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([str(VERL_PYTHON), str(SCRIPT), "--check", str(spec)], capture_output=True, text=True,
                          timeout=timeout, cwd=spec.parent, env=env)


def stage_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("preflight")]


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("preflight_fixed")
    return folder, preflight("--folder", str(folder))


def test_fixed_lengths_pass_every_stage(fixed_run):
    folder, done = fixed_run
    lines = stage_lines(done.stdout)
    assert done.returncode == 0, "\n".join(lines) + done.stderr[-3000:]
    for stage in STAGES:
        assert any(line.startswith(f"preflight: {stage}: ok") for line in lines), stage
    assert "vocabulary 151936" in lines[0]  # the 0.5B shape's tokenizer
    assert any("response lengths 256..256" in line for line in lines if line.startswith("preflight: rollout"))
    assert lines[-1].startswith("preflight: all stages passed")


def test_variable_lengths_pass_every_stage(tmp_path):
    done = preflight("--lengths", "variable", "--folder", str(tmp_path))
    lines = stage_lines(done.stdout)
    assert done.returncode == 0, "\n".join(lines) + done.stderr[-3000:]
    rollout = next(line for line in lines if line.startswith("preflight: rollout: ok"))
    assert "ending in eos" in rollout and "response lengths 256..256" not in rollout
    assert lines[-1].startswith("preflight: all stages passed")


def test_a_key_verl_lacks_fails_at_config(fixed_run):
    folder, _ = fixed_run
    spec = json.loads((folder / "spec.json").read_text())
    spec["overrides"].append("actor_rollout_ref.rollout.no_such_key=1")
    spec["v1"] = False
    (folder / "bad_key.json").write_text(json.dumps(spec))
    done = check(folder / "bad_key.json")
    assert done.returncode == 1
    assert stage_lines(done.stdout)[-1].startswith("preflight FAILED at config: ")
    assert "no_such_key" in stage_lines(done.stdout)[-1]


def test_the_devices_tokenizer_refusal_fails_at_tokenizer(fixed_run):
    """The copy as it was before "\\n" and "<|im_end|>" became added tokens: verl's Qwen token builder refuses it,
    as it did on the GPU machine at the first rollout (2026-12-06)."""
    folder, _ = fixed_run
    copy = folder / "old_copy"
    copy.mkdir()
    model = folder / "verl" / "model"
    for f in model.iterdir():
        if f.name != "tokenizer.json":
            (copy / f.name).symlink_to(f.resolve())
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] not in ("\n", "<|im_end|>")]
    (copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    spec = json.loads((folder / "spec.json").read_text())
    spec["overrides"] = [o.replace(f"model.path={model}", f"model.path={copy}") for o in spec["overrides"]]
    spec["v1"] = False
    (folder / "old_copy.json").write_text(json.dumps(spec))
    done = check(folder / "old_copy.json")
    assert done.returncode == 1
    last = stage_lines(done.stdout)[-1]
    assert last.startswith("preflight FAILED at tokenizer: ValueError: Expected Qwen newline to tokenize to one "
                           "token, got []"), last
    assert "verl/utils/tokenizer/continuous_token.py:" in last


def test_a_fused_forward_verl_does_not_patch_fails_at_logprobs(fixed_run):
    """use_fused_kernels with a backend verl's monkey patch does not know: verl skips the patch with a print, and
    its engine would then look for log_probs the plain forward never returns; the logprobs stage names it."""
    folder, _ = fixed_run
    spec = json.loads((folder / "spec.json").read_text())
    spec["overrides"] = [o for o in spec["overrides"] if "fused_kernel_options.impl_backend" not in o]
    spec["overrides"].append("actor_rollout_ref.model.fused_kernel_options.impl_backend=no_such_backend")
    spec["v1"] = False
    (folder / "bad_backend.json").write_text(json.dumps(spec))
    done = check(folder / "bad_backend.json")
    assert done.returncode == 1
    assert stage_lines(done.stdout)[-1] == "preflight FAILED at logprobs: Failed: apply_monkey_patch left " \
                                           "the forward as it was", stage_lines(done.stdout)

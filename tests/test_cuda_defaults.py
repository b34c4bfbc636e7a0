"""train.device=cuda alone picks the configuration of the H200 benchmark runs; the CPU defaults stay."""

import sys
from pathlib import Path

from flowrl.config import RunConfig, load_run_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from grpo_vs_trl import FAST_SETS  # noqa: E402


def test_cuda_alone_resolves_to_the_benchmarks_configuration():
    alone = load_run_config(None, ["train.device=cuda"])
    assert (alone.rollout.engine, alone.actor.compile) == ("hf_static", True)
    assert [alone.section(name).forward_micro_batch_size for name in ("actor", "ref", "critic")] == [128] * 3
    assert alone.model_dump() == load_run_config(None, ["train.device=cuda", *FAST_SETS]).model_dump()


def test_the_cpu_defaults_are_unchanged():
    cfg = load_run_config(None, [])
    assert cfg.model_dump() == RunConfig().model_dump()
    assert (cfg.rollout.engine, cfg.actor.compile, cfg.section("actor").forward_micro_batch_size) == ("hf", False, 0)


def test_what_a_cuda_run_sets_wins():
    cfg = load_run_config(None, ["train.device=cuda", "roles.rollout.engine=vllm", "roles.actor.compile=false",
                                 "roles.actor.forward_micro_batch_size=32"])
    assert (cfg.rollout.engine, cfg.actor.compile, cfg.section("actor").forward_micro_batch_size) == ("vllm", False, 32)
    assert (cfg.section("ref").forward_micro_batch_size, cfg.section("critic").forward_micro_batch_size) == (32, 128)
    hf_only = load_run_config(None, ["train.device=cuda", "roles.rollout.micro_batch_size=64"])  # a key of the hf engine
    assert (hf_only.rollout.engine, hf_only.rollout.micro_batch_size, hf_only.actor.compile) == ("hf", 64, True)


def test_the_cuda_preset_is_named_printed_by_flowrl_config_and_is_what_cuda_applies(capsys):
    from flowrl.cli import print_config
    from flowrl.config import PRESETS

    print_config(None)
    printed = capsys.readouterr().out
    for key, value in PRESETS["cuda"].items():
        assert f"{key} = {value!r}" in printed
    alone = load_run_config(None, ["train.device=cuda"]).model_dump()
    applied = {"roles.rollout.engine": alone["roles"]["rollout"]["engine"],
               "roles.actor.compile": alone["roles"]["actor"]["compile"],
               **{f"roles.{name}.forward_micro_batch_size": alone["roles"][name]["forward_micro_batch_size"]
                  for name in ("actor", "critic")}}
    assert applied == PRESETS["cuda"] == {"roles.rollout.engine": "hf_static", "roles.actor.compile": True,
                                          "roles.actor.forward_micro_batch_size": 128,
                                          "roles.critic.forward_micro_batch_size": 128}

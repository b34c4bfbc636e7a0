"""The train.* options that moved to their component's section (issue 42): the new keys set them, the old ones
still do for one release with one FutureWarning line, and both spellings at different values are refused."""

import warnings

import pytest

from flowrl.config import MOVED, RunConfig, load_run_config


def test_each_moved_key_lands_in_its_section_with_one_warning():
    for old, new in MOVED.items():
        section, _, field = new.partition(".")
        value = getattr(getattr(RunConfig(), section), field)  # the default: valid, so only the move is tested
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = RunConfig.model_validate({"train": {old: value}})
        assert [str(w.message) for w in caught] == [f"train.{old} is deprecated; use {new}"]
        assert getattr(getattr(cfg, section), field) == value


def test_old_and_new_key_agreeing_is_one_value_and_disagreeing_is_refused_in_one_line():
    with pytest.warns(FutureWarning, match="train.save_every is deprecated; use checkpoint.every"):
        assert load_run_config(None, ["train.save_every=3", "checkpoint.every=3"]).checkpoint.every == 3
    with pytest.raises(ValueError, match=r"^train.save_every=3 and checkpoint.every=4 disagree: .*give "
                                         r"checkpoint.every only$"):
        load_run_config(None, ["train.save_every=3", "checkpoint.every=4"])
    with pytest.raises(ValueError, match="train.executor='ray' and executor.name='local' disagree"):
        load_run_config(None, ["train.executor=ray", "executor.name=local"])


def test_the_new_keys_set_the_options_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_run_config(None, ["executor.name=ray", "executor.ship_files=false", "checkpoint.keep=3",
                                     "eval.every=0", "debug.profile_steps=[1, 2]"])
    assert (cfg.executor.name, cfg.executor.ship_files, cfg.checkpoint.keep, cfg.eval.every,
            cfg.debug.profile_steps) == ("ray", False, 3, 0, [1, 2])
    assert RunConfig(executor="ray").executor.name == "ray"  # a bare name is the executor's name
    assert not set(MOVED) & set(type(cfg.train).model_fields)  # train.* holds none of them any more

import subprocess
import sys

import pytest

from flowrl.config import load_run_config, used_sections, warn_no_effect
from flowrl.data import PromptStream
from flowrl.data.builtin.arithmetic import ArithmeticTask
from fakes import FakeTokenizer


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match=r"train\.batch_size: Input should be greater than or equal to 1"):
        load_run_config(None, ["train.batch_size=0"])
    with pytest.raises(ValueError, match=r"rollout\.temprature: Extra inputs"):
        load_run_config(None, ["roles.rollout.temprature=0.5"])
    with pytest.raises(ValueError, match=r"placement\.pools\.0\.roles"):
        load_run_config(None, ['placement={"pools": [{"name": "a", "roles": ["actr"]}]}'])


def test_overrides_parse_json_values_and_files(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"train": {"steps": 3}, "algo": {"group_size": 4}}')
    cfg = load_run_config(str(path), ["roles.rollout.temperature=0.7", "train.output_dir=out"])
    assert cfg.train.steps == 3 and cfg.rollout.temperature == 0.7 and cfg.algo == {"group_size": 4}
    assert cfg.train.output_dir == "out"


def test_arithmetic_reward_reads_the_leading_integer():
    task = ArithmeticTask(max_operand=9, format_score=0.1)
    responses = ["8", "8=", " 8+1", "83", "7", "+8", ""]
    assert task.reward(responses, [{"answer": "8"}] * 7) == [1.0, 1.0, 1.0, 0.1, 0.1, 0.0, 0.0]
    prompt, meta = task.example(seed=0, index=3)
    a, b = prompt[:-1].split("+")
    assert int(a) + int(b) == int(meta["answer"]) and task.example(0, 3) == (prompt, meta)


def test_prompt_stream_resumes_where_it_stopped_and_shards_ranks():
    task, tok = ArithmeticTask(), FakeTokenizer()
    stream = PromptStream(task, tok, batch_size=2, seed=5)
    next(stream)
    state = stream.state()
    expected = next(stream)
    resumed = PromptStream(task, tok, batch_size=2, seed=5)
    resumed.restore(state)
    assert resumed.__next__()["uid"].tolist() == expected["uid"].tolist() == [2, 3]
    rank1 = PromptStream(task, tok, batch_size=2, rank=1, world_size=2)
    assert next(rank1)["uid"].tolist() == [1, 3]


def test_values_without_effect_warn():
    cfg = load_run_config(None, ["roles.critic.lr=0.1", "model.path=/some/model", "model.tiny_num_layers=4"])
    with pytest.warns(UserWarning) as record:
        warn_no_effect(cfg, {"actor", "rollout"})
    messages = [str(w.message) for w in record]
    assert any("roles.critic.* has no effect" in m for m in messages)
    assert any("model.tiny_num_layers has no effect" in m for m in messages)


@pytest.mark.parametrize("algorithm, warned", [("rm", {"roles.critic", "roles.rollout"}), ("grpo", {"roles.critic"}),
                                               ("ppo", set())])
def test_an_engine_section_warns_only_when_no_role_builds_on_it(algorithm, warned):
    """The sections come from what each role declares it builds on: rm's learned_reward trains on actor.*."""
    import warnings
    from types import SimpleNamespace

    import flowrl.algorithms  # noqa: F401 (registers the prebuilt algorithms, whatever ran before)
    from flowrl.data.builtin.arithmetic import ArithmeticTask
    from flowrl.graph.algorithm import ALGORITHMS
    from flowrl.runtime.trainer import make_plan

    cfg = load_run_config(None, ["roles.actor.lr=0.1", "roles.critic.lr=0.1", "roles.rollout.max_new_tokens=3"])
    task = ArithmeticTask(4) if algorithm != "rm" else SimpleNamespace(meta_keys=("pair",))  # rm's data: pairs
    plan = make_plan(cfg, ALGORITHMS.get(algorithm), task)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warn_no_effect(cfg, used_sections(plan.specs))
    said = {str(w.message).split(".*")[0] for w in record if ".* has no effect" in str(w.message)}
    assert said == warned, [str(w.message) for w in record]


def test_chat_template_wraps_prompts(tiny_model_path):
    from flowrl.engines.models.folders import load_tokenizer

    tok = load_tokenizer(tiny_model_path)
    with pytest.raises(ValueError, match="task.chat_template: the tokenizer has no chat template"):
        PromptStream(ArithmeticTask(), tok, batch_size=1, chat_template=True)
    tok.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}{% if add_generation_prompt %}={% endif %}"
    tok.add_tokens(["<", ">"])
    plain, wrapped = (next(PromptStream(ArithmeticTask(), tok, 1, chat_template=c)) for c in (False, True))
    text = tok.decode(plain["prompt_ids"][0])
    assert tok.decode(wrapped["prompt_ids"][0]) == f"<{text}>="


def test_executor_is_validated_and_ray_stays_optional():
    from flowrl.runtime.executor_configs import executor_config

    with pytest.raises(ValueError, match=r"executor\.name: unknown 'dask'; registered: \[.*'local', 'ray'"):
        executor_config(load_run_config(None, ["executor.name=dask"]))
    code = "import sys, flowrl.runtime.trainer, flowrl.cli; assert 'ray' not in sys.modules, 'ray imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

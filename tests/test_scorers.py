"""Rule scorers (gsm8k strict and flexible, math-verify, exact match, your own) and the scoring pool."""

import logging
import textwrap

import pytest

from flowrl.data.scoring.scorers import extract_gsm8k, resolve, scorer_name
from flowrl.data.scoring.pool import Sample, ScoringPool


def test_gsm8k_format_gives_a_wrong_marked_answer_verls_format_score():
    from flowrl.data.scoring.scorers import resolve

    score = resolve("gsm8k_format")
    assert score("openai/gsm8k", "3 + 4 = 7\n#### 7", "7") == 1.0
    assert score("openai/gsm8k", "3 + 4 = 8\n#### 8", "7") == 0.1  # the form, not the answer
    assert score("openai/gsm8k", "The answer is 7.", "7") == 0.0  # no #### at all


def test_gsm8k_strict_takes_the_last_marked_answer_flexible_the_last_number():
    text = "2 apples and 3 pears make 5.\n#### 1,234\nso #### 5"
    assert extract_gsm8k(text, "strict") == "5"
    assert extract_gsm8k("#### 1,234", "strict") == "1234"  # commas dropped
    assert extract_gsm8k("The answer is 42.", "strict") is None
    assert extract_gsm8k("The answer is 42 .", "flexible") == "42"  # the lone "." is skipped
    assert extract_gsm8k("no digits", "flexible") is None
    gsm8k, flexible = resolve("gsm8k"), resolve("gsm8k_flexible")
    assert gsm8k("openai/gsm8k", "so #### 72", "72") == 1.0 and gsm8k("openai/gsm8k", "so 72", "72") == 0.0
    assert flexible("openai/gsm8k", "so 72", "72") == 1.0 and flexible("openai/gsm8k", "so 71", "72") == 0.0


def test_math_verify_compares_answers_as_mathematics():
    math = resolve("math")
    assert math("math", "so the answer is $\\boxed{\\frac{1}{2}}$", "0.5") == 1.0
    assert math("math", "so the answer is $\\boxed{\\frac{1}{2}}$", "\\frac{2}{4}") == 1.0
    assert math("math", "so the answer is $\\boxed{3}$", "\\frac{1}{2}") == 0.0
    assert math("math", "I do not know", "2") == 0.0


def test_exact_match_and_the_scorer_picked_by_data_source():
    assert resolve("exact_match")("x", " 8 ", "8") == 1.0 and resolve("exact_match")("x", "8.0", "8") == 0.0
    assert scorer_name("openai/gsm8k", "auto") == "gsm8k" and scorer_name("lighteval/MATH", "auto") == "math"
    assert scorer_name("my/source", "auto") is None and scorer_name("openai/gsm8k", "exact_match") == "exact_match"


def scorer_file(tmp_path):
    path = tmp_path / "my_scorers.py"  # not on sys.path: imported by its path
    path.write_text(textwrap.dedent("""
        import time

        def length(data_source, solution_str, ground_truth, extra_info):
            return len(solution_str) + extra_info["bonus"]

        def broken(data_source, solution_str, ground_truth, extra_info):
            return {}["missing"]

        def slow(data_source, solution_str, ground_truth, extra_info):
            time.sleep(30 if solution_str == "hang" else 0)
            return 1.0
    """))
    return path


def samples(spec, responses):
    return [Sample(spec, "src", text, "", {"bonus": 10}, f"t.parquet row {i}") for i, text in enumerate(responses)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_scorer_from_a_file_path_scores_in_the_pool(tmp_path, workers):
    pool = ScoringPool(workers, timeout_s=20)
    assert pool.score(samples(f"{scorer_file(tmp_path)}:length", ["ab", "", "abcd"])) == [12.0, 10.0, 14.0]
    assert resolve("flowrl.data.scoring.scorers:exact_match")("x", "1", "1") == 1.0  # module:function
    pool.close()


def test_an_exception_names_the_sample_and_the_scorer(tmp_path):
    spec = f"{scorer_file(tmp_path)}:broken"
    with pytest.raises(ValueError, match=r"reward scorer '.*my_scorers.py:broken' failed on t.parquet row 0 "
                                         r"\(response 'x'\): KeyError: 'missing'"):
        ScoringPool(2).score(samples(spec, ["x", "y"]))


def test_a_sample_past_the_timeout_scores_zero_and_the_pool_recovers(tmp_path, caplog):
    spec = f"{scorer_file(tmp_path)}:slow"
    pool = ScoringPool(2, timeout_s=1.0)
    with caplog.at_level(logging.WARNING):
        assert pool.score(samples(spec, ["ok", "hang", "ok"])) == [1.0, 0.0, 1.0]
    assert "1 of 3 samples ran past data.reward_timeout_s=1" in caplog.text
    assert pool.score(samples(spec, ["ok"])) == [1.0]  # a fresh pool: the hung worker is gone
    pool.close()


def test_bad_scorer_names_fail_naming_data_reward(tmp_path):
    with pytest.raises(ValueError, match=r"data.reward: cannot load '.*nope.py:f': ImportError: no file"):
        resolve(f"{tmp_path}/nope.py:f")
    with pytest.raises(ValueError, match=r"data.reward: cannot load 'no_such_module_x:f'"):
        resolve("no_such_module_x:f")
    with pytest.raises(ValueError, match=r"data.reward: cannot load '.*my_scorers.py:absent': AttributeError"):
        resolve(f"{scorer_file(tmp_path)}:absent")


def test_a_dropped_pool_leaves_no_workers(tmp_path):
    import gc

    pool = ScoringPool(2)
    assert pool.score(samples("exact_match", ["x"])) == [0.0]
    workers = [w.process for w in pool._workers]
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    del pool
    gc.collect()
    for w in workers:
        w.join(timeout=10)
    assert not any(w.is_alive() for w in workers)

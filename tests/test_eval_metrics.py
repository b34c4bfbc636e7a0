"""mean@k and pass@k per data source, by hand."""

import pytest

from flowrl.data.scoring.eval_metrics import greedy_metrics, sampled_metrics


def test_greedy_accuracy_per_source():
    assert greedy_metrics([1.0, 0.0, 1.0], ["gsm8k", "math", "gsm8k"]) == {"eval/gsm8k/greedy": 1.0,
                                                                           "eval/math/greedy": 0.0}


def test_mean_and_pass_at_k_per_source():
    # prompts 7 and 8 are gsm8k, 9 is math; k = 2 samples each
    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    groups = [7, 7, 8, 8, 9, 9]
    sources = ["gsm8k", "gsm8k", "gsm8k", "gsm8k", "math", "math"]
    got = sampled_metrics(scores, groups, sources, k=2)
    assert got == pytest.approx({"eval/mean@2": 3 / 6, "eval/pass@2": 2 / 3,           # prompts 7 and 9 pass
                                 "eval/gsm8k/mean@2": 1 / 4, "eval/gsm8k/pass@2": 1 / 2,
                                 "eval/math/mean@2": 1.0, "eval/math/pass@2": 1.0})
    assert sampled_metrics([0.5, 0.9], [1, 1], None, k=2) == {"eval/mean@2": 0.7, "eval/pass@2": 0.0}

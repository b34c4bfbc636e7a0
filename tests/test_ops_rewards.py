"""Reward shaping ops on tiny tensors."""

import pytest
import torch

from flowrl.rl.ops.rewards import kl_in_reward, overlong_penalty, token_rewards


def t(*rows):
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.float32)


def test_token_rewards_on_the_last_valid_token():
    mask = t([1, 1, 0], [1, 1, 1], [0, 0, 0])
    # row 0 ends at t1, row 1 at t2, row 2 has no valid token -> nothing
    expected = t([0, 2, 0], [0, 0, 3], [0, 0, 0])
    assert torch.equal(token_rewards(t(2, 3, 4), mask), expected)
    assert torch.equal(token_rewards(t(2, 3, 4), mask.bool()), expected)
    # interior padding (multi-turn): the last valid token is t2, not t1
    assert torch.equal(token_rewards(t([5.0]), t([[1, 0, 1, 0]])), t([[0, 0, 5, 0]]))
    # integer scores come back as floats
    assert token_rewards(torch.tensor([1]), t([[1, 1]])).dtype == torch.float32


def test_token_rewards_bad_shape():
    with pytest.raises(ValueError, match="scores_B"):
        token_rewards(t(1, 2), torch.ones(3, 2))


def test_overlong_penalty():
    # max 10, buffer 4 -> safe length 6: len 6 -> 0; len 8 -> -(8 - 6) / 4 = -.5;
    # len 10 -> -1; len 12 (beyond max) -> -1
    lengths = torch.tensor([6, 8, 10, 12])
    assert torch.allclose(overlong_penalty(lengths, max_len=10, buffer_len=4), t(0, -0.5, -1, -1))
    # factor 2 scales: [0, -1, -2, -2]
    assert torch.allclose(overlong_penalty(lengths, 10, 4, penalty_factor=2.0), t(0, -1, -2, -2))


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_len=0, buffer_len=4), "max_len"),
    (dict(max_len=10, buffer_len=0), "buffer_len"),
    (dict(max_len=10, buffer_len=11), "buffer_len"),
    (dict(max_len=10, buffer_len=4, penalty_factor=-1.0), "penalty_factor"),
])
def test_overlong_penalty_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        overlong_penalty(torch.tensor([5]), **kwargs)


def test_kl_in_reward():
    rewards, kl = t([[0, 0, 1]]), t([[0.1, 0.2, 0.3]])
    # [0, 0, 1] - .5 * [.1, .2, .3] = [-.05, -.1, .85]
    assert torch.allclose(kl_in_reward(rewards, kl, 0.5), t([[-0.05, -0.1, 0.85]]))
    # with a mask, padding is 0 even where kl is garbage
    kl[0, 2] = float("nan")
    assert torch.allclose(kl_in_reward(rewards, kl, 0.5, t([[1, 1, 0]])), t([[-0.05, -0.1, 0.0]]))
    with pytest.raises(ValueError, match="kl_coef"):
        kl_in_reward(rewards, kl, -0.1)

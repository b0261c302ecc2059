"""Known answers for discounted returns and GAE, computed by hand in the comments."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.trainers.returns import discounted_returns, episode_ends, gae

# Three episodes in one batch, gamma = 0.5:
#   A: rewards 1, 2, 3, terminated at its last row
#   B: rewards 1, 1, truncated at its last row, V(next_observation) = 4 there
#   C: reward 2, cut by the end of the batch, V(next_observation) = 2
REWARDS = [1.0, 2.0, 3.0, 1.0, 1.0, 2.0]
TERMINATEDS = [False, False, True, False, False, False]
TRUNCATEDS = [False, False, False, False, True, False]
NEXT_VALUES = [7.0, 7.0, 100.0, 7.0, 4.0, 2.0]  # 100 after termination must be ignored


def test_episode_ends_at_termination_truncation_new_episode_and_batch_end() -> None:
    ends = episode_ends([False, True, False, False, False], [False] * 5, ["a", "a", "b", "c", "c"])
    assert ends.tolist() == [False, True, True, False, True]


def test_discounted_returns_bootstrap_truncated_not_terminated() -> None:
    got = discounted_returns(REWARDS, TERMINATEDS, TRUNCATEDS, 0.5, next_values=NEXT_VALUES)
    # A: G2 = 3, G1 = 2 + 0.5*3 = 3.5, G0 = 1 + 0.5*3.5 = 2.75
    # B: G4 = 1 + 0.5*4 = 3, G3 = 1 + 0.5*3 = 2.5
    # C: G5 = 2 + 0.5*2 = 3
    np.testing.assert_allclose(got, [2.75, 3.5, 3.0, 2.5, 3.0, 3.0])


def test_discounted_returns_without_values_is_monte_carlo() -> None:
    got = discounted_returns(REWARDS, TERMINATEDS, TRUNCATEDS, 0.5)
    # B: G4 = 1, G3 = 1 + 0.5 = 1.5; C: G5 = 2
    np.testing.assert_allclose(got, [2.75, 3.5, 3.0, 1.5, 1.0, 2.0])


def test_discounted_returns_split_on_episode_id() -> None:
    # episode "a" is cut after its second row (no terminal flag): it bootstraps from V = 10
    got = discounted_returns(
        [1.0, 1.0, 5.0],
        [False, False, True],
        [False, False, False],
        0.5,
        next_values=[0.0, 10.0, 0.0],
        episode_ids=["a", "a", "b"],
    )
    # G1 = 1 + 0.5*10 = 6, G0 = 1 + 0.5*6 = 4, G2 = 5
    np.testing.assert_allclose(got, [4.0, 6.0, 5.0])


def test_gae_two_episodes_by_hand() -> None:
    # gamma = lambda = 0.5
    # A: r = 1, 2; V = 1, 1; V(next) = 1, 9 (terminated at row 1: the 9 is ignored)
    #    delta0 = 1 + 0.5*1 - 1 = 0.5, delta1 = 2 - 1 = 1
    #    A1 = 1, A0 = 0.5 + 0.25*1 = 0.75
    # B: r = 0, 1; V = 2, 2; V(next) = 2, 6 (truncated at row 3: bootstraps from 6)
    #    delta2 = 0 + 0.5*2 - 2 = -1, delta3 = 1 + 0.5*6 - 2 = 2
    #    A3 = 2, A2 = -1 + 0.25*2 = -0.5
    advantages, returns = gae(
        rewards=[1.0, 2.0, 0.0, 1.0],
        values=[1.0, 1.0, 2.0, 2.0],
        next_values=[1.0, 9.0, 2.0, 6.0],
        terminateds=[False, True, False, False],
        truncateds=[False, False, False, True],
        gamma=0.5,
        gae_lambda=0.5,
    )
    np.testing.assert_allclose(advantages, [0.75, 1.0, -0.5, 2.0])
    np.testing.assert_allclose(returns, [1.75, 2.0, 1.5, 4.0])


def test_gae_lambda_one_is_bootstrapped_return_minus_value() -> None:
    rng = np.random.default_rng(0)
    rewards, values, next_values = rng.normal(size=(3, 12))
    terminateds = np.zeros(12, bool)
    truncateds = np.zeros(12, bool)
    terminateds[4], truncateds[8] = True, True
    # within an episode V(next_observation_t) is V(observation_{t+1})
    for t in range(11):
        if t not in (4, 8):
            next_values[t] = values[t + 1]
    advantages, _ = gae(rewards, values, next_values, terminateds, truncateds, 0.9, 1.0)
    expected = discounted_returns(rewards, terminateds, truncateds, 0.9, next_values=next_values)
    np.testing.assert_allclose(advantages, expected - values)


def test_gae_lambda_zero_is_one_step_td_error() -> None:
    advantages, _ = gae([1.0, 1.0], [0.5, 0.5], [2.0, 3.0], [False, True], [False, False], 0.9, 0.0)
    np.testing.assert_allclose(advantages, [1.0 + 0.9 * 2.0 - 0.5, 1.0 - 0.5])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 1.5}, "returns.gamma: expected a number in [0, 1], got 1.5"),
        ({"gae_lambda": -0.1}, "returns.gae_lambda: expected a number in [0, 1], got -0.1"),
    ],
)
def test_gae_rejects_bad_coefficients(kwargs: dict[str, float], message: str) -> None:
    arguments = {"gamma": 0.9, "gae_lambda": 0.9, **kwargs}
    with pytest.raises(ConfigError, match=re.escape(message)):
        gae([1.0], [0.0], [0.0], [True], [False], **arguments)

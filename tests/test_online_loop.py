"""What the online loops build on: client returns summed from live rows, fragments for GAE."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from pipeline.dataset.batch import Batch
from pipeline.trainers.episode_returns import EpisodeReturns
from pipeline.trainers.ppo import PPO, PPOConfig


def rows(episode: str, ts: list[int], rewards: list[float], last: str = "") -> Batch:
    """Rows of one episode; ``last`` marks the final row "terminated" or "truncated"."""
    n = len(ts)
    end = np.zeros(n, bool)
    end[-1] = bool(last)
    return Batch(episode_ids=np.array([episode] * n), ts=np.array(ts),
                 rewards=np.array(rewards, np.float64),
                 terminateds=end & (last == "terminated"),
                 truncateds=end & (last == "truncated"))  # fmt: skip


def test_episode_returns_count_an_episode_once_all_its_rows_have_come() -> None:
    returns = EpisodeReturns(window=2)
    # episode a arrives in three fragments, its terminal row first; b in one, interleaved
    returns.add(Batch.concat([rows("a", [3, 4], [1.0, 2.0], "terminated"),
                              rows("b", [0, 1], [5.0, 5.0], "truncated")]))  # fmt: skip
    assert (returns.count, returns.mean(), returns.full) == (1, 10.0, False)
    returns.add(rows("a", [0, 1], [1.0, 1.0]))
    assert returns.count == 1  # a still lacks t=2
    returns.add(rows("a", [2], [1.0]))
    assert (returns.count, returns.mean(), returns.full) == (2, 8.0, True)
    returns.add(rows("c", [0], [4.0], "terminated"))
    assert list(returns.recent) == [6.0, 4.0]  # the window keeps the newest


def test_episode_returns_of_interleaved_rows_count_in_the_order_episodes_end() -> None:
    """A client stepping several simulators in turn uploads their rows interleaved."""
    a = rows("a", [0, 1, 2], [1.0, 2.0, 3.0], "terminated")
    b = rows("b", [0, 1], [10.0, 20.0], "truncated")
    c = rows("c", [0, 1], [7.0, 7.0])
    order = [a[0:1], b[0:1], c[0:1], a[1:2], b[1:2], c[1:2], a[2:3]]  # b ends, then a
    returns = EpisodeReturns(window=20)
    returns.add(Batch.concat(order))
    assert (list(returns.recent), returns.count) == ([30.0, 6.0], 2)  # c is still open
    returns.add(rows("c", [2], [7.0], "terminated"))
    assert list(returns.recent) == [30.0, 6.0, 21.0]


def test_episode_returns_never_count_an_episode_whose_first_rows_were_not_read() -> None:
    returns = EpisodeReturns(window=20)
    returns.add(rows("late", [7, 8], [1.0, 1.0], "terminated"))
    assert (returns.count, returns.mean()) == (0, None)


def _transitions(ids: list[str], ts: list[int], truncated_last: bool) -> Batch:
    n = len(ids)
    observations = np.linspace(-0.05, 0.05, 4 * n, dtype=np.float32).reshape(n, 4)
    truncateds = np.zeros(n, bool)
    truncateds[-1] = truncated_last
    return Batch(observations=observations, next_observations=observations[::-1].copy(),
                 rewards=np.ones(n), terminateds=np.zeros(n, bool), truncateds=truncateds,
                 episode_ids=np.array(ids), ts=np.array(ts))  # fmt: skip


def test_ppo_restarts_gae_where_an_episode_s_fragments_do_not_join() -> None:
    """Rows t=0,1 and t=5,6 of one episode: a gap in t is a cut, bootstrapped like a new
    episode; without ``ts`` only the episode id would separate them."""
    env = gym.make("CartPole-v1")
    trainer = PPO(env.observation_space, env.action_space, PPOConfig(gamma=0.9, gae_lambda=0.5))
    env.close()
    gapped = _transitions(["e"] * 4, [0, 1, 5, 6], truncated_last=True)
    split = _transitions(["e", "e", "f", "f"], [0, 1, 0, 1], truncated_last=True)
    joined = _transitions(["e"] * 4, [0, 1, 2, 3], truncated_last=True)
    gap_advantages, _ = trainer.advantages(gapped)
    split_advantages, _ = trainer.advantages(split)
    joined_advantages, _ = trainer.advantages(joined)
    np.testing.assert_allclose(gap_advantages, split_advantages)
    assert gap_advantages[1] != pytest.approx(joined_advantages[1])

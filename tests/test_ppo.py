"""PPO learns CartPole from rollouts of its own published checkpoints, stale ones included."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipeline.dataset.batch import Batch
from pipeline.errors import ConfigError
from pipeline.policy.checkpoint import Checkpoint
from pipeline.policy.network import NumpyPolicy
from pipeline.trainers.evaluation import evaluate
from pipeline.trainers.ppo import PPO, PPOConfig


def rollouts(checkpoint: Checkpoint, env: gym.Env[Any, Any], steps: int, seed: int) -> Batch:
    """Whole episodes acted by the numpy policy, as a client logs them (logp and version)."""
    policy = NumpyPolicy(checkpoint)
    rng = np.random.default_rng(seed)
    episodes = []
    rows = 0
    episode = 0
    while rows < steps:
        columns: dict[str, list[Any]] = {key: [] for key in _FIELDS}
        observation, _ = env.reset(seed=seed * 1000 + episode)
        ended = False
        while not ended:
            action, logp = policy.act(observation[None], rng)
            next_observation, reward, terminated, truncated, _ = env.step(int(action[0]))
            ended = terminated or truncated
            row = (observation, int(action[0]), float(reward), next_observation, terminated,
                   truncated, float(logp[0]), policy.version, f"{seed}-{episode}")  # fmt: skip
            for key, value in zip(_FIELDS, row, strict=True):
                columns[key].append(value)
            observation = next_observation
        episodes.append(Batch(**{key: np.asarray(value) for key, value in columns.items()}))
        rows += len(episodes[-1])
        episode += 1
    return Batch.concat(episodes)


_FIELDS = ("observations", "actions", "rewards", "next_observations", "terminateds",
           "truncateds", "action_logps", "policy_versions", "episode_ids")  # fmt: skip


@pytest.mark.parametrize("lag", [0, 2])
def test_ppo_learns_cartpole_from_its_published_versions(lag: int) -> None:
    """With ``lag``, rows come from the version published ``lag`` updates earlier, as online
    rows do: the behaviour correction keeps them useful."""
    env = gym.make("CartPole-v1")
    trainer = PPO(env.observation_space, env.action_space, PPOConfig(lr=1e-3, update_epochs=4))
    published = [trainer.checkpoint(1)]
    lengths = []
    for version in range(1, 13):
        acting = published[max(0, len(published) - 1 - lag)]
        batch = rollouts(acting, env, steps=1024, seed=version)
        lengths.append(len(batch) / len(np.unique(batch.episode_ids)))
        metrics = trainer.update(batch)
        assert metrics["fresh_fraction"] == 1.0
        assert metrics["policy_lag"] == min(lag, version - 1)
        published.append(trainer.checkpoint(version + 1))
    env.close()
    # random play lasts about 22 steps
    assert np.mean(lengths[:2]) < 40
    assert np.mean(lengths[-2:]) > 2 * np.mean(lengths[:2])
    # 12k steps of PPO: well clear of random
    assert evaluate(trainer.checkpoint(14), "CartPole-v1", episodes=3) > 60


def test_ppo_weights_stale_rows_by_pi_over_mu_truncated_at_rho_bar() -> None:
    env = gym.make("CartPole-v1")
    trainer = PPO(env.observation_space, env.action_space, PPOConfig(update_epochs=1))
    batch = rollouts(trainer.checkpoint(2), env, steps=40, seed=0)
    env.close()
    x = torch.as_tensor(batch.observations, dtype=torch.float32)
    with torch.no_grad():
        proximal, _ = trainer.policy.log_prob_entropy(x, torch.as_tensor(batch.actions))
    # half the rows were twice as likely under their behaviour policy (pi/mu = 0.5), half half
    # as likely (pi/mu = 2, truncated to rho_bar = 1): the mean weight is 0.75
    halves = np.where(np.arange(len(batch)) % 2 == 0, np.log(2.0), -np.log(2.0))
    stale = batch.replace(action_logps=proximal.numpy() + halves,
                          policy_versions=np.ones(len(batch), np.int64))  # fmt: skip
    metrics = trainer.update(stale)
    assert metrics["rho"] == pytest.approx(0.75, abs=1e-5)
    assert metrics["policy_lag"] == 1.0


def test_ppo_leaves_stale_and_unlogged_rows_out_of_the_policy_loss() -> None:
    env = gym.make("CartPole-v1")
    trainer = PPO(env.observation_space, env.action_space, PPOConfig(max_policy_lag=1))
    batch = rollouts(trainer.checkpoint(1), env, steps=50, seed=0)
    env.close()
    trainer.checkpoint(4)  # the trainer moved on: version-1 rows are 3 versions old
    versions = np.where(np.arange(len(batch)) % 2 == 0, 1, 3)
    logps = batch.action_logps.copy()
    logps[1] = np.nan  # a version-3 row without a behaviour logp
    mixed = batch.replace(policy_versions=versions, action_logps=logps)
    fresh = trainer.fresh(mixed)
    expected = versions == 3
    expected[1] = False
    assert fresh.tolist() == expected.tolist()
    stale = batch.replace(policy_versions=np.ones(len(batch), np.int64))
    metrics = trainer.update(stale)
    assert metrics["fresh_fraction"] == 0.0
    assert metrics["policy_loss"] == 0.0
    assert metrics["value_loss"] > 0.0


def test_ppo_box_actions_export_a_gaussian() -> None:
    env = gym.make("Pendulum-v1")
    trainer = PPO(env.observation_space, env.action_space, PPOConfig(hidden=(16,)))
    checkpoint = trainer.checkpoint(1)
    assert checkpoint.spec.distribution == "gaussian"
    observations = np.zeros((3, 3), np.float32)
    actions, logp = NumpyPolicy(checkpoint).act(observations, np.random.default_rng(0))
    rows = Batch(observations=observations, actions=actions, rewards=np.zeros(3),
                 next_observations=observations, terminateds=np.zeros(3, bool),
                 truncateds=np.array([False, False, True]), action_logps=logp,
                 policy_versions=np.ones(3, np.int64), episode_ids=np.array(["a"] * 3))  # fmt: skip
    metrics = trainer.update(rows)
    # first minibatch step: the weights that acted are the weights that score, so ratio = 1
    assert metrics["fresh_fraction"] == 1.0
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip_coef": 0}, "PPOConfig.clip_coef: expected a number > 0, got 0"),
        ({"gae_lambda": 1.2}, "PPOConfig.gae_lambda: expected a number in [0, 1], got 1.2"),
        ({"update_epochs": 0}, "PPOConfig.update_epochs: expected an integer >= 1, got 0"),
        ({"rho_bar": 0}, "PPOConfig.rho_bar: expected a number > 0, got 0"),
        ({"anneal_updates": 0}, "PPOConfig.anneal_updates: expected an integer >= 1, got 0"),
    ],
)
def test_ppo_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        PPOConfig(**kwargs)


def test_ppo_anneals_lr_and_clip_linearly_to_zero() -> None:
    config = PPOConfig(lr=1e-3, anneal_updates=4)
    assert [config.progress_remaining(u) for u in (0, 1, 4, 9)] == [1.0, 0.75, 0.0, 0.0]
    assert PPOConfig().progress_remaining(10**6) == 1.0


def test_ppo_clips_policy_and_value_gradients_apart() -> None:
    """A value loss of any size leaves the policy's step alone: under one joint norm, a value
    spike (a long episode's unforeseen fall) would shrink the policy's step to nothing."""
    env = gym.make("CartPole-v1")
    trainers = [PPO(env.observation_space, env.action_space, PPOConfig(vf_coef=vf_coef))
                for vf_coef in (0.5, 1000.0)]  # fmt: skip
    batch = rollouts(trainers[0].checkpoint(1), env, steps=64, seed=0)
    env.close()
    before = [p.detach().clone() for p in trainers[0].policy.parameters()]
    for trainer in trainers:
        trainer.update(batch)
    moved, same = trainers[0].policy.parameters(), trainers[1].policy.parameters()
    for start, a, b in zip(before, moved, same, strict=True):
        assert not torch.equal(start, a) or not start.numel()
        torch.testing.assert_close(a, b)

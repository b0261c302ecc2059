"""The trainer protocols: every trainer meets ``Trainer``; the loops' narrower ones pick PPO and
MARWIL by what they do, not by name."""

from __future__ import annotations

import gymnasium as gym
import pytest

from pipeline.trainers.command import ALGORITHMS, make_trainer
from pipeline.trainers.trainer import OnPolicy, RefreshesTargets, Trainer


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_trainer_meets_the_protocol_the_loops_take(algorithm: str) -> None:
    env = gym.make("Pendulum-v1" if algorithm == "sac" else "CartPole-v1")
    trainer = make_trainer(algorithm, env.observation_space, env.action_space, hidden=(8,))
    env.close()
    assert isinstance(trainer, Trainer)
    assert isinstance(trainer, OnPolicy) == (algorithm == "ppo")
    assert isinstance(trainer, RefreshesTargets) == (algorithm == "marwil")
    assert type(trainer).__bases__ == (object,)  # no inheritance between trainers

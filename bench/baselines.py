"""The learning benchmark's baselines: Stable-Baselines3's PPO and SAC, in-process, with RL-Zoo's
settings, each until it reaches the bar rlpipe's trainer is held to. Each returns a
:class:`Run`: seconds to the bar (None if not within the budget) and env steps taken."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.trainers.evaluation import greedy_return


@dataclass(frozen=True)
class Run:
    """One seed's run of either side: seconds to the bar on its own clock (None: not reached
    within the budget), the env steps it had taken by then, and its updates (PPO: one per
    rollout trained on; SAC: gradient steps), which say whether a slow seed was slow to learn
    or slow to update."""

    seconds: float | None
    env_steps: int
    updates: int

    @property
    def steps_per_s(self) -> float | None:
        return None if not self.seconds else self.env_steps / self.seconds


def _silent(model: Any) -> Any:
    """``model`` with a logger that writes nowhere: SB3's default, at ``verbose=0``, still
    makes an empty ``SB3-<time>`` folder in the temp directory on every ``learn()``."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def sb3_ppo(budget: float, seed: int) -> Run:
    """SB3 PPO with RL-Zoo's CartPole-v1 hyperparameters, until 20-episode mean return >= 475."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            buffer = self.model.ep_info_buffer
            recent = [info["r"] for info in list(buffer)[-20:]]
            solved[0] = len(recent) == 20 and bool(np.mean(recent) >= 475)
            return not solved[0] and time.perf_counter() - started < budget

    def linear(start: float) -> Any:  # RL-Zoo's lin_ schedules: start * progress remaining
        return lambda progress_remaining: progress_remaining * start

    solved = [False]
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = _silent(
        PPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=linear(0.001),
            clip_range=linear(0.2),
            seed=seed,
            device="cpu",
        )
    )  # rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 (n_timesteps 1e5)
    started = time.perf_counter()
    model.learn(total_timesteps=100_000, callback=Stop())
    seconds = time.perf_counter() - started
    rollouts = model.num_timesteps // (model.n_envs * model.n_steps)
    return Run(seconds if solved[0] else None, model.num_timesteps, rollouts)


def sb3_sac(budget: float, seed: int) -> Run:
    """SB3 SAC (RL-Zoo's Pendulum-v1 settings) until the greedy evaluation return >= -200."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    solved = [False]

    class Stop(BaseCallback):
        def act(self, observation: Any) -> Any:
            return self.model.predict(observation, deterministic=True)[0]

        def _on_step(self) -> bool:
            if time.perf_counter() - started > budget:
                return False
            if self.num_timesteps % 1000:
                return True
            # the evaluation rlpipe's trainer runs, on the same start states (SB3's own
            # evaluate_policy resets unseeded: 3,000 to 7,000 steps to the bar, same seeds)
            solved[0] = greedy_return(self.act, "Pendulum-v1", 5, seed) >= -200
            return not solved[0]

    model = _silent(SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=seed, device="cpu"))
    started = time.perf_counter()
    model.learn(total_timesteps=20_000, callback=Stop())
    seconds = time.perf_counter() - started
    acting = max(0, model.num_timesteps - model.learning_starts) // model.train_freq.frequency
    return Run(seconds if solved[0] else None, model.num_timesteps, acting * model.gradient_steps)

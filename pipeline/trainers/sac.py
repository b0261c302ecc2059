"""Soft Actor-Critic for Box actions (Haarnoja et al. 2018, "SAC: Algorithms and Applications").

Twin Q-networks with Polyak-averaged targets, a squashed-Gaussian actor and a learned entropy
temperature ``alpha``. It learns from batches of transitions, from any behaviour (it is
off-policy): online, the command samples them from a replay buffer filled by the live reader.

The TD target bootstraps from ``next_observation`` unless the row *terminated*: a truncated row
(a time limit) still has a future, so it bootstraps (Pardo et al. 2018).

The pieces of ``update`` are methods (``critic_loss``, ``actor_alpha_step``), so each can be
tested by itself.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from pipeline.dataset.batch import Batch
from pipeline.format import flattening
from pipeline.policy.checkpoint import Checkpoint, ModelSpec
from pipeline.trainers import state, validation
from pipeline.trainers.networks import (
    MLP,
    actions_tensor,
    box_bounds,
    check_action_space,
    column,
    export,
    gradient_step,
    observations_tensor,
    polyak,
    squashed_sample,
)


@dataclass(frozen=True)
class SACConfig:
    """Attributes:
    lr: Adam step size of actor, critics and temperature.
    gamma: discount.
    tau: Polyak step of the target critics.
    alpha: initial entropy temperature.
    autotune: learn alpha towards ``target_entropy`` (default: minus the action dimension).
    hidden, activation: shape of actor and critics.
    seed: seeds initial weights and the actor's noise.
    """

    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    alpha: float = 0.2
    autotune: bool = True
    target_entropy: float | None = None
    hidden: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive(self, "lr", "alpha")
        validation.unit_interval(self, "gamma", "tau")
        validation.network(self)
        validation.optional_number(self, "target_entropy")


class SAC:
    """``update(batch)`` takes transitions: observations, actions, rewards, next_observations,
    terminateds."""

    algorithm = "sac"

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        config: SACConfig | None = None,
    ) -> None:
        check_action_space("SAC", action_space, (gym.spaces.Box,))
        self.config = c = config or SACConfig()
        torch.manual_seed(c.seed)
        self.observation_space, self.action_space = observation_space, action_space
        obs_dim, act_dim = flattening.flatdim(observation_space), flattening.flatdim(action_space)
        self.low, self.high = box_bounds(cast(gym.spaces.Box, action_space))
        self.actor = MLP(obs_dim, c.hidden, 2 * act_dim, c.activation)
        self.q1 = MLP(obs_dim + act_dim, c.hidden, 1, c.activation)
        self.q2 = MLP(obs_dim + act_dim, c.hidden, 1, c.activation)
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.log_alpha = torch.nn.Parameter(torch.tensor(float(np.log(c.alpha))))
        self.target_entropy = -act_dim if c.target_entropy is None else c.target_entropy
        # fused: one kernel per optimizer step instead of a loop over the parameters
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=c.lr, fused=True)
        critics = [*self.q1.parameters(), *self.q2.parameters()]
        self.critic_optimizer = torch.optim.Adam(critics, lr=c.lr, fused=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=c.lr, fused=True)
        self.updates = 0

    def tensors(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {
            "x": observations_tensor(self.observation_space, batch.observations),
            "a": actions_tensor(self.action_space, batch.actions),
            "r": column(batch.rewards),
            "x2": observations_tensor(self.observation_space, batch.next_observations),
            "terminated": column(batch.terminateds),
        }

    def q(self, x: torch.Tensor, a: torch.Tensor, target: bool = False) -> torch.Tensor:
        """min(Q1, Q2) of each row, with the target critics when ``target``."""
        q1, q2 = (self.q1_target, self.q2_target) if target else (self.q1, self.q2)
        xa = torch.cat([x, a], dim=-1)
        return torch.min(q1(xa), q2(xa)).squeeze(-1)

    def sample(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return squashed_sample(self.actor(x), self.low, self.high)

    def critic_loss(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Soft Bellman error of both critics (SAC, eq. 5) and Q1 of the data, for logging."""
        with torch.no_grad():
            a2, logp2 = self.sample(t["x2"])
            soft_value = self.q(t["x2"], a2, target=True) - self.log_alpha.exp() * logp2
            target = t["r"] + self.config.gamma * (1 - t["terminated"]) * soft_value
        xa = torch.cat([t["x"], t["a"]], dim=-1)
        q1, q2 = self.q1(xa).squeeze(-1), self.q2(xa).squeeze(-1)
        loss = 0.5 * ((q1 - target).pow(2).mean() + (q2 - target).pow(2).mean())
        return loss, q1

    def actor_alpha_step(self, x: torch.Tensor) -> dict[str, float]:
        """One actor step (SAC, eq. 7) and one temperature step (eq. 18)."""
        alpha = self.log_alpha.exp().detach()
        actions, logp = self.sample(x)
        actor_loss = (alpha * logp - self.q(x, actions)).mean()
        gradient_step(self.actor_optimizer, actor_loss)
        if self.config.autotune:
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            gradient_step(self.alpha_optimizer, alpha_loss)
        return {
            "actor_loss": actor_loss.item(),
            "alpha": alpha.item(),
            "entropy": -logp.mean().item(),
        }

    def update(self, batch: Batch) -> dict[str, float]:
        t = self.tensors(batch)
        critic_loss, q1 = self.critic_loss(t)
        gradient_step(self.critic_optimizer, critic_loss)
        metrics = self.actor_alpha_step(t["x"])
        polyak(self.q1, self.q1_target, self.config.tau)
        polyak(self.q2, self.q2_target, self.config.tau)
        self.updates += 1
        return {
            "loss": critic_loss.item(),
            "critic_loss": critic_loss.item(),
            "q": q1.mean().item(),
            **metrics,
        }

    def checkpoint(self, version: int) -> Checkpoint:
        """The actor as a squashed-Gaussian policy (``pi.*``), the critics riding along."""
        spec = ModelSpec(
            self.observation_space,
            self.action_space,
            hidden=self.config.hidden,
            activation=self.config.activation,
            distribution="squashed_gaussian",
            algorithm=self.algorithm,
        )
        weights = {**export("pi", self.actor), **export("q1", self.q1), **export("q2", self.q2)}
        return Checkpoint(version, spec, weights)

    def state_dict(self) -> dict[str, np.ndarray]:
        return _STATE.arrays(self)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        _STATE.load(self, arrays)


_STATE = state.Parts(
    modules=("actor", "q1", "q2", "q1_target", "q2_target"),
    optimizers=("actor_optimizer", "critic_optimizer", "alpha_optimizer"),
    values=("log_alpha", "updates"),
)

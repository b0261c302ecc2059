"""Conservative Q-learning (Kumar et al. 2020), offline, for Discrete and Box actions.

Offline Q-learning overestimates the actions the data never tried, and the greedy policy goes
exactly there. CQL(H) adds ``cql_alpha * E_s[logsumexp_a Q(s, a) - E_data Q(s, a)]`` (eq. 4) to
the Bellman error, pushing down Q everywhere and back up on the logged actions.

- Discrete actions: one Q-network with a Polyak-averaged target (double-DQN target); the
  logsumexp is exact. The exported policy is categorical over the Q-values (greedy = argmax Q).
- Box actions: a :class:`~pipeline.trainers.sac.SAC` learner plus the penalty, the logsumexp
  estimated by importance sampling over uniform actions and the actor's actions at ``s`` and
  ``s'`` (Kumar et al. 2020, appendix F; as in CORL's ``cql.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from pipeline import flattening
from pipeline.batch import Batch
from pipeline.policy import Checkpoint, ModelSpec
from pipeline.trainers import state, validation
from pipeline.trainers.networks import (
    MLP,
    actions_tensor,
    check_action_space,
    column,
    export,
    observations_tensor,
)
from pipeline.trainers.sac import SAC, SACConfig


@dataclass(frozen=True)
class CQLConfig:
    """Attributes:
    lr: Adam step size.
    gamma: discount.
    tau: Polyak step of the target network(s).
    cql_alpha: weight of the conservative penalty (the paper's alpha).
    num_actions: sampled actions per kind for the Box logsumexp estimate.
    bc_iters: Box actions: updates in which the actor clones the data before it follows Q.
    alpha: SAC's initial entropy temperature (Box actions).
    hidden, activation: network shape.
    seed: seeds initial weights and sampling.
    """

    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    cql_alpha: float = 1.0
    num_actions: int = 10
    bc_iters: int = 0
    alpha: float = 0.2
    hidden: tuple[int, ...] = (256, 256)
    activation: str = "relu"
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive(self, "lr", "alpha")
        validation.non_negative(self, "cql_alpha", "bc_iters")
        validation.unit_interval(self, "gamma", "tau")
        validation.counts(self, "num_actions")
        validation.network(self)


class CQL:
    """``update(batch)`` takes transitions; Discrete actions use a Q-network, Box ones SAC."""

    algorithm = "cql"

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        config: CQLConfig | None = None,
    ) -> None:
        check_action_space("CQL", action_space, (gym.spaces.Discrete, gym.spaces.Box))
        self.config = c = config or CQLConfig()
        torch.manual_seed(c.seed)
        self.observation_space, self.action_space = observation_space, action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.updates = 0
        if self.discrete:
            n = flattening.flatdim(action_space)
            self.q = MLP(flattening.flatdim(observation_space), c.hidden, n, c.activation)
            self.q_target = copy.deepcopy(self.q)
            self.optimizer = torch.optim.Adam(self.q.parameters(), lr=c.lr)
        else:
            sac = SACConfig(lr=c.lr, gamma=c.gamma, tau=c.tau, alpha=c.alpha, hidden=c.hidden,
                            activation=c.activation, seed=c.seed)  # fmt: skip
            self.sac = SAC(observation_space, action_space, sac)

    def update(self, batch: Batch) -> dict[str, float]:
        metrics = self._update_discrete(batch) if self.discrete else self._update_box(batch)
        self.updates += 1
        return metrics

    def _update_discrete(self, batch: Batch) -> dict[str, float]:
        c = self.config
        x = observations_tensor(self.observation_space, batch.observations)
        a = actions_tensor(self.action_space, batch.actions)
        x2 = observations_tensor(self.observation_space, batch.next_observations)
        with torch.no_grad():  # double DQN: the online net picks, the target net values
            best = self.q(x2).argmax(-1, keepdim=True)
            following = self.q_target(x2).gather(1, best).squeeze(-1)
            target = column(batch.rewards) + c.gamma * (1 - column(batch.terminateds)) * following
        q_all = self.q(x)
        q_data = q_all.gather(1, a.unsqueeze(1)).squeeze(-1)
        td_loss = 0.5 * (q_data - target).pow(2).mean()
        penalty = (torch.logsumexp(q_all, dim=-1) - q_data).mean()  # CQL(H), eq. 4
        loss = td_loss + c.cql_alpha * penalty
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        _polyak(self.q, self.q_target, c.tau)
        return {"loss": loss.item(), "td_loss": td_loss.item(), "cql_penalty": penalty.item(),
                "q": q_data.mean().item()}  # fmt: skip

    def _update_box(self, batch: Batch) -> dict[str, float]:
        sac = self.sac
        t = sac.tensors(batch)
        td_loss, q_data = sac.critic_loss(t)
        penalty = self._box_penalty(t["x"], t["x2"], t["a"])
        loss = td_loss + self.config.cql_alpha * penalty
        sac.critic_optimizer.zero_grad()
        loss.backward()
        sac.critic_optimizer.step()
        imitate = t["a"] if self.updates < self.config.bc_iters else None
        metrics = sac.actor_alpha_step(t["x"], imitate)
        sac.soft_update()
        sac.updates += 1
        return {"loss": loss.item(), "td_loss": td_loss.item(), "cql_penalty": penalty.item(),
                "q": q_data.mean().item(), **metrics}  # fmt: skip

    def _box_penalty(self, x: torch.Tensor, x2: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """logsumexp_a Q(s, a) by importance sampling, minus Q of the data (appendix F)."""
        sac, n, rows = self.sac, self.config.num_actions, len(x)
        low, high = sac.low, sac.high
        repeated = x.repeat_interleave(n, dim=0)
        with torch.no_grad():
            uniform = low + (high - low) * torch.rand(rows * n, len(low))
            pi_now, logp_now = sac.sample(repeated)
            pi_next, logp_next = sac.sample(x2.repeat_interleave(n, dim=0))
        log_uniform = -torch.log(high - low).sum()
        parts = []
        for actions, log_density in (
            (uniform, log_uniform.expand(rows * n)),
            (pi_now, logp_now),
            (pi_next, logp_next),
        ):
            xa = torch.cat([repeated, actions], dim=-1)
            for q in (sac.q1, sac.q2):
                parts.append((q(xa).squeeze(-1) - log_density).view(rows, n))
        penalty = 0.0 * x.sum()
        for index, q in enumerate((sac.q1, sac.q2)):
            q_all = torch.cat(parts[index::2], dim=1)
            q_data = q(torch.cat([x, a], dim=-1)).squeeze(-1)
            penalty = penalty + (torch.logsumexp(q_all, dim=1) - math.log(3 * n) - q_data).mean()
        return penalty

    def checkpoint(self, version: int) -> Checkpoint:
        if not self.discrete:
            checkpoint = self.sac.checkpoint(version)
            spec = dataclasses.replace(checkpoint.spec, algorithm=self.algorithm)
            return Checkpoint(version, spec, checkpoint.weights)
        spec = ModelSpec(
            self.observation_space,
            self.action_space,
            hidden=self.config.hidden,
            activation=self.config.activation,
            distribution="categorical",
            algorithm=self.algorithm,
        )
        return Checkpoint(version, spec, export("pi", self.q))

    def state_dict(self) -> dict[str, np.ndarray]:
        if not self.discrete:
            return {**self.sac.state_dict(), "updates": np.asarray(self.updates)}
        return {
            **state.module_arrays("q", self.q),
            **state.module_arrays("q_target", self.q_target),
            **state.optimizer_arrays("optimizer", self.optimizer),
            "updates": np.asarray(self.updates),
        }

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        if not self.discrete:
            self.sac.load_state_dict(arrays)
        else:
            state.load_module("q", self.q, arrays)
            state.load_module("q_target", self.q_target, arrays)
            state.load_optimizer("optimizer", self.optimizer, arrays)
        self.updates = int(arrays["updates"])


@torch.no_grad()
def _polyak(net: torch.nn.Module, target: torch.nn.Module, tau: float) -> None:
    for p, p_target in zip(net.parameters(), target.parameters(), strict=True):
        p_target.mul_(1 - tau).add_(tau * p)

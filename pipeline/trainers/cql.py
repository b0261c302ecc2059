"""Conservative Q-learning (Kumar et al. 2020), offline, for Discrete and Box actions.

Offline Q-learning overestimates the actions the data never tried, and the greedy policy goes
exactly there. CQL(H) adds ``cql_alpha * E_s[logsumexp_a Q(s, a) - E_data Q(s, a)]`` (eq. 4) to
the Bellman error, pushing down Q everywhere and back up on the logged actions.

- Discrete actions: one Q-network with a Polyak-averaged target (double-DQN target); the
  logsumexp is exact. The exported policy is categorical over the Q-values (greedy = argmax Q).
- Box actions: CQL over SAC, as in the paper's code: twin critics with Polyak targets, a
  squashed-Gaussian actor and a learned temperature. The logsumexp is estimated by importance
  sampling over uniform actions and the actor's actions at ``s`` and ``s'`` (appendix F; as in
  CORL's ``cql.py``). The actor clones the data for its first ``bc_iters`` updates, while the
  critics are still untrained (RLlib's ``bc_iters``).

Box updates are sized for a CPU: the twin critics are one batched network (one matmul per layer
for both), the actor runs once per row and its ``num_actions`` samples share that output, and the
data's actions and every sampled one go through the critics in a single pass.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

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
    squashed_logp,
    squashed_sample,
)


@dataclass(frozen=True)
class CQLConfig:
    """Attributes:
    lr: Adam step size of the Q-network(s) and of the temperature.
    policy_lr: Adam step size of the actor (Box actions).
    gamma: discount.
    tau: Polyak step of the target network(s).
    cql_alpha: weight of the conservative penalty (the paper's alpha; RLlib's min_q_weight).
        None: 1.0 for Discrete actions (the paper's Atari setting), 20.0 for Box ones, where
        logged actions often spread over the whole range (RLlib's recorded Pendulum is a noisy
        SAC's) and a weaker penalty lets the actor chase the critics' errors.
    num_actions: sampled actions per kind for the Box logsumexp estimate (the paper's code and
        RLlib take 10; the critics' pass grows with it, and 4 per kind do for small actions).
    bc_iters: Box actions: updates in which the actor clones the data before it follows Q.
    alpha: initial entropy temperature of the actor (Box actions; RLlib's initial_alpha).
    target_entropy: the temperature's target (default: minus the action dimension).
    hidden, activation: network shape.
    seed: seeds initial weights and sampling.

    The defaults are sized for a CPU and tuned on RLlib's recorded Pendulum (``bench/learn.py``):
    small networks and a critic step above the actor's (lr 1e-3, policy_lr 3e-4) reach the
    data's return within some 4,000-6,000 updates of 256 rows.
    """

    lr: float = 1e-3
    policy_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    cql_alpha: float | None = None
    num_actions: int = 4
    bc_iters: int = 500
    alpha: float = 1.0
    target_entropy: float | None = None
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "relu"
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive(self, "lr", "policy_lr", "alpha")
        validation.non_negative(self, "bc_iters")
        if self.cql_alpha is not None:
            validation.non_negative(self, "cql_alpha")
        validation.unit_interval(self, "gamma", "tau")
        validation.counts(self, "num_actions")
        validation.network(self)
        validation.optional_number(self, "target_entropy")


class TwinQ(nn.Module):
    """``count`` Q-networks over (observation, action) rows, evaluated together: each layer is
    one batched matmul for all of them."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], activation: str, count: int = 2):
        super().__init__()
        widths = (in_dim, *hidden, 1)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(widths):
            bound = 1 / math.sqrt(fan_in)  # nn.Linear's initialization
            weight = torch.empty(count, fan_in, fan_out).uniform_(-bound, bound)
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.empty(count, 1, fan_out).uniform_(-bound, bound)))
        self.activation = torch.tanh if activation == "tanh" else torch.relu

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Q of each critic for observations and actions of any leading shape: (count, *shape)."""
        xa = torch.cat([x, a], dim=-1)
        h = xa.reshape(1, -1, xa.shape[-1]).expand(len(self.weights[0]), -1, -1)
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(bias, h, weight)
            if i < len(self.weights) - 1:
                h = self.activation(h)
        return h.reshape(-1, *xa.shape[:-1])

    def export(self, prefix: str, index: int) -> dict[str, np.ndarray]:
        """Critic ``index`` in :class:`~pipeline.trainers.networks.MLP`'s checkpoint layout."""
        arrays = {}
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            arrays[f"{prefix}.{i}.weight"] = weight[index].detach().T.numpy().copy()
            arrays[f"{prefix}.{i}.bias"] = bias[index, 0].detach().numpy().copy()
        return arrays


class CQL:
    """``update(batch)`` takes transitions: observations, actions, rewards, next_observations,
    terminateds. Discrete actions use a Q-network, Box ones an actor and twin critics."""

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
        default_alpha = 1.0 if self.discrete else 20.0
        self.cql_alpha = default_alpha if c.cql_alpha is None else c.cql_alpha
        self.updates = 0
        obs_dim, act_dim = flattening.flatdim(observation_space), flattening.flatdim(action_space)
        if self.discrete:
            self.q = MLP(obs_dim, c.hidden, act_dim, c.activation)
            self.q_target = copy.deepcopy(self.q)
            self.optimizer = torch.optim.Adam(self.q.parameters(), lr=c.lr)
            return
        self.low, self.high = box_bounds(cast(gym.spaces.Box, action_space))
        self.actor = MLP(obs_dim, c.hidden, 2 * act_dim, c.activation)
        self.critics = TwinQ(obs_dim + act_dim, c.hidden, c.activation)
        self.critics_target = copy.deepcopy(self.critics)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(c.alpha)))
        self.target_entropy = -act_dim if c.target_entropy is None else c.target_entropy
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=c.policy_lr)
        self.critic_optimizer = torch.optim.Adam(self.critics.parameters(), lr=c.lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=c.lr)

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
        loss = td_loss + self.cql_alpha * penalty
        gradient_step(self.optimizer, loss)
        polyak(self.q, self.q_target, c.tau)
        return {
            "loss": loss.item(),
            "td_loss": td_loss.item(),
            "cql_penalty": penalty.item(),
            "q": q_data.mean().item(),
        }

    def _update_box(self, batch: Batch) -> dict[str, float]:
        c, n = self.config, self.config.num_actions
        x = observations_tensor(self.observation_space, batch.observations)
        a = actions_tensor(self.action_space, batch.actions)
        x2 = observations_tensor(self.observation_space, batch.next_observations)
        rows = len(x)
        with torch.no_grad():
            pi_now, logp_now = self._sample(x, n)
            pi_next, logp_next = self._sample(x2, n)
            # deterministic backup, no entropy bonus: the CQL paper's code and RLlib's default
            following = self.critics_target(x2, pi_next[:, 0]).min(0).values
            target = column(batch.rewards) + c.gamma * (1 - column(batch.terminateds)) * following
        # one critic pass over the data's action and 3n sampled ones, all at s (appendix F)
        uniform = self.low + (self.high - self.low) * torch.rand(rows, n, len(self.low))
        actions = torch.cat([a.unsqueeze(1), uniform, pi_now, pi_next], dim=1)
        q = self.critics(x.unsqueeze(1).expand(-1, 1 + 3 * n, -1), actions)
        q_data = q[..., 0]  # (critic, row)
        td_loss = 0.5 * (q_data - target).pow(2).mean(1).sum()
        log_uniform = -torch.log(self.high - self.low).sum().expand(rows, n)
        log_density = torch.cat([log_uniform, logp_now, logp_next], dim=1)
        # CQL(H), eq. 4: logsumexp by importance sampling, q / density averaged over 3n draws
        logsumexp = torch.logsumexp(q[..., 1:] - log_density, dim=-1) - math.log(3 * n)
        penalty = (logsumexp - q_data).mean(1).sum()
        loss = td_loss + self.cql_alpha * penalty
        gradient_step(self.critic_optimizer, loss)
        metrics = self._actor_alpha_step(x, a)
        polyak(self.critics, self.critics_target, c.tau)
        return {
            "loss": loss.item(),
            "td_loss": td_loss.item(),
            "cql_penalty": penalty.item(),
            "q": q_data[0].mean().item(),
            **metrics,
        }

    def _sample(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` actions per row (rows, n, act_dim) and their log-densities, one actor pass."""
        out = self.actor(x).unsqueeze(1).expand(-1, n, -1)
        return squashed_sample(out, self.low, self.high)

    def _actor_alpha_step(self, x: torch.Tensor, a: torch.Tensor) -> dict[str, float]:
        """SAC's actor step (eq. 7), or behaviour cloning for the first ``bc_iters`` updates,
        then the temperature step (eq. 18)."""
        alpha = self.log_alpha.exp().detach()
        out = self.actor(x)
        actions, logp = squashed_sample(out, self.low, self.high)
        if self.updates < self.config.bc_iters:
            objective = squashed_logp(out, a, self.low, self.high)
        else:
            objective = self.critics(x, actions).min(0).values
        actor_loss = (alpha * logp - objective).mean()
        gradient_step(self.actor_optimizer, actor_loss)
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        gradient_step(self.alpha_optimizer, alpha_loss)
        return {
            "actor_loss": actor_loss.item(),
            "alpha": alpha.item(),
            "entropy": -logp.mean().item(),
        }

    def checkpoint(self, version: int) -> Checkpoint:
        """Box: the actor as a squashed-Gaussian policy, the critics riding along as ``q1.*`` and
        ``q2.*``. Discrete: the Q-network as the logits of a categorical policy."""
        spec = ModelSpec(
            self.observation_space,
            self.action_space,
            hidden=self.config.hidden,
            activation=self.config.activation,
            distribution="categorical" if self.discrete else "squashed_gaussian",
            algorithm=self.algorithm,
        )
        if self.discrete:
            return Checkpoint(version, spec, export("pi", self.q))
        weights = {
            **export("pi", self.actor),
            **self.critics.export("q1", 0),
            **self.critics.export("q2", 1),
        }
        return Checkpoint(version, spec, weights)

    def state_dict(self) -> dict[str, np.ndarray]:
        return _STATE[self.discrete].arrays(self)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        _STATE[self.discrete].load(self, arrays)


_STATE = {
    True: state.Parts(modules=("q", "q_target"), optimizers=("optimizer",)),
    False: state.Parts(
        modules=("actor", "critics", "critics_target"),
        optimizers=("actor_optimizer", "critic_optimizer", "alpha_optimizer"),
        values=("log_alpha", "updates"),
    ),
}

"""PPO with the clipped surrogate (Schulman et al. 2017), learning from logged rollouts.

Online, the rows come from clients acting with published checkpoints, so the behaviour policy of a
row is the checkpoint version it logged (``policy_version``), and its probability is the logged
``action_logp``. The importance ratio is taken against that *behaviour* log-probability, not
against a recomputation: the trainer may no longer hold the weights that acted, and the logged
value is exactly the probability the row was sampled with.

Stale rows. Clients act with the newest checkpoint they have, so rows lag the trainer by a
version or more. PPO's clipping already bounds a step relative to the behaviour policy, and that
correction stays sound for a small lag; for a large lag the ratio is far from 1 on most rows, the
clipped objective gives them zero gradient anyway, and they only add noise. So:

- rows with ``policy_version < version - max_policy_lag`` (``version`` being the newest checkpoint
  this trainer exported) and rows without a behaviour ``action_logp`` (NaN) are left out of the
  policy loss;
- every row still counts for the value loss and for GAE, which need no behaviour probability
  (the value function is fit to targets from the current critic; a slightly stale target is the
  usual price of off-policy value learning).

``update(batch)`` takes rows of whole episodes (or episode fragments) in ``t`` order, as
``InputReader(episodes=True)`` yields them, concatenated; truncated episodes bootstrap from
``V(next_observation)`` (see :mod:`pipeline.trainers.returns`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from pipeline import flattening
from pipeline.batch import Batch
from pipeline.policy import Checkpoint
from pipeline.trainers import state, validation
from pipeline.trainers.networks import (
    MLP,
    PolicyNetwork,
    actions_tensor,
    check_action_space,
    column,
    export,
    observations_tensor,
)
from pipeline.trainers.returns import gae


@dataclass(frozen=True)
class PPOConfig:
    """Attributes (CleanRL's names):
    lr: Adam step size.
    gamma, gae_lambda: discount and GAE's lambda.
    clip_coef: the surrogate's clip range epsilon.
    ent_coef, vf_coef: weights of the entropy bonus and the value loss.
    max_grad_norm: gradient clipping.
    update_epochs: passes over each batch.
    num_minibatches: minibatches per pass.
    norm_adv: normalize advantages per minibatch.
    max_policy_lag: rows older than this many versions leave the policy loss (see above).
    hidden, activation: shape of policy and value networks.
    seed: seeds initial weights and minibatch order.
    """

    lr: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    update_epochs: int = 10
    num_minibatches: int = 4
    norm_adv: bool = True
    max_policy_lag: int = 1
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive(self, "lr", "clip_coef", "max_grad_norm")
        validation.non_negative(self, "ent_coef", "vf_coef", "max_policy_lag")
        validation.unit_interval(self, "gamma", "gae_lambda")
        validation.counts(self, "update_epochs", "num_minibatches")
        validation.network(self)


class PPO:
    """``update(batch)`` takes whole-episode rows with ``action_logps`` and ``policy_versions``."""

    algorithm = "ppo"

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        config: PPOConfig | None = None,
    ) -> None:
        check_action_space("PPO", action_space, (gym.spaces.Discrete, gym.spaces.Box))
        self.config = c = config or PPOConfig()
        torch.manual_seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        self.policy = PolicyNetwork(observation_space, action_space, c.hidden, c.activation)
        self.value = MLP(flattening.flatdim(observation_space), c.hidden, 1, c.activation)
        self.optimizer = torch.optim.Adam(
            [*self.policy.parameters(), *self.value.parameters()], lr=c.lr, eps=1e-5
        )
        self.version = 0  # the newest checkpoint exported; rows are judged stale against it
        self.updates = 0

    def fresh(self, batch: Batch) -> np.ndarray:
        """Rows that enter the policy loss: a behaviour logp, and at most max_policy_lag old."""
        versions = np.asarray(batch.policy_versions, np.int64)
        logps = np.asarray(batch.action_logps, np.float64)
        return np.isfinite(logps) & (versions >= self.version - self.config.max_policy_lag)

    @torch.no_grad()
    def advantages(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """GAE advantages and value targets under the current value network."""
        space = self.policy.observation_space
        values = self.value(observations_tensor(space, batch.observations)).squeeze(-1)
        next_values = self.value(observations_tensor(space, batch.next_observations)).squeeze(-1)
        c = self.config
        return gae(
            batch.rewards,
            values.numpy(),
            next_values.numpy(),
            batch.terminateds,
            batch.truncateds,
            c.gamma,
            c.gae_lambda,
            episode_ids=batch.episode_ids,
        )

    def update(self, batch: Batch) -> dict[str, float]:
        c = self.config
        advantages, returns = self.advantages(batch)
        x = observations_tensor(self.policy.observation_space, batch.observations)
        actions = actions_tensor(self.policy.action_space, batch.actions)
        fresh = torch.as_tensor(self.fresh(batch), dtype=torch.float32)
        behaviour = torch.nan_to_num(column(batch.action_logps))
        adv, ret = column(advantages), column(returns)
        size = max(1, len(batch) // c.num_minibatches)
        sums: dict[str, float] = {}
        for _ in range(c.update_epochs):
            order = torch.as_tensor(self.rng.permutation(len(batch)))
            for start in range(0, len(batch), size):
                rows = order[start : start + size]
                m = self._minibatch(x[rows], actions[rows], behaviour[rows], adv[rows],
                                    ret[rows], fresh[rows])  # fmt: skip
                for key, value in m.items():
                    sums[key] = sums.get(key, 0.0) + value
        self.updates += 1
        steps = c.update_epochs * -(-len(batch) // size)
        metrics = {key: value / steps for key, value in sums.items()}
        return {**metrics, "fresh_fraction": fresh.mean().item()}

    def _minibatch(
        self,
        x: torch.Tensor,
        actions: torch.Tensor,
        behaviour: torch.Tensor,
        adv: torch.Tensor,
        ret: torch.Tensor,
        fresh: torch.Tensor,
    ) -> dict[str, float]:
        """One gradient step on the losses of PPO's eq. 9, read in the paper's order."""
        c = self.config
        logp, entropy = self.policy.log_prob_entropy(x, actions)
        log_ratio = logp - behaviour
        ratio = log_ratio.exp()
        if c.norm_adv and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        count = fresh.sum().clamp(min=1.0)
        # clipped surrogate (eq. 7), over fresh rows only
        surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef))
        policy_loss = (surrogate * fresh).sum() / count
        value_loss = 0.5 * (self.value(x).squeeze(-1) - ret).pow(2).mean()
        entropy_loss = (entropy * fresh).sum() / count
        loss = policy_loss - c.ent_coef * entropy_loss + c.vf_coef * value_loss
        self.optimizer.zero_grad()
        loss.backward()
        parameters = [*self.policy.parameters(), *self.value.parameters()]
        torch.nn.utils.clip_grad_norm_(parameters, c.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            approx_kl = ((((ratio - 1) - log_ratio) * fresh).sum() / count).item()
            clipfrac = ((((ratio - 1).abs() > c.clip_coef).float() * fresh).sum() / count).item()
        return {"loss": loss.item(), "policy_loss": policy_loss.item(),
                "value_loss": value_loss.item(), "entropy": entropy_loss.item(),
                "approx_kl": approx_kl, "clipfrac": clipfrac}  # fmt: skip

    def checkpoint(self, version: int) -> Checkpoint:
        """The policy (``pi.*``, ``log_std``) with ``vf.*``; rows are now judged against it."""
        self.version = version
        return self.policy.checkpoint(version, self.algorithm, export("vf", self.value))

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            **state.module_arrays("policy", self.policy),
            **state.module_arrays("value", self.value),
            **state.optimizer_arrays("optimizer", self.optimizer),
            "version": np.asarray(self.version),
            "updates": np.asarray(self.updates),
        }

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        state.load_module("policy", self.policy, arrays)
        state.load_module("value", self.value, arrays)
        state.load_optimizer("optimizer", self.optimizer, arrays)
        self.version = int(arrays["version"])
        self.updates = int(arrays["updates"])

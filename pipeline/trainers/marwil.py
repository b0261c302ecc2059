"""MARWIL: behaviour cloning weighted by exponentiated advantages (Wang et al. 2018).

The policy loss is ``-E[exp(beta * A / c) * log pi(a|s)]`` with ``A = G - V(s)``, the Monte Carlo
return ``G`` minus a learned value baseline, and ``c`` a moving average of ``E[A^2]`` (the
paper's normalization, as RLlib implements it). ``beta = 0`` is plain behaviour cloning.
Returns need whole episodes; computed over the whole dataset (:meth:`MARWIL.with_targets`), they
let minibatches be shuffled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from pipeline.dataset.batch import Batch
from pipeline.format import flattening
from pipeline.policy.checkpoint import Checkpoint
from pipeline.trainers import state, validation
from pipeline.trainers.networks import (
    MLP,
    PolicyNetwork,
    actions_tensor,
    check_action_space,
    column,
    export,
    gradient_step,
    observations_tensor,
)
from pipeline.trainers.returns import discounted_returns


@dataclass(frozen=True)
class MARWILConfig:
    """Attributes:
    lr: Adam step size (policy and value network).
    gamma: discount of the Monte Carlo returns.
    beta: advantage temperature; 0 gives behaviour cloning.
    vf_coef: weight of the value loss.
    max_weight: clamp of the exponentiated advantage, so one lucky row cannot dominate.
    norm_update_rate: step of the moving average of squared advantages (RLlib: 1e-8).
    hidden, activation: the networks' shape.
    seed: seeds the initial weights.
    """

    lr: float = 1e-3
    gamma: float = 0.99
    beta: float = 1.0
    vf_coef: float = 1.0
    max_weight: float = 20.0
    norm_update_rate: float = 1e-8
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive(self, "lr", "max_weight")
        validation.non_negative(self, "beta", "vf_coef")
        validation.unit_interval(self, "gamma", "norm_update_rate")
        validation.network(self)


class MARWIL:
    """``update(batch)`` takes transitions with ``extras["returns"]``, or rows of whole episodes."""

    algorithm = "marwil"

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        config: MARWILConfig | None = None,
    ) -> None:
        check_action_space("MARWIL", action_space, (gym.spaces.Discrete, gym.spaces.Box))
        self.config = config or MARWILConfig()
        torch.manual_seed(self.config.seed)
        c = self.config
        self.policy = PolicyNetwork(observation_space, action_space, c.hidden, c.activation)
        self.value = MLP(flattening.flatdim(observation_space), c.hidden, 1, c.activation)
        self.optimizer = torch.optim.Adam(
            [*self.policy.parameters(), *self.value.parameters()], lr=c.lr
        )
        self.squared_advantage_norm = 100.0  # RLlib's starting value
        self.updates = 0

    @torch.no_grad()
    def returns(self, batch: Batch) -> np.ndarray:
        """Discounted returns of rows of whole episodes; truncations bootstrap from V."""
        next_x = observations_tensor(self.policy.observation_space, batch.next_observations)
        next_values = self.value(next_x).squeeze(-1).numpy()
        return discounted_returns(
            batch.rewards,
            batch.terminateds,
            batch.truncateds,
            self.config.gamma,
            next_values=next_values,
            episode_ids=batch.episode_ids,
        )

    def with_targets(self, batch: Batch) -> Batch:
        """Rows of whole episodes with ``extras["returns"]`` under the current V: the offline loop
        refreshes them as V learns, then samples shuffled minibatches of them."""
        return batch.replace(extras={**batch.extras, "returns": self.returns(batch)})

    def update(self, batch: Batch) -> dict[str, float]:
        c = self.config
        returns = batch.extras.get("returns")
        target = column(self.returns(batch) if returns is None else returns)
        x = observations_tensor(self.policy.observation_space, batch.observations)
        actions = actions_tensor(self.policy.action_space, batch.actions)
        values = self.value(x).squeeze(-1)
        advantages = (target - values).detach()
        # moving average of E[A^2] normalizes the advantages (Wang et al. 2018, sec. 3.2)
        self.squared_advantage_norm += c.norm_update_rate * (
            advantages.pow(2).mean().item() - self.squared_advantage_norm
        )
        scale = c.beta / (1e-8 + self.squared_advantage_norm**0.5)
        weights = torch.exp(scale * advantages).clamp(max=c.max_weight)
        logp, _ = self.policy.log_prob_entropy(x, actions)
        policy_loss = -(weights * logp).mean()
        value_loss = 0.5 * (values - target).pow(2).mean()
        loss = policy_loss + c.vf_coef * value_loss
        gradient_step(self.optimizer, loss)
        self.updates += 1
        return {
            "loss": loss.item(),
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "logp": logp.mean().item(),
            "mean_weight": weights.mean().item(),
        }

    def checkpoint(self, version: int) -> Checkpoint:
        """The policy (``pi.*``) with the value net riding along as ``vf.*``."""
        return self.policy.checkpoint(version, self.algorithm, export("vf", self.value))

    def state_dict(self) -> dict[str, np.ndarray]:
        return _STATE.arrays(self)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        _STATE.load(self, arrays)


_STATE = state.Parts(
    modules=("policy", "value"),
    optimizers=("optimizer",),
    values=("squared_advantage_norm", "updates"),
)

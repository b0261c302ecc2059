"""Behaviour cloning: maximum likelihood of the logged actions (Pomerleau 1991; RLlib's BC).

Discrete actions fit a categorical policy, Box actions a Gaussian with a state-independent
``log_std``. BC ignores rewards: it copies whoever logged the data, so it is only as good as the
behaviour was (MARWIL weights the same loss by advantage to do better).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from pipeline.dataset.batch import Batch
from pipeline.policy.checkpoint import Checkpoint
from pipeline.trainers import state, validation
from pipeline.trainers.networks import (
    PolicyNetwork,
    actions_tensor,
    check_action_space,
    gradient_step,
    observations_tensor,
)


@dataclass(frozen=True)
class BCConfig:
    """Attributes:
    lr: Adam step size.
    hidden: hidden layer widths of the policy.
    activation: "tanh" or "relu".
    ent_coef: entropy bonus (0 is plain maximum likelihood).
    seed: seeds the network's initial weights.
    """

    lr: float = 1e-3
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    ent_coef: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive(self, "lr")
        validation.non_negative(self, "ent_coef")
        validation.network(self)


class BC:
    """``update(batch)`` takes any batch of transitions; only observations and actions are used."""

    algorithm = "bc"

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        config: BCConfig | None = None,
    ) -> None:
        check_action_space("BC", action_space, (gym.spaces.Discrete, gym.spaces.Box))
        self.config = config or BCConfig()
        torch.manual_seed(self.config.seed)
        self.policy = PolicyNetwork(
            observation_space, action_space, self.config.hidden, self.config.activation
        )
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.config.lr)
        self.updates = 0

    def update(self, batch: Batch) -> dict[str, float]:
        x = observations_tensor(self.policy.observation_space, batch.observations)
        actions = actions_tensor(self.policy.action_space, batch.actions)
        logp, entropy = self.policy.log_prob_entropy(x, actions)
        loss = -logp.mean() - self.config.ent_coef * entropy.mean()
        gradient_step(self.optimizer, loss)
        self.updates += 1
        return {"loss": loss.item(), "logp": logp.mean().item(), "entropy": entropy.mean().item()}

    def checkpoint(self, version: int) -> Checkpoint:
        """The policy as a :mod:`pipeline.policy` checkpoint, for clients, server and resuming."""
        return self.policy.checkpoint(version, self.algorithm)

    def state_dict(self) -> dict[str, np.ndarray]:
        return _STATE.arrays(self)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        _STATE.load(self, arrays)


_STATE = state.Parts(modules=("policy",), optimizers=("optimizer",))

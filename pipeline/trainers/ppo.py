"""PPO with the clipped surrogate (Schulman et al. 2017), learning from logged rollouts.

Online, the rows come from clients acting with published checkpoints, so the behaviour policy of a
row is the checkpoint version it logged (``policy_version``), and its probability is the logged
``action_logp``: the trainer may no longer hold the weights that acted, and the logged value is
exactly the probability the row was sampled with.

Stale rows. Clients act with the newest checkpoint they have pulled, and their rows reach the
trainer through uploads and committed shards, so online rows are usually a few versions behind
the trainer (it publishes a version per update, several a second). Dropping them would throw
away most of the data (93-95% of it, measured on CartPole with two clients), so they are
corrected instead, as decoupled PPO does (Hilton et al. 2022, "Batch size-invariance for policy
optimization", eq. 2):

- the clip is taken around the *proximal* policy, the trainer's own weights when the update
  starts (``ratio = pi / pi_prox``), not around the behaviour policy: with a stale behaviour
  policy the behaviour ratio is far from 1 on most rows, and clipping around it would give those
  rows no gradient at all;
- the behaviour correction ``pi_prox / mu`` (``mu`` = the logged ``action_logp``) multiplies each
  row's clipped term, truncated at ``rho_bar`` as V-trace truncates its weights (Espeholt et al.
  2018), which bounds the variance a very unlikely behaviour action would bring; for rows acted
  with the trainer's newest version the weight is 1 and this is plain PPO;
- rows more than ``max_policy_lag`` versions old (``version`` being the newest checkpoint this
  trainer exported), and rows without a behaviour ``action_logp`` (NaN: acted at random before a
  checkpoint existed), are left out of the policy loss: past some lag the corrections are mostly
  truncation and the rows only add variance;
- every row still counts for the value loss and GAE, which need no behaviour probability (the
  value function is fit to targets from the current critic; a slightly stale target is the
  usual price of off-policy value learning).

``update(batch)`` takes each episode's rows contiguous, in ``t`` order: whole episodes, or the
fragments a follower of a live dataset reads; a fragment that does not end its episode bootstraps
from ``V(next_observation)``, as a truncated episode does (:mod:`pipeline.trainers.returns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from pipeline.dataset.batch import Batch
from pipeline.format import flattening
from pipeline.policy.checkpoint import Checkpoint
from pipeline.trainers import state, validation
from pipeline.trainers.distributed import average_gradients
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
    max_grad_norm: the policy's and the value's gradients are each clipped to this norm.
    update_epochs: passes over each batch.
    num_minibatches: minibatches per pass.
    norm_adv: normalize advantages per minibatch.
    max_policy_lag: rows older than this many versions leave the policy loss (see above).
    rho_bar: truncation of the behaviour correction ``pi_prox / mu`` (see above).
    anneal_updates: when set, ``lr`` and ``clip_coef`` fall linearly to 0 over this many
        updates (RL-Zoo's ``lin_`` schedules, counted in updates: the trainer of a live dataset
        knows its updates, not the steps its clients will take); None keeps them constant.
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
    max_policy_lag: int = 16
    rho_bar: float = 1.0
    anneal_updates: int | None = None
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive(self, "lr", "clip_coef", "max_grad_norm", "rho_bar")
        validation.non_negative(self, "ent_coef", "vf_coef", "max_policy_lag")
        validation.unit_interval(self, "gamma", "gae_lambda")
        validation.counts(self, "update_epochs", "num_minibatches")
        validation.network(self)
        if self.anneal_updates is not None:
            validation.counts(self, "anneal_updates")

    def progress_remaining(self, updates: int) -> float:
        """The fraction of ``lr`` and ``clip_coef`` in force after ``updates`` updates."""
        if self.anneal_updates is None:
            return 1.0
        return max(0.0, 1.0 - updates / self.anneal_updates)


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
        _orthogonal(self.policy.pi, output_gain=0.01)
        _orthogonal(self.value, output_gain=1.0)
        # clipped apart: see _minibatch
        self.groups = (list(self.policy.parameters()), list(self.value.parameters()))
        self.trainable = [*self.groups[0], *self.groups[1]]
        # fused: one kernel for all parameters; a third of a small network's step otherwise
        self.optimizer = torch.optim.Adam(self.trainable, lr=c.lr, eps=1e-5, fused=True)
        self.version = 0  # the newest checkpoint exported; rows are judged stale against it
        self.updates = 0

    def fresh(self, batch: Batch) -> np.ndarray:
        """Rows that enter the policy loss: a behaviour logp, and at most max_policy_lag old
        (this makes PPO an ``OnPolicy`` trainer)."""
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
            ts=batch.ts,
        )

    def update(self, batch: Batch) -> dict[str, float]:
        c = self.config
        remaining = c.progress_remaining(self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = c.lr * remaining
        clip = max(c.clip_coef * remaining, 1e-8)
        advantages, returns = self.advantages(batch)
        x = observations_tensor(self.policy.observation_space, batch.observations)
        actions = actions_tensor(self.policy.action_space, batch.actions)
        fresh = torch.as_tensor(self.fresh(batch), dtype=torch.float32)
        with torch.no_grad():
            proximal, _ = self.policy.log_prob_entropy(x, actions)
        behaviour = torch.nan_to_num(column(batch.action_logps))  # NaN rows are not fresh
        # decoupled PPO's behaviour correction pi_prox / mu, truncated (see the module docstring)
        rho = (proximal - behaviour).exp().clamp(max=c.rho_bar) * fresh
        adv, ret = column(advantages), column(returns)
        size = max(1, len(batch) // c.num_minibatches)
        if c.norm_adv and size >= len(batch) > 1:  # one minibatch: normalized once, not per pass
            adv = _normalized(adv)
        columns = (x, actions, proximal, adv, ret, fresh, rho)
        sums: dict[str, float] = {}
        for epoch in range(c.update_epochs):
            last = epoch == c.update_epochs - 1  # metrics of the last pass only: they cost
            if size >= len(batch):  # one minibatch: its order does not matter
                self._minibatch(columns, clip, sums if last else None, normalize=False)
                continue
            order = torch.as_tensor(self.rng.permutation(len(batch)))
            for start in range(0, len(batch), size):
                rows = order[start : start + size]
                parts = tuple(column[rows] for column in columns)
                self._minibatch(parts, clip, sums if last else None)
        self.updates += 1
        steps = -(-len(batch) // size)
        metrics = {key: value / steps for key, value in sums.items()}
        versions = np.asarray(batch.policy_versions, np.float64)
        lags = self.version - versions[versions >= 0]  # -1: acted before any checkpoint
        return {
            **metrics,
            "fresh_fraction": fresh.mean().item(),
            "rho": (rho.sum() / fresh.sum().clamp(min=1.0)).item(),
            "policy_lag": float(lags.mean()) if len(lags) else 0.0,
        }

    def _minibatch(
        self,
        columns: tuple[torch.Tensor, ...],
        clip: float,
        sums: dict[str, float] | None,
        normalize: bool = True,
    ) -> None:
        """One gradient step on the losses of PPO's eq. 9, read in the paper's order; its
        metrics are added to ``sums`` when given. ``normalize``: normalize the advantages here
        (False: the caller did, once for every pass)."""
        c = self.config
        x, actions, proximal, adv, ret, fresh, rho = columns
        logp, entropy = self.policy.log_prob_entropy(x, actions)
        log_ratio = logp - proximal
        ratio = log_ratio.exp()
        if normalize and c.norm_adv and len(adv) > 1:
            adv = _normalized(adv)
        count = fresh.sum().clamp(min=1.0)
        # clipped surrogate (eq. 7) around the proximal policy, behaviour-corrected by rho
        surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
        policy_loss = (surrogate * rho).sum() / count
        value_loss = 0.5 * (self.value(x).squeeze(-1) - ret).pow(2).mean()
        entropy_loss = (entropy * fresh).sum() / count
        loss = policy_loss + c.vf_coef * value_loss
        if c.ent_coef:  # no backward pass through a term that weighs nothing
            loss = loss - c.ent_coef * entropy_loss
        self.optimizer.zero_grad()
        loss.backward()
        average_gradients(self.optimizer)  # across data-parallel ranks, when there are any
        # the policy's and the value's gradients clipped apart: under one joint norm, a value
        # spike (a long episode's unforeseen fall) shrinks the policy's step to nothing. Measured
        # on CartPole, rows two versions stale, 16 seeds: env steps to 475 within 19k-33k apart,
        # 18k-49k joint
        for group in self.groups:
            _clip_grad_norm(group, c.max_grad_norm)
        self.optimizer.step()
        if sums is None:
            return
        with torch.no_grad():
            approx_kl = (((ratio - 1) - log_ratio) * fresh).sum() / count
            clipfrac = (((ratio - 1).abs() > clip).float() * fresh).sum() / count
        values = {
            "loss": loss,
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy_loss,
            "approx_kl": approx_kl,
            "clipfrac": clipfrac,
        }
        for key, value in values.items():
            sums[key] = sums.get(key, 0.0) + value.item()

    def checkpoint(self, version: int) -> Checkpoint:
        """The policy (``pi.*``, ``log_std``) with ``vf.*``; rows are now judged against it."""
        self.version = version
        return self.policy.checkpoint(version, self.algorithm, export("vf", self.value))

    def state_dict(self) -> dict[str, np.ndarray]:
        return _STATE.arrays(self)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        _STATE.load(self, arrays)


_STATE = state.Parts(
    modules=("policy", "value"), optimizers=("optimizer",), values=("version", "updates")
)


def _normalized(adv: torch.Tensor) -> torch.Tensor:
    return (adv - adv.mean()) / (adv.std() + 1e-8)


@torch.no_grad()
def _clip_grad_norm(parameters: Sequence[torch.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_``'s scaling (to ``max_norm`` over the gradients' joint
    L2 norm, plus 1e-6), with the norm taken over the gradients laid end to end: the same scale
    but for float rounding, in 59 us for a 64x64 network's 7 tensors against 103, most of which
    is torch grouping them by device and type; an update clips twice in each gradient step."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)


@torch.no_grad()
def _orthogonal(network: MLP, output_gain: float) -> None:
    """Orthogonal weights, zero biases; the policy's output layer 100x smaller, so the first
    policy is near uniform (Andrychowicz et al. 2021, "What matters in on-policy RL", C57;
    CleanRL's ``layer_init``, SB3's ``ortho_init``)."""
    layers = [cast(torch.nn.Linear, layer) for layer in network.layers]
    for layer in layers:
        gain = output_gain if layer is layers[-1] else float(np.sqrt(2))
        torch.nn.init.orthogonal_(layer.weight, gain)
        torch.nn.init.zeros_(layer.bias)

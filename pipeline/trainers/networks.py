"""The small pieces every trainer builds its networks from, in the checkpoint's layout.

An :class:`MLP` keeps its linear layers in ``layers``, so ``layers.{i}.weight`` exports as
``pi.{i}.weight`` (or ``vf.{i}``, ``q1.{i}`` ...) exactly as :mod:`pipeline.policy` reads it. The
log-probabilities here are the ones :class:`pipeline.policy.NumpyPolicy` computes, so a behaviour
``action_logp`` logged by a client and the trainer's own agree for the same weights.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pipeline.errors import ConfigError
from pipeline.format import flattening
from pipeline.policy import encoder
from pipeline.policy.checkpoint import LOG_STD_MAX, LOG_STD_MIN, Checkpoint, ModelSpec
from pipeline.trainers.distributed import average_gradients


class MLP(nn.Module):
    """Linear layers with one activation between them, none after the last."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str):
        super().__init__()
        widths = (in_dim, *hidden, out_dim)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.activation = torch.tanh if activation == "tanh" else torch.relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        out: torch.Tensor = self.layers[-1](x)
        return out


def export(prefix: str, network: MLP) -> dict[str, np.ndarray]:
    """An MLP's weights as checkpoint arrays named ``{prefix}.{i}.weight`` / ``.bias``."""
    arrays = {}
    for i, module in enumerate(network.layers):
        layer = cast(nn.Linear, module)
        arrays[f"{prefix}.{i}.weight"] = layer.weight.detach().cpu().numpy().copy()
        arrays[f"{prefix}.{i}.bias"] = layer.bias.detach().cpu().numpy().copy()
    return arrays


def check_action_space(owner: str, space: gym.Space[Any], allowed: tuple[type, ...]) -> None:
    """Policies act in Discrete (categorical) or Box (Gaussian) spaces; say which this one is."""
    if not isinstance(space, allowed):
        names = " or ".join(kind.__name__ for kind in allowed)
        raise ConfigError(owner, "action_space", f"a {names} space", str(space))


def observations_tensor(space: gym.Space[Any], observations: Any) -> torch.Tensor:
    """Observations of any supported space as float32 rows (one-hot discretes)."""
    return torch.as_tensor(flattening.flatten_batch(space, _numpy(observations)))


def actions_tensor(space: gym.Space[Any], actions: Any) -> torch.Tensor:
    """Discrete actions as indices from 0; Box actions as float32 rows."""
    array = _numpy(actions)
    if isinstance(space, gym.spaces.Discrete):
        return torch.as_tensor(np.asarray(array, np.int64) - int(space.start))
    return torch.as_tensor(np.asarray(array, np.float32).reshape(len(array), -1))


def column(values: Any) -> torch.Tensor:
    """A per-row numeric column as float32."""
    return torch.as_tensor(np.asarray(_numpy(values), np.float32))


def gaussian_logp(mean: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """log N(u; mean, exp(log_std)), summed over action dimensions."""
    z = (u - mean) / log_std.exp()
    return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def squashed_sample(
    out: torch.Tensor, low: torch.Tensor, high: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterized action and its log-probability from a squashed-Gaussian output layer."""
    mean, log_std = out.chunk(2, dim=-1)
    u = mean + log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp() * torch.randn_like(mean)
    return low + (torch.tanh(u) + 1) / 2 * (high - low), _squashed_logp(out, u)


def squashed_logp(
    out: torch.Tensor, actions: torch.Tensor, low: torch.Tensor, high: torch.Tensor
) -> torch.Tensor:
    """Log-probability of given Box actions under a squashed Gaussian (for behaviour cloning)."""
    unit = (2 * (actions - low) / (high - low) - 1).clamp(-0.999, 0.999)
    return _squashed_logp(out, torch.atanh(unit))


def _squashed_logp(out: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    mean, log_std = out.chunk(2, dim=-1)
    # tanh change of variables, SAC (Haarnoja et al. 2018), appendix C, in a stable form
    correction = 2 * (math.log(2) - u - nn.functional.softplus(-2 * u))
    return gaussian_logp(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX), u) - correction.sum(-1)


def box_bounds(space: gym.spaces.Box) -> tuple[torch.Tensor, torch.Tensor]:
    low = torch.as_tensor(np.asarray(space.low, np.float32).reshape(-1))
    high = torch.as_tensor(np.asarray(space.high, np.float32).reshape(-1))
    return low, high


def gradient_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One optimizer step down ``loss``'s gradient; in a data-parallel run, down the gradient
    averaged over every rank's minibatch (:mod:`pipeline.trainers.distributed`)."""
    optimizer.zero_grad()
    loss.backward()
    average_gradients(optimizer)
    optimizer.step()


@torch.no_grad()
def polyak(net: nn.Module, target: nn.Module, tau: float) -> None:
    """Move ``target``'s parameters a step ``tau`` towards ``net``'s (Polyak averaging)."""
    for p, p_target in zip(net.parameters(), target.parameters(), strict=True):
        p_target.mul_(1 - tau).add_(tau * p)


def _numpy(values: Any) -> Any:
    """Tensors back to numpy (a Batch may have been moved to torch); nested values as they are."""
    if isinstance(values, torch.Tensor):
        return values.cpu().numpy()
    if isinstance(values, dict):
        return {key: _numpy(value) for key, value in values.items()}
    if isinstance(values, tuple):
        return tuple(_numpy(value) for value in values)
    return values


class ImageEncoder(nn.Module):
    """:mod:`pipeline.policy.encoder`'s CNN in torch, over flattened frames, exported as
    ``enc.{i}.*``; a trainer's policy picks it for image spaces."""

    def __init__(self, space: gym.Space[Any]) -> None:
        super().__init__()
        self.shape = cast(tuple[int, int, int], space.shape)
        channels = self.shape[2]
        self.convolutions = nn.ModuleList()
        for filters, kernel, stride in encoder.LAYERS:
            self.convolutions.append(nn.Conv2d(channels, filters, kernel, stride))
            channels = filters
        self.features = encoder.shapes(cast(gym.spaces.Box, space))[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, *self.shape).permute(0, 3, 1, 2) / 255.0
        for convolution in self.convolutions:
            x = torch.relu(convolution(x))
        return x.flatten(1)

    def export(self) -> dict[str, np.ndarray]:
        arrays = {}
        for i, module in enumerate(self.convolutions):
            layer = cast(nn.Conv2d, module)
            arrays[f"enc.{i}.weight"] = layer.weight.detach().cpu().numpy().copy()
            arrays[f"enc.{i}.bias"] = cast(torch.Tensor, layer.bias).detach().cpu().numpy().copy()
        return arrays


class PolicyNetwork(nn.Module):
    """A categorical (Discrete) or state-independent Gaussian (Box) policy over flat observations,
    exported as ``pi.*`` (plus ``log_std``) for :class:`pipeline.policy.NumpyPolicy`."""

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        hidden: tuple[int, ...],
        activation: str,
    ) -> None:
        super().__init__()
        self.observation_space, self.action_space = observation_space, action_space
        self.hidden, self.activation = hidden, activation
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        out_dim = flattening.flatdim(action_space)  # n for Discrete: the one-hot width
        self.enc = ImageEncoder(observation_space) if encoder.is_image(observation_space) else None
        features = self.enc.features if self.enc else flattening.flatdim(observation_space)
        self.pi = MLP(features, hidden, out_dim, activation)
        self.log_std = nn.Parameter(torch.zeros(0 if self.discrete else out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The output layer's values for flattened observations (frames through the CNN)."""
        out: torch.Tensor = self.pi(self.enc(x) if self.enc is not None else x)
        return out

    def log_prob_entropy(
        self, x: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of ``actions`` and the policy's entropy, per row."""
        out = self(x)
        if self.discrete:
            log_probs = torch.log_softmax(out, dim=-1)
            logp = log_probs.gather(1, actions.long().unsqueeze(1)).squeeze(1)
            return logp, -(log_probs.exp() * log_probs).sum(-1)
        log_std = self.log_std.expand_as(out)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)
        return gaussian_logp(out, log_std, actions), entropy

    def checkpoint(
        self, version: int, algorithm: str, extra: dict[str, np.ndarray] | None = None
    ) -> Checkpoint:
        """This policy as a :mod:`pipeline.policy` checkpoint; ``extra`` arrays ride along."""
        spec = ModelSpec(
            self.observation_space,
            self.action_space,
            hidden=self.hidden,
            activation=self.activation,
            distribution="categorical" if self.discrete else "gaussian",
            algorithm=algorithm,
            encoder="flat" if self.enc is None else "cnn",
        )
        arrays = {**export("pi", self.pi), **(extra or {})}
        if self.enc is not None:
            arrays.update(self.enc.export())
        if not self.discrete:
            arrays["log_std"] = self.log_std.detach().cpu().numpy().copy()
        return Checkpoint(version, spec, arrays)

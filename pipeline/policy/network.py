"""The numpy network that runs a checkpoint's policy anywhere: the client must not need torch.

:func:`policy_for` checks a checkpoint against the spaces it will act in before it is used, so a
checkpoint for other spaces is refused when it appears, not in every forward pass.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, cast

import gymnasium as gym
import numpy as np

from pipeline.dataset.batch import map_leaves
from pipeline.errors import DatasetError
from pipeline.format import flattening
from pipeline.policy import encoder
from pipeline.policy.checkpoint import LOG_STD_MAX, LOG_STD_MIN, Checkpoint
from pipeline.recording.batches import row_of


class NumpyPolicy:
    """Runs a checkpoint's policy network with numpy alone (the client must not need torch)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.version = checkpoint.version
        self.spec = checkpoint.spec
        _check_shapes(checkpoint)  # every array there, in its shape
        self._layers = [
            (
                checkpoint.weights[f"pi.{i}.weight"].T.astype(np.float32),
                checkpoint.weights[f"pi.{i}.bias"].astype(np.float32),
            )
            for i in range(len(self.spec.hidden) + 1)
        ]
        self._log_std = checkpoint.weights.get("log_std")
        self._activation = np.tanh if self.spec.activation == "tanh" else _relu
        space = self.spec.observation_space
        self._convolutions = [
            (checkpoint.weights[f"enc.{i}.weight"], checkpoint.weights[f"enc.{i}.bias"])
            for i in range(len(encoder.LAYERS) if self.spec.encoder == "cnn" else 0)
        ]
        # a Box flattens to its values row-major: a reshape, not a trip through flatten_batch
        flat = isinstance(space, gym.spaces.Box) and not self._convolutions
        self._box_width = flattening.flatdim(space) if flat else None
        self._start = (
            int(self.spec.action_space.start)
            if isinstance(self.spec.action_space, gym.spaces.Discrete)
            else 0
        )

    def forward(self, observations: Any) -> np.ndarray:
        """The output layer's raw values for a batch of observations."""
        if self._convolutions:
            shape = self.spec.observation_space.shape
            x = encoder.encode(observations, self._convolutions, cast(tuple[int, ...], shape))
        elif self._box_width is not None:
            x = np.asarray(observations, np.float32).reshape(-1, self._box_width)
        else:
            x = flattening.flatten_batch(self.spec.observation_space, observations)
        for weight, bias in self._layers[:-1]:
            x = self._activation(x @ weight + bias)
        weight, bias = self._layers[-1]
        out: np.ndarray = x @ weight + bias
        return out

    def act_one(
        self, observation: Any, rng: np.random.Generator, explore: bool = True
    ) -> tuple[Any, float]:
        """One observation's action and its log-probability (a client's step loop).

        For a batch of one, numpy's cost per call is most of the work, so a Box observation with
        a categorical head runs as vectors and samples by inverse CDF in Python (exact, like the
        Gumbel-max draw of :meth:`act`, but from another stream of the same ``rng``); anything
        else is :meth:`act` on a batch of one.
        """
        if self._box_width is None or self.spec.distribution != "categorical":
            actions, logp = self.act(
                map_leaves(lambda leaf: np.asarray(leaf)[None], observation), rng, explore
            )
            return row_of(actions, 0), float(logp[0])
        x = np.asarray(observation, np.float32).reshape(self._box_width)
        # x.dot(w) is the BLAS gemv that x @ w calls, bit for bit, without the ufunc machinery
        # that costs @ half a microsecond more per layer
        for weight, bias in self._layers[:-1]:
            x = self._activation(x.dot(weight) + bias)
        weight, bias = self._layers[-1]
        logits = (x.dot(weight) + bias).tolist()
        top = max(logits)
        weights = [math.exp(value - top) for value in logits]
        total = math.fsum(weights)
        if explore:
            draw, choice = rng.random() * total, len(weights) - 1
            for index, weight_ in enumerate(weights):
                draw -= weight_
                if draw < 0:
                    choice = index
                    break
        else:
            choice = logits.index(top)
        return choice + self._start, logits[choice] - top - math.log(total)

    def act(
        self, observations: Any, rng: np.random.Generator, explore: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Actions and their log-probabilities under the behaviour distribution, for a batch."""
        out = self.forward(observations)
        if self.spec.distribution == "categorical":
            return _categorical(out, rng, explore, self._start)
        box = cast(gym.spaces.Box, self.spec.action_space)
        if self.spec.distribution == "gaussian":
            log_std = np.broadcast_to(cast(np.ndarray, self._log_std).astype(np.float32), out.shape)
            mean = out
        else:
            mean, log_std = np.split(out, 2, axis=1)
            log_std = np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)
        noise = rng.standard_normal(mean.shape).astype(np.float32) if explore else 0 * mean
        u = mean + np.exp(log_std) * noise
        logp = (-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(axis=1)
        if self.spec.distribution == "gaussian":
            action = np.clip(u, box.low.reshape(-1), box.high.reshape(-1))
        else:
            # tanh change of variables, SAC (Haarnoja et al. 2018), appendix C
            logp -= (2 * (np.log(2) - u - np.logaddexp(0, -2 * u))).sum(axis=1)
            low, high = box.low.reshape(-1), box.high.reshape(-1)
            action = low + (np.tanh(u) + 1) / 2 * (high - low)
        shaped = action.reshape((len(action), *box.shape)).astype(box.dtype)
        return shaped, logp.astype(np.float64)


def policy_for(
    checkpoint: Checkpoint, observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> NumpyPolicy:
    """The checkpoint's policy, if it acts in these spaces: a policy trained for another env
    would fail every forward pass (or act outside the action space) instead of being refused."""
    spec = checkpoint.spec
    width, got = flattening.flatdim(observation_space), flattening.flatdim(spec.observation_space)
    if got != width:
        raise DatasetError(
            f"checkpoint version {checkpoint.version}: observation_space: expected {width} "
            f"values per flattened observation, got {got}"
        )
    if not _same_actions(spec.action_space, action_space):
        raise DatasetError(
            f"checkpoint version {checkpoint.version}: action_space: expected {action_space}, "
            f"got {spec.action_space}"
        )
    return NumpyPolicy(checkpoint)


def _same_actions(ours: gym.Space[Any], theirs: gym.Space[Any]) -> bool:
    if isinstance(ours, gym.spaces.Box) and isinstance(theirs, gym.spaces.Box):
        return ours.shape == theirs.shape  # bounds may be written a little differently
    return ours == theirs


def _check_shapes(checkpoint: Checkpoint) -> None:
    """Each layer's weights fit the spec's widths (a bad file fails here, not in every pass)."""
    spec = checkpoint.spec
    heads = 2 if spec.distribution == "squashed_gaussian" else 1
    expected: dict[str, tuple[int, ...]] = {}
    features = flattening.flatdim(spec.observation_space)
    if spec.encoder == "cnn":
        if not encoder.is_image(spec.observation_space):
            raise DatasetError(
                f"checkpoint version {checkpoint.version}: encoder: 'cnn' needs a uint8 Box of "
                f"(height, width, channels), sides >= {encoder.MIN_SIDE}; got "
                f"{spec.observation_space}"
            )
        expected, features = encoder.shapes(cast(gym.spaces.Box, spec.observation_space))
    widths = [features, *spec.hidden, heads * spec.action_dim]
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        expected[f"pi.{i}.weight"], expected[f"pi.{i}.bias"] = (fan_out, fan_in), (fan_out,)
    if spec.distribution == "gaussian":
        expected["log_std"] = (spec.action_dim,)
    for name, shape in expected.items():
        got = checkpoint.weights.get(name)
        if got is None:
            raise DatasetError(f"checkpoint version {checkpoint.version}: no array '{name}'")
        if got.shape != shape:
            raise DatasetError(
                f"checkpoint version {checkpoint.version}: array '{name}': "
                f"expected shape {shape}, got {got.shape}"
            )


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def _categorical(
    logits: np.ndarray, rng: np.random.Generator, explore: bool, start: int
) -> tuple[np.ndarray, np.ndarray]:
    # float32 throughout, as the shipped datasets were recorded: changing the arithmetic
    # changes the logged action_logp bits (tests/test_datasets.py rebuilds them exactly)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    if explore:
        # Gumbel-max: one vectorized draw per row from softmax(logits)
        choice = (log_probs + rng.gumbel(size=log_probs.shape)).argmax(axis=1)
    else:
        choice = log_probs.argmax(axis=1)
    logp = log_probs[np.arange(len(choice)), choice]
    return (choice + start).astype(np.int64), logp.astype(np.float64)

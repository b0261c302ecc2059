"""Policy checkpoints: a safe file format, and the numpy network that runs one anywhere.

A checkpoint is one ``.npz`` file read with ``allow_pickle=False``: the weights as plain arrays and
the model spec as JSON bytes under ``__spec__``. The same file feeds the client's local inference,
the server's remote inference and a trainer that resumes, so none of them needs torch to act, and
loading a checkpoint can never run code (RLlib's pickled policies can).

Weights use torch's ``nn.Linear`` layout (``pi.{i}.weight`` is (out, in)), so a trainer exports its
``state_dict`` as it is. Files are named ``policy-{version:08d}.npz``; the newest version wins.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np

from pipeline import flattening, spaces
from pipeline.errors import ConfigError, DatasetError
from pipeline.wal import fsync_path

CHECKPOINTS = "checkpoints"
DISTRIBUTIONS = ("categorical", "gaussian", "squashed_gaussian")
ACTIVATIONS = ("tanh", "relu")
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's clamp (Haarnoja et al. 2018, reference code)
_SPEC_KEY = "__spec__"
_NAME_RE = re.compile(r"^policy-(?P<version>\d{8})\.npz$")


@dataclass(frozen=True)
class ModelSpec:
    """What a checkpoint's arrays mean: spaces, layer widths, activation and action distribution."""

    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    distribution: str = "categorical"
    algorithm: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(self.hidden))
        if not all(isinstance(w, int) and w > 0 for w in self.hidden):
            raise ConfigError("ModelSpec", "hidden", "a tuple of positive integers", self.hidden)
        if self.activation not in ACTIVATIONS:
            raise ConfigError("ModelSpec", "activation", f"one of {ACTIVATIONS}", self.activation)
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(
                "ModelSpec", "distribution", f"one of {DISTRIBUTIONS}", self.distribution
            )
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        if discrete != (self.distribution == "categorical"):
            raise ConfigError(
                "ModelSpec", "distribution",
                "'categorical' for a Discrete action space, a Gaussian for a Box",
                f"{self.distribution!r} for {self.action_space}",
            )  # fmt: skip

    @property
    def action_dim(self) -> int:
        return flattening.flatdim(self.action_space)

    def to_json(self) -> dict[str, Any]:
        return {
            "observation_space": spaces.space_to_json(self.observation_space),
            "action_space": spaces.space_to_json(self.action_space),
            "hidden": list(self.hidden),
            "activation": self.activation,
            "distribution": self.distribution,
            "algorithm": self.algorithm,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ModelSpec:
        return cls(
            observation_space=spaces.space_from_json(doc["observation_space"]),
            action_space=spaces.space_from_json(doc["action_space"]),
            hidden=tuple(doc["hidden"]),
            activation=doc["activation"],
            distribution=doc["distribution"],
            algorithm=doc.get("algorithm", ""),
        )


@dataclass(frozen=True)
class Checkpoint:
    """One published policy: its version (counting up from 1), spec and weights."""

    version: int
    spec: ModelSpec
    weights: dict[str, np.ndarray] = field(repr=False)


def checkpoint_name(version: int) -> str:
    return f"policy-{version:08d}.npz"


def save_checkpoint(directory: str | Path, checkpoint: Checkpoint) -> Path:
    """Write atomically, so a poller never sees half a checkpoint."""
    spec = np.frombuffer(json.dumps(checkpoint.spec.to_json()).encode(), dtype=np.uint8)
    target = Path(directory) / checkpoint_name(checkpoint.version)
    return save_arrays(target, {_SPEC_KEY: spec, **checkpoint.weights})


def save_arrays(target: Path, arrays: dict[str, np.ndarray]) -> Path:
    """An ``.npz`` of plain arrays, written under a dot-name readers skip, fsynced, renamed."""
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            savez: Any = np.savez  # numpy's stub would take an array for allow_pickle
            savez(handle, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        fsync_path(folder)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint file; arrays only, never pickled objects."""
    match = _NAME_RE.match(Path(path).name)
    if match is None:
        raise DatasetError(f"{path}: not a checkpoint (expected a name like policy-00000001.npz)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        spec = ModelSpec.from_json(json.loads(arrays.pop(_SPEC_KEY).tobytes().decode()))
    except (OSError, ValueError, KeyError) as error:
        raise DatasetError(f"{path}: unreadable checkpoint ({error!r})") from None
    return Checkpoint(int(match["version"]), spec, arrays)


def latest_checkpoint(path: str | Path) -> Path | None:
    """The newest checkpoint a path names: a file, a checkpoints directory, or a dataset or run
    directory holding ``checkpoints/``. None when there is none yet."""
    where = Path(path)
    if where.is_file():
        return where
    folder = where / CHECKPOINTS if (where / CHECKPOINTS).is_dir() else where
    if not folder.is_dir():
        return None
    found = sorted(p for p in folder.iterdir() if _NAME_RE.match(p.name))
    return found[-1] if found else None


class NumpyPolicy:
    """Runs a checkpoint's policy network with numpy alone (the client must not need torch)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.version = checkpoint.version
        self.spec = checkpoint.spec
        _check_shapes(checkpoint)  # every array there, in its shape
        self._layers = [
            (checkpoint.weights[f"pi.{i}.weight"].T.astype(np.float32),
             checkpoint.weights[f"pi.{i}.bias"].astype(np.float32))
            for i in range(len(self.spec.hidden) + 1)
        ]  # fmt: skip
        self._log_std = checkpoint.weights.get("log_std")
        self._activation = np.tanh if self.spec.activation == "tanh" else _relu
        space = self.spec.observation_space
        # a Box flattens to its values row-major: a reshape, not a trip through flatten_batch
        self._box_width = flattening.flatdim(space) if isinstance(space, gym.spaces.Box) else None
        self._start = (
            int(self.spec.action_space.start)
            if isinstance(self.spec.action_space, gym.spaces.Discrete)
            else 0
        )

    def forward(self, observations: Any) -> np.ndarray:
        """The output layer's raw values for a batch of observations."""
        if self._box_width is not None:
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
            batch = np.asarray(observation)[None] if self._box_width is not None else (
                _batch_of_one(observation))  # fmt: skip
            actions, logp = self.act(batch, rng, explore)
            return _first(actions), float(logp[0])
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
            log_std = np.broadcast_to(cast(np.ndarray, self._log_std).astype(np.float32),
                                      out.shape)  # fmt: skip
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
    widths = [flattening.flatdim(spec.observation_space), *spec.hidden, heads * spec.action_dim]
    expected: dict[str, tuple[int, ...]] = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        expected[f"pi.{i}.weight"], expected[f"pi.{i}.bias"] = (fan_out, fan_in), (fan_out,)
    if spec.distribution == "gaussian":
        expected["log_std"] = (spec.action_dim,)
    for name, shape in expected.items():
        got = checkpoint.weights.get(name)
        if got is None:
            raise DatasetError(f"checkpoint version {checkpoint.version}: no array '{name}'")
        if got.shape != shape:
            raise DatasetError(f"checkpoint version {checkpoint.version}: array '{name}': "
                               f"expected shape {shape}, got {got.shape}")  # fmt: skip


def _batch_of_one(observation: Any) -> Any:
    """A single observation of any space as a batch of one, in the layout of ``codec``."""
    if isinstance(observation, dict):
        return {key: _batch_of_one(value) for key, value in observation.items()}
    if isinstance(observation, tuple):
        return tuple(_batch_of_one(value) for value in observation)
    return np.asarray(observation)[None]


def _first(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {key: _first(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_first(value) for value in batch)
    value = np.asarray(batch)[0]
    return value.item() if value.ndim == 0 else value


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

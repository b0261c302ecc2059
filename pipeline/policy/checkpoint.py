"""Policy checkpoints: a safe file format that every part of rlpipe reads and writes.

A checkpoint is one ``.npz`` file read with ``allow_pickle=False``: the weights as plain arrays and
the model spec as JSON bytes under ``__spec__``. The same file feeds the client's local inference,
the server's remote inference and evaluation, so none of them needs torch to act
(:mod:`pipeline.policy.network` runs one with numpy), and loading one can never run code (RLlib's
pickled policies can).

Weights use torch's ``nn.Linear`` layout (``pi.{i}.weight`` is (out, in)), so a trainer exports its
``state_dict`` as it is. Files are named ``policy-{version:08d}.npz``; the newest version wins.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.dataset.wal import fsync_path
from pipeline.errors import ConfigError, DatasetError
from pipeline.format import flattening, spaces

CHECKPOINTS = "checkpoints"
DISTRIBUTIONS = ("categorical", "gaussian", "squashed_gaussian")
ENCODERS = ("flat", "cnn")  # flattened values, or the CNN of pipeline.policy.encoder
ACTIVATIONS = ("tanh", "relu")
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's clamp (Haarnoja et al. 2018, reference code)
_SPEC_KEY = "__spec__"
_LOADING = threading.Lock()  # see load_arrays
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
    encoder: str = "flat"

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(self.hidden))
        if not all(isinstance(w, int) and w > 0 for w in self.hidden):
            raise ConfigError("ModelSpec", "hidden", "a tuple of positive integers", self.hidden)
        if self.encoder not in ENCODERS:
            raise ConfigError("ModelSpec", "encoder", f"one of {ENCODERS}", self.encoder)
        if self.activation not in ACTIVATIONS:
            raise ConfigError("ModelSpec", "activation", f"one of {ACTIVATIONS}", self.activation)
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(
                "ModelSpec", "distribution", f"one of {DISTRIBUTIONS}", self.distribution
            )
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        if discrete != (self.distribution == "categorical"):
            raise ConfigError(
                "ModelSpec",
                "distribution",
                "'categorical' for a Discrete action space, a Gaussian for a Box",
                f"{self.distribution!r} for {self.action_space}",
            )

    @property
    def action_dim(self) -> int:
        return flattening.flatdim(self.action_space)

    def to_json(self) -> dict[str, Any]:
        return {
            **vars(self),
            "observation_space": spaces.space_to_json(self.observation_space),
            "action_space": spaces.space_to_json(self.action_space),
            "hidden": list(self.hidden),
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
            encoder=doc.get("encoder", "flat"),  # checkpoints before image policies have none
        )


@dataclass(frozen=True)
class Checkpoint:
    """One published policy: its version (counting up from 1), spec and weights."""

    version: int
    spec: ModelSpec
    weights: dict[str, np.ndarray] = field(repr=False)


def save_checkpoint(directory: str | Path, checkpoint: Checkpoint) -> Path:
    """Write atomically, so a poller never sees half a checkpoint."""
    spec = np.frombuffer(json.dumps(checkpoint.spec.to_json()).encode(), dtype=np.uint8)
    target = Path(directory) / f"policy-{checkpoint.version:08d}.npz"
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
        arrays = load_arrays(path)
        spec = ModelSpec.from_json(json.loads(arrays.pop(_SPEC_KEY).tobytes().decode()))
    except (OSError, ValueError, KeyError) as error:
        raise DatasetError(f"{path}: unreadable checkpoint ({error!r})") from None
    return Checkpoint(int(match["version"]), spec, arrays)


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (arrays only: nothing pickled is read).

    Raises:
        OSError, ValueError: the file cannot be read as arrays.
    """
    # numpy parses each array's header with ast.literal_eval, and CPython 3.11's parser keeps
    # its recursion depth per interpreter: two threads parsing at once can raise SystemError
    # ("AST constructor recursion depth mismatch", python/cpython#106905). Clients in threads
    # of one process load checkpoints at once, so loads here take turns.
    with _LOADING, np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


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

"""A trainer's whole state as flat numpy arrays, so resuming needs no pickle.

``torch.save`` pickles, and ``torch.load`` of an untrusted file can run code; a trainer's state is
instead a ``dict[str, np.ndarray]``: module parameters under ``{name}.{parameter}``, each Adam
moment under ``{name}.state.{index}.{key}``, the optimizer's hyperparameters as JSON bytes under
``{name}.param_groups``. It is written with ``np.savez`` and read with ``allow_pickle=False``
(safetensors would do the same job; it is not a dependency, and plain ``.npz`` is enough).

The same file holds the run's :class:`Progress` (JSON bytes under ``run.progress``): how far the
loop has got and what it has read, so that weights and read position always agree.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from pipeline.errors import DatasetError
from pipeline.policy.checkpoint import load_arrays, save_arrays

STATE_FILE = "trainer-state.npz"
PROGRESS = "run.progress"  # the key of the Progress in the state file; no trainer's module name


class Parts(NamedTuple):
    """The attributes of a trainer that make its state: torch modules, optimizers, and values
    (counters as ints or floats, tensors such as a learned temperature)."""

    modules: tuple[str, ...]
    optimizers: tuple[str, ...]
    values: tuple[str, ...] = ("updates",)

    def arrays(self, trainer: object) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {}
        for name in self.modules:
            for key, value in getattr(trainer, name).state_dict().items():
                arrays[f"{name}.{key}"] = value.detach().cpu().numpy().copy()
        for name in self.optimizers:
            arrays.update(_optimizer_arrays(name, getattr(trainer, name)))
        for name in self.values:
            value = getattr(trainer, name)
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().numpy().copy()
            arrays[name] = np.asarray(value)
        return arrays

    def load(self, trainer: object, arrays: dict[str, np.ndarray]) -> None:
        for name in self.modules:
            prefix = f"{name}."
            getattr(trainer, name).load_state_dict(
                {
                    key[len(prefix) :]: torch.as_tensor(value)
                    for key, value in arrays.items()
                    if key.startswith(prefix)
                }
            )
        for name in self.optimizers:
            _load_optimizer(name, getattr(trainer, name), arrays)
        for name in self.values:
            value = getattr(trainer, name)
            if isinstance(value, torch.Tensor):
                with torch.no_grad():
                    value.copy_(torch.as_tensor(arrays[name]))
            else:
                setattr(trainer, name, type(value)(arrays[name]))


def _optimizer_arrays(name: str, optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    state = optimizer.state_dict()
    arrays = {f"{name}.param_groups": _json_bytes(state["param_groups"])}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            arrays[f"{name}.state.{index}.{key}"] = torch.as_tensor(value).cpu().numpy().copy()
    return arrays


def _load_optimizer(
    name: str, optimizer: torch.optim.Optimizer, arrays: dict[str, np.ndarray]
) -> None:
    groups = json.loads(arrays[f"{name}.param_groups"].tobytes().decode())
    state: dict[int, dict[str, torch.Tensor]] = {}
    prefix = f"{name}.state."
    for key, value in arrays.items():
        if key.startswith(prefix):
            index, entry = key[len(prefix) :].split(".", 1)
            state.setdefault(int(index), {})[entry] = torch.as_tensor(value)
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_state(directory: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``directory/trainer-state.npz`` atomically (temporary dot-name, fsync, rename)."""
    return save_arrays(Path(directory) / STATE_FILE, arrays)


def load_state(path: str | Path) -> dict[str, np.ndarray]:
    try:
        return load_arrays(path)
    except (OSError, ValueError) as error:
        raise DatasetError(f"{path}: unreadable trainer state ({error!r})") from None


def _json_bytes(value: object) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8).copy()


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far a run has got, saved with the trainer's state; a resumed run starts from it.

    Attributes:
        updates: the loop's updates so far (``--max-updates`` counts them across restarts).
        version: the newest policy version published, so a resumed run never reuses one.
        env_steps, trained_rows: online, rows read from the dataset and rows trained on.
        shards: online, the shards every row of which the trainer holds (in its replay buffer, or
            trained on): its read position, as paths under the dataset root.
        data_version: the step table's version the read position is at (online: ``shards``
            were read up to it; offline: the version trained on), so a resumed run reads on
            from there, whatever compactions renamed the files since.
        min_policy_version: online PPO, its first version: it reads the rows of its own versions.
        sampler: offline, the state of the minibatch sampler's bit generator.
    """

    updates: int = 0
    version: int = 0
    env_steps: int = 0
    trained_rows: int = 0
    shards: frozenset[str] = frozenset()
    data_version: int | None = None
    min_policy_version: int | None = None
    sampler: Mapping[str, Any] | None = None

    def to_array(self) -> np.ndarray:
        return _json_bytes({**dataclasses.asdict(self), "shards": sorted(self.shards)})

    @classmethod
    def pop(cls, arrays: dict[str, np.ndarray], path: str | Path) -> Progress:
        """The progress saved in ``arrays``, taken out of them; a state file written before
        progress was saved in it resumes the weights only."""
        array = arrays.pop(PROGRESS, None)
        if array is None:
            return cls()
        try:
            fields = json.loads(array.tobytes().decode())
            return cls(**{**fields, "shards": frozenset(fields["shards"])})
        except (ValueError, TypeError, KeyError) as error:
            raise DatasetError(f"{path}: unreadable {PROGRESS} ({error!r})") from None


def saved_data_version(run_dir: str | Path) -> int | None:
    """The table version a run in ``run_dir`` read, when it saved a state: a resumed run reads
    it again; None for a new run."""
    path = Path(run_dir) / STATE_FILE
    if not path.exists():
        return None
    return Progress.pop(load_state(path), path).data_version

"""D4RL-style HDF5: flat arrays ``observations``, ``actions``, ``rewards``, ``terminals``,
``timeouts`` (and optionally ``next_observations``), episodes back to back.

D4RL marks how an episode ended with two flags, which map straight onto gymnasium's: ``terminals``
is ``terminated`` and ``timeouts`` is ``truncated``. Episodes are numbered in file order. Without
``next_observations`` the next row's observation stands in, as D4RL's own ``qlearning_dataset``
does; the file's last row then keeps its own observation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import DatasetError
from pipeline.importers.transitions import SourceSteps

REQUIRED = ("observations", "actions", "rewards", "terminals")


def open_hdf5(src: str | Path) -> Any:
    """An h5py File; h5py is an optional extra, so its absence is a clear error."""
    try:
        import h5py
    except ModuleNotFoundError:
        raise DatasetError(
            f"{src}: reading HDF5 needs the optional h5py package: pip install h5py"
        ) from None
    try:
        return h5py.File(src, "r")
    except OSError as error:
        raise DatasetError(f"{src}: not a readable HDF5 file ({error})") from None


def read_d4rl(src: str | Path) -> SourceSteps:
    with open_hdf5(src) as handle:
        missing = [name for name in REQUIRED if name not in handle]
        if missing:
            raise DatasetError(
                f"{src}: missing D4RL datasets {missing}; found {sorted(handle.keys())}"
            )
        names = [name for name in (*REQUIRED, "timeouts", "next_observations") if name in handle]
        groups = [name for name in names if not hasattr(handle[name], "shape")]
        if groups:
            raise DatasetError(
                f"{src}: {groups} are HDF5 groups (nested values), which the d4rl importer does "
                "not read: it takes flat arrays; a dataset of Dict or Tuple spaces imports as "
                "minari"
            )
        data = {name: np.asarray(handle[name]) for name in names}
    terminals = data["terminals"].astype(bool).reshape(-1)
    timeouts = data.get("timeouts", np.zeros_like(terminals)).astype(bool).reshape(-1)
    timeouts &= ~terminals
    ended = terminals | timeouts
    keys = np.r_[0, np.cumsum(ended)[:-1]] if len(ended) else np.zeros(0, dtype=np.int64)
    observations = data["observations"]
    next_observations = data.get("next_observations")
    if next_observations is None:
        next_observations = np.concatenate([observations[1:], observations[-1:]])
    return SourceSteps(
        episode_keys=keys,
        observations=observations,
        actions=data["actions"],
        rewards=data["rewards"].reshape(-1),
        next_observations=next_observations,
        terminateds=terminals,
        truncateds=timeouts,
    )

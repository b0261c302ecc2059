"""The episodes of a Minari dataset's storage, read as Minari's own storages write them.

Minari 0.5 keeps a dataset's data in ``DATASET/data`` in one of three backends
(``minari/dataset/_storages``):

- ``hdf5``: ``main_data.hdf5``, one group ``episode_<id>`` per episode holding ``observations``
  (one more row than steps), ``actions``, ``rewards``, ``terminations``, ``truncations`` and an
  ``infos`` group (one row more than steps, like observations). A Dict space is a group with one
  entry per key, a Tuple space a group of ``_index_<i>``. The group's attributes hold ``id``,
  ``seed`` (int64, or uint64 past 2**63 - 1) and the reset ``options``, flattened with ``/`` into
  ``options/<key>/...``.
- ``arrow`` and ``parquet``: a directory ``<id>/`` per episode with one Arrow IPC or Parquet file
  whose columns all have one more row than steps (actions, rewards and flags padded by one), Dict
  and Tuple spaces as structs (Tuple children named ``"0"``, ``"1"``...), Box, MultiDiscrete and
  MultiBinary as fixed-size lists, infos as a struct; and ``metadata.json`` with ``id``, ``seed``
  and ``options``.

Image spaces (uint8 Box of at least 32x32 bounded by [0, 255]) are JPEG-encoded unless the
dataset's ``jpeg_encoding`` is false; they are decoded as Minari does, with Pillow.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from pipeline.errors import DatasetError

HDF5_FILE = "main_data.hdf5"
EPISODE_PREFIX = "episode_"
_FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")


@dataclass(frozen=True)
class MinariEpisode:
    """One episode as Minari returns it: ``observations`` and ``infos`` have one more row than
    ``rewards`` (the reset's), in the batch layout (dicts and tuples of arrays, row axis first)."""

    id: int
    observations: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any] | None
    seed: int | None
    options: dict[str, Any] | None


@dataclass(frozen=True)
class Spaces:
    """The dataset's spaces (None when nothing says: then only arrays are read) and whether
    image spaces are JPEG-encoded."""

    observation: gym.Space[Any] | None
    action: gym.Space[Any] | None
    jpeg: bool


def is_image_space(space: gym.Space[Any]) -> bool:
    """Minari's rule (``minari/dataset/minari_storage.py``) for a space it stores as JPEG."""
    return (
        isinstance(space, gym.spaces.Box)
        and len(space.shape) in {2, 3}
        and space.shape[0] >= 32
        and space.shape[1] >= 32
        and space.dtype == np.uint8
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
    )


# --- hdf5 ---------------------------------------------------------------------------------------


def hdf5_episodes(data_dir: Path, spaces: Spaces) -> Iterator[MinariEpisode]:
    from pipeline.importers.d4rl import open_hdf5

    data_file = data_dir / HDF5_FILE if data_dir.is_dir() else data_dir
    with open_hdf5(data_file) as handle:
        for name in _episode_names(handle, data_file):
            yield _hdf5_episode(handle[name], f"{data_file}:{name}", spaces)


def _episode_names(handle: Any, where: Path) -> list[str]:
    names = [name for name in handle if name.startswith(EPISODE_PREFIX)]
    try:
        return sorted(names, key=lambda name: int(name[len(EPISODE_PREFIX) :]))
    except ValueError:
        raise DatasetError(f"{where}: episode groups must be named episode_<integer>") from None


def _hdf5_episode(group: Any, where: str, spaces: Spaces) -> MinariEpisode:
    missing = [name for name in _FIELDS if name not in group]
    if missing:
        raise DatasetError(f"{where}: missing {missing}; found {sorted(group.keys())}")
    attrs = dict(group.attrs)
    seed = attrs.get("seed")
    return MinariEpisode(
        id=int(attrs.get("id", where.rsplit("_", 1)[-1])),
        observations=_hdf5_value(group["observations"], spaces.observation, spaces.jpeg, where),
        actions=_hdf5_value(group["actions"], spaces.action, spaces.jpeg, where),
        rewards=np.asarray(group["rewards"]).reshape(-1),
        terminations=np.asarray(group["terminations"]).astype(bool).reshape(-1),
        truncations=np.asarray(group["truncations"]).astype(bool).reshape(-1),
        infos=_hdf5_infos(group["infos"]) if "infos" in group else None,
        seed=None if seed is None else _seed(seed, where),
        options=_hdf5_options(attrs),
    )


def _hdf5_value(node: Any, space: gym.Space[Any] | None, jpeg: bool, where: str) -> Any:
    if space is None and not hasattr(node, "shape"):
        raise DatasetError(
            f"{where}:{node.name}: a group (a Dict or Tuple space), and neither the metadata nor "
            "an installed env gives the space; pass --env"
        )
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        if hasattr(node, "shape"):
            raise DatasetError(f"{where}:{node.name}: an array, where the space is {space}")
        if isinstance(space, gym.spaces.Dict):
            return {
                key: _hdf5_value(_child(node, key, where), sub, jpeg, where)
                for key, sub in space.spaces.items()
            }
        return tuple(
            _hdf5_value(_child(node, f"_index_{i}", where), sub, jpeg, where)
            for i, sub in enumerate(space.spaces)
        )
    if not hasattr(node, "shape"):
        raise DatasetError(f"{where}:{node.name}: a group, where the space is {space}")
    if jpeg and space is not None and is_image_space(space):
        return _decode_jpeg(list(node[()]), where)
    return np.asarray(node[()])


def _child(node: Any, key: str, where: str) -> Any:
    if key not in node:
        raise DatasetError(f"{where}:{node.name}: no entry {key!r}; found {sorted(node.keys())}")
    return node[key]


def _hdf5_infos(node: Any) -> dict[str, Any]:
    return {
        key: _hdf5_infos(value) if not hasattr(value, "shape") else np.asarray(value[()])
        for key, value in node.items()
    }


def _hdf5_options(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """Minari's ``options/<key>/<key>`` attributes as the nested dict they were flattened from."""
    options: dict[str, Any] = {}
    for name, value in attrs.items():
        keys = name.split("/")
        if keys[0] != "options" or len(keys) < 2:
            continue
        node = options
        for key in keys[1:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = plain(value)
    return options or None


# --- arrow and parquet ----------------------------------------------------------------------------


def arrow_episodes(data_dir: Path, spaces: Spaces, file_format: str) -> Iterator[MinariEpisode]:
    import pyarrow.dataset as ds

    directories = [p for p in data_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    for directory in sorted(directories, key=lambda p: int(p.name)):
        where = str(directory)
        try:
            table = ds.dataset(
                directory, format=file_format, ignore_prefixes=["_", ".", "metadata.json"]
            ).to_table()
        except (pa.ArrowInvalid, OSError) as error:
            raise DatasetError(f"{where}: unreadable as {file_format} ({error})") from None
        metadata = json_file(directory / "metadata.json")
        missing = [name for name in _FIELDS if name not in table.column_names]
        if missing:
            raise DatasetError(f"{where}: missing columns {missing}; found {table.column_names}")
        seed = metadata.get("seed")
        yield MinariEpisode(
            id=int(metadata.get("id", directory.name)),
            observations=_arrow_value(table["observations"], spaces.observation, spaces.jpeg),
            actions=_arrow_value(
                table["actions"].slice(0, table.num_rows - 1), spaces.action, spaces.jpeg
            ),
            rewards=table["rewards"].to_numpy()[:-1],
            terminations=table["terminations"].to_numpy()[:-1].astype(bool),
            truncations=table["truncations"].to_numpy()[:-1].astype(bool),
            infos=_arrow_infos(table["infos"].combine_chunks())
            if "infos" in table.column_names
            else None,
            seed=None if seed is None else _seed(seed, f"{where}/metadata.json"),
            options=metadata.get("options"),
        )


def _arrow_value(
    column: pa.ChunkedArray | pa.Array, space: gym.Space[Any] | None, jpeg: bool
) -> Any:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if space is None:
        raise DatasetError(
            "the metadata has no observation_space or action_space and the env is not installed "
            "here; pass --env"
        )
    if isinstance(space, gym.spaces.Dict):
        return {key: _arrow_value(array.field(key), sub, jpeg) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_arrow_value(array.field(str(i)), sub, jpeg) for i, sub in enumerate(space))
    if jpeg and is_image_space(space):
        return _decode_jpeg(array.to_pylist(), "an image column")
    if pa.types.is_fixed_size_list(array.type) or pa.types.is_list(array.type):
        values = array.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(array), *(space.shape if space.shape is not None else ()))
    return array.to_numpy(zero_copy_only=False)


def _arrow_infos(array: pa.StructArray) -> dict[str, Any]:
    infos: dict[str, Any] = {}
    for i, field in enumerate(array.type):
        child = array.field(i)
        if pa.types.is_struct(field.type):
            infos[field.name] = _arrow_infos(child)
            continue
        if pa.types.is_fixed_size_list(field.type) or pa.types.is_list(field.type):
            shape = (field.metadata or {}).get(b"shape", b"").decode()
            dims = tuple(int(d) for d in shape.split(",") if d)
            values = child.flatten().to_numpy(zero_copy_only=False)
            infos[field.name] = values.reshape(len(child), *dims)
        else:
            infos[field.name] = np.asarray(child.to_numpy(zero_copy_only=False))
    return infos


# --- shared ---------------------------------------------------------------------------------------


def _decode_jpeg(frames: list[Any], where: str) -> np.ndarray:
    try:
        from PIL import Image
    except ModuleNotFoundError:
        raise DatasetError(
            f"{where}: the dataset stores images as JPEG (Minari's jpeg_encoding); decoding them "
            "needs Pillow: pip install pillow"
        ) from None
    images = [np.array(Image.open(io.BytesIO(bytes(frame))), dtype=np.uint8) for frame in frames]
    return np.stack(images)


def json_file(path: Path) -> dict[str, Any]:
    """A JSON object file's content; {} when there is no such file."""
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path}: not JSON ({error})") from None
    if not isinstance(loaded, dict):
        raise DatasetError(f"{path}: expected a JSON object, got {type(loaded).__name__}")
    return loaded


def _seed(value: Any, where: str) -> int:
    """A seed exactly as stored: a Python int from an int64 or uint64, never through a float."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise DatasetError(f"{where}: seed: expected an integer, got {value!r}")
    return int(value)


def plain(value: Any) -> Any:
    """numpy scalars and arrays (in dicts and lists) as the Python values JSON holds."""
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return plain(value.item())
    return value

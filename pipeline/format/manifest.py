"""The manifest: the one small JSON file that says what a dataset holds.

It is written once, when the first writer opens the dataset, and never changed afterwards, so
several writer processes can race to create it: the loser reads the winner's and checks that it
describes the same spaces. It sits beside the two Delta tables (``steps/``, ``episodes/``), a
sidecar: deltalake refuses table properties of its own naming, and the spaces also ride in the
Delta schema's field metadata.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import pyarrow.fs as pafs

from pipeline.dataset.location import Location, locate, storage_failure
from pipeline.dataset.wal import fsync_path
from pipeline.errors import DamagedFileError, DatasetError, FormatVersionError
from pipeline.format import layout, spaces
from pipeline.format.schema import step_schema


@dataclass(frozen=True)
class Manifest:
    """What a dataset holds. ``env_id`` is None for external simulators gymnasium cannot build."""

    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    env_id: str | None = None
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    format_version: int = layout.FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        doc = {
            "format": layout.FORMAT_NAME,
            "format_version": self.format_version,
            "created_at": self.created_at,
            "env_id": self.env_id,
            "observation_space": spaces.space_to_json(self.observation_space),
            "action_space": spaces.space_to_json(self.action_space),
        }
        return {**doc, "checksum": checksum(doc)}

    @classmethod
    def from_json(
        cls, doc: dict[str, Any], where: str = "manifest", version: int = layout.FORMAT_VERSION
    ) -> Manifest:
        """The manifest ``doc`` describes, which must be of format ``version``."""
        if not isinstance(doc, dict) or doc.get("format") != layout.FORMAT_NAME:
            raise DatasetError(f'{where}: not an rlpipe manifest (no "format": "rlpipe")')
        check_format_version(doc.get("format_version"), where, version)
        if "checksum" in doc and doc["checksum"] != checksum(doc):  # manifests from before lack it
            raise DamagedFileError(
                where, f"its checksum {doc['checksum']!r} is not that of its content"
            )
        try:
            return cls(
                observation_space=spaces.space_from_json(doc["observation_space"]),
                action_space=spaces.space_from_json(doc["action_space"]),
                env_id=doc.get("env_id"),
                created_at=str(doc["created_at"]),
                format_version=int(doc["format_version"]),
            )
        except KeyError as missing:
            raise DatasetError(f"{where}: missing key {missing}") from None


def checksum(doc: dict[str, Any]) -> str:
    """CRC-32 of a manifest's keys but ``checksum``, as JSON with sorted keys and no spaces."""
    body = {key: value for key, value in doc.items() if key != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return f"{zlib.crc32(text.encode()):08x}"


def check_format_version(
    version: object, where: str, expected: int = layout.FORMAT_VERSION
) -> None:
    if type(version) is int and version == expected:  # not True, not 1.0
        return
    if expected != layout.FORMAT_VERSION:
        raise FormatVersionError(f"{where}: format version {version!r}; expected {expected}")
    if expected == layout.FORMAT_VERSION and type(version) is int and version == 1:
        raise FormatVersionError(
            f"{where}: format version 1 (shards in directories, before the Delta tables of "
            f"version {layout.FORMAT_VERSION}); convert it with `rlpipe import rlpipe-v1 SRC DST`"
        )
    if isinstance(version, int) and version > layout.FORMAT_VERSION:
        raise FormatVersionError(
            f"{where}: format version {version} is newer than the {layout.FORMAT_VERSION} this "
            "rlpipe reads; upgrade rlpipe (pip install -U rlpipe)"
        )
    raise FormatVersionError(
        f"{where}: format version {version!r} is not one this rlpipe reads (it reads "
        f"{layout.FORMAT_VERSION}); rewrite the dataset with the rlpipe release that made it, "
        "or re-import it with `rlpipe import table`"
    )


def read_manifest(
    path: str | Path | Location,
    storage_options: dict[str, str] | None = None,
    *,
    version: int = layout.FORMAT_VERSION,
) -> Manifest:
    """Read the manifest of a dataset at a local path or URI (of format ``version``)."""
    location = locate(path, storage_options)
    filesystem = location.filesystem
    where = location.path(layout.MANIFEST)
    try:  # opened without asking first whether it is there: a request less on object storage
        with filesystem.open_input_stream(where) as stream:
            raw = stream.read()
    except (FileNotFoundError, IsADirectoryError):
        raise DatasetError(
            f"{location.uri}: no {layout.MANIFEST}; this is not an rlpipe dataset (create "
            "one with DatasetWriter or `rlpipe import`)"
        ) from None
    except OSError as error:
        raise storage_failure(location, f"reading {layout.MANIFEST}", error) from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DamagedFileError(where, f"unreadable manifest ({error})") from None
    return Manifest.from_json(doc, where, version)


def open_manifest(
    location: Location,
    observation_space: gym.Space[Any] | None,
    action_space: gym.Space[Any] | None,
    env_id: str | None,
) -> Manifest:
    """The manifest a writer with these spaces may write under: the dataset's own when no spaces
    are given, else a new one, or the existing one if it agrees (two writers agree when spaces
    and env match).

    Raises:
        SpaceError: a space the format cannot store (refused before any file is made).
        DatasetError: no manifest and no spaces, only one space, or spaces the dataset differs from.
    """
    if observation_space is None or action_space is None:
        if observation_space is not None or action_space is not None:
            raise DatasetError("give both observation_space and action_space, or neither")
        return read_manifest(location)
    step_schema(observation_space, action_space)  # refuse bad spaces before any file
    create_manifest(location, Manifest(observation_space, action_space, env_id))
    existing = read_manifest(location)
    root = location.uri
    ours = (observation_space, action_space, env_id)
    if (existing.observation_space, existing.action_space, existing.env_id) != ours:
        raise DatasetError(
            f"{root}: the dataset holds observation space {existing.observation_space}, action "
            f"space {existing.action_space}, env {existing.env_id!r}; this writer has "
            f"{observation_space}, {action_space}, env {env_id!r}. Write to a new directory."
        )
    return existing


def create_manifest(location: Location, manifest: Manifest) -> None:
    """Write ``manifest`` as the dataset's, unless it has one already."""
    if location.local:
        _create_local(location.root, manifest)
    else:
        _create_remote(location, manifest)


def _create_local(root: str, manifest: Manifest) -> None:
    """Write the manifest unless one exists; ``os.link`` fails when the target exists, which
    makes creation race-free between processes."""
    target = Path(root) / layout.MANIFEST
    Path(root).mkdir(parents=True, exist_ok=True)
    if target.exists():
        return
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=root)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; a shared dataset is read by others
        with os.fdopen(fd, "w") as handle:
            json.dump(manifest.to_json(), handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, target)
        fsync_path(root)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _create_remote(location: Location, manifest: Manifest) -> None:
    """Write the manifest to an object store unless one exists. Two writers racing here write
    the same spaces (each then checks the one that stayed); one object put is atomic."""
    filesystem, target = location.filesystem, location.path(layout.MANIFEST)
    try:
        if filesystem.get_file_info(target).type == pafs.FileType.File:
            return
        with filesystem.open_output_stream(target) as stream:
            stream.write(json.dumps(manifest.to_json(), indent=2).encode())
    except OSError as error:
        raise storage_failure(location, f"writing {layout.MANIFEST}", error) from None

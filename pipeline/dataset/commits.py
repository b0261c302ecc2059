"""The commit files of a table's Delta log, read and checked line by line.

The log has no checksum, and a Delta reader skips an action it does not know: an ``add`` whose
name one flipped bit changed drops a shard's rows without a word, a ``remove`` so changed reads
a compaction's rows twice. Every commit rlpipe reads itself goes through :func:`read_commit`,
which names a line that is not one sound action; :func:`check_replayed` does the same for the
commits deltalake replays when a table is opened (those after its last checkpoint), before a
writer's next checkpoint could make the loss permanent.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.dataset.location import Location, storage_failure
from pipeline.errors import DatasetError


def check_replayed(location: Location, table: str, version: int) -> None:
    """Read the commits up to ``version`` that follow the last checkpoint: those deltalake
    replayed to open the table there (a version older than that checkpoint, opened from an
    earlier one, is not checked)."""
    for following in range(_last_checkpoint(location, table) + 1, version + 1):
        read_commit(location, table, following)


def _last_checkpoint(location: Location, table: str) -> int:
    """The version of the table's last checkpoint, as ``_last_checkpoint`` says; -1 when there
    is none (or it cannot be read: then every commit is checked)."""
    path = location.path(table, "_delta_log", "_last_checkpoint")
    try:
        with location.filesystem.open_input_stream(path) as stream:
            version = json.loads(stream.read())["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return -1
    return version if isinstance(version, int) else -1


def read_commit(location: Location, table: str, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version`` of ``table``'s Delta log, read with pyarrow's
    filesystem; None when there is no such commit file.

    Raises:
        DatasetError: a line that is not one Delta action. The log has no checksum, and a
            reader skips an action it does not know: ``add`` with one bit flipped would drop a
            shard's rows without a word, a ``remove`` so changed would read them twice.
    """
    path = location.path(table, "_delta_log", f"{version:020d}.json")
    try:
        with location.filesystem.open_input_stream(path) as stream:
            data = stream.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise storage_failure(location, f"reading {path}", error) from None
    lines = enumerate(data.splitlines(), 1)
    return [_action(path, number, line) for number, line in lines if line.strip()]


_ACTIONS = frozenset(  # the actions of the Delta protocol
    {"add", "remove", "metaData", "protocol", "txn", "commitInfo", "cdc", "domainMetadata"}
    | {"checkpointMetadata", "sidecar"}
)


def _action(path: str, number: int, line: bytes) -> dict[str, Any]:
    try:
        action = json.loads(line)  # bytes: UTF-8, whose errors are ValueErrors too
    except ValueError:
        action = None
    if not isinstance(action, dict) or len(action) != 1 or not _sound(*next(iter(action.items()))):
        raise DatasetError(
            f"{path}: line {number} is not one Delta action ({line[:60]!r}...): this commit "
            "of the table's log is damaged, and which files the table holds is not known"
        )
    return action


def _sound(kind: str, body: Any) -> bool:
    """Whether an action is one of the protocol's, and an add or remove has what a
    :class:`Snapshot` reads of it (an add's statistics are JSON text)."""
    if kind not in _ACTIONS:
        return False
    if kind not in ("add", "remove"):
        return True
    if not isinstance(body, dict) or not isinstance(body.get("path"), str):
        return False
    if kind == "remove":
        return True
    try:
        stats = json.loads(body.get("stats") or "{}")
    except (TypeError, ValueError):
        return False
    numbers = body.get("size"), body.get("modificationTime")
    return isinstance(stats, dict) and all(isinstance(number, int) for number in numbers)

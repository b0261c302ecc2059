"""The one error tree of rlpipe.

Every error a user can cause comes from here, so callers can catch by meaning rather than by the
module that noticed::

    RlpipeError
    ├── ConfigError        a config field holds a value it does not allow
    ├── SpaceError         a gymnasium space rlpipe cannot encode, or a malformed space document
    ├── SchemaError        rows that do not fit the step table or the spaces (lists every problem)
    ├── DatasetError       a directory that is not a usable rlpipe dataset
    │   ├── FormatVersionError  a dataset written in a format version this code does not read
    │   ├── StorageError        the dataset's disk refused a write (full, quota, I/O error)
    │   └── DamagedFileError    a file of a dataset whose bytes are not what was written
    ├── TrainingError      a worker of a distributed training run failed, so the run stopped
    └── ServerError        the policy server refused a request, or could not be reached
        ├── RequestRejected     400, 413, 415: the request itself is wrong
        ├── Unauthorized        401: the token is missing or wrong
        ├── EpisodeError        404, 409: the episode is unknown, or has ended
        └── ServerUnavailable   no answer, or 503 for longer than the client's timeout

Configs and data errors also subclass ``ValueError``, so code that already catches ``ValueError``
keeps working. What rlpipe does as asked but doubts was meant is a :class:`RlpipeWarning`, which
the ``rlpipe`` command prints as one line.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass


class RlpipeError(Exception):
    """Base of every error rlpipe raises on purpose."""


class RlpipeWarning(UserWarning):
    """Done as asked, but likely not what was meant; the message says what to pass instead."""


class ConfigError(RlpipeError, ValueError):
    """A config field holds a value it does not allow."""

    def __init__(self, owner: str, field: str, expected: str, got: object) -> None:
        self.owner = owner
        self.field = field
        self.expected = expected
        self.got = got
        super().__init__(f"{owner}.{field}: expected {expected}, got {got!r}")


class SpaceError(RlpipeError, ValueError):
    """A space rlpipe cannot encode, or a space document that does not describe one."""


@dataclass(frozen=True)
class Problem:
    """One reason a row does not fit; ``row`` is None when the whole column is wrong."""

    field: str
    expected: str
    got: str
    row: int | None = None

    def __str__(self) -> str:
        where = f"row {self.row}, " if self.row is not None else ""
        return f"{where}field '{self.field}': expected {self.expected}, got {self.got}"


class SchemaError(RlpipeError, ValueError):
    """Rows that do not fit the schema. Nothing from the call that raised it was written."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        lines = [str(p) for p in self.problems[:20]]
        if len(self.problems) > 20:
            lines.append(f"... and {len(self.problems) - 20} more problems")
        super().__init__("; ".join(lines) if len(lines) == 1 else "\n  " + "\n  ".join(lines))

    @classmethod
    def single(cls, field: str, expected: str, got: str, row: int | None = None) -> SchemaError:
        return cls([Problem(field=field, expected=expected, got=got, row=row)])


class TrainingError(RlpipeError):
    """A worker (a rank) of a distributed training run died or failed, so the run stopped; the
    message names the worker and says how to resume."""


class DatasetError(RlpipeError):
    """A directory that is not a usable rlpipe dataset (no manifest, unreadable manifest, ...)."""


class FormatVersionError(DatasetError):
    """A dataset in a format version this code does not read."""


class StorageError(DatasetError):
    """The dataset's disk refused a write: nothing of the append that raised it is acknowledged.

    The writer stays usable: a later append tries the disk again, and shards not yet written are
    retried in the background, so nothing acknowledged is lost and work resumes by itself once
    space is freed. ``since`` is when (``time.time()``) the disk began failing.
    """

    def __init__(self, path: str, error: OSError, since: float, note: str = "") -> None:
        self.path = path
        self.os_error = error
        self.errno = error.errno
        self.strerror = _strerror(error)
        self.since = since
        code = errno.errorcode.get(error.errno or 0, type(error).__name__)
        meaning = _MEANING.get(code, "the dataset cannot be written")
        self.reason = f"{meaning} ({code}: {self.strerror}) at {path}"
        super().__init__(self.reason + note)

    def noting(self, note: str) -> StorageError:
        """The same refusal, its message followed by ``note``."""
        return StorageError(self.path, self.os_error, self.since, note)


_MEANING = {
    "ENOSPC": "the dataset's disk is full",
    "EDQUOT": "the dataset's disk quota is used up",
    "EIO": "the dataset's disk failed to write (an I/O error)",
    "EROFS": "the dataset's disk is read-only",
}


def _strerror(error: OSError) -> str:
    """The OS's words for ``error`` (pyarrow puts its own text in ``strerror``)."""
    if error.errno:
        return os.strerror(error.errno)
    return error.strerror or str(error)


class DamagedFileError(DatasetError):
    """A file of a dataset (a shard, a log segment, the manifest) whose bytes are damaged: a
    checksum that fails, a footer that does not parse, a file cut short. ``path`` names the
    file and ``problem`` says what is wrong; ``rlpipe inspect --repair`` moves it aside."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(
            f"{path}: damaged: {problem}. Run `rlpipe inspect --repair DATASET` to move it "
            "into DATASET/_quarantine/ and list the rows lost"
        )
        self.path = path
        self.problem = problem


class ServerError(RlpipeError):
    """The server refused a request or could not be reached; ``status`` is None for the latter."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status or 'no answer'}: {message}")
        self.status = status
        self.message = message


class RequestRejected(ServerError, ValueError):
    """400, 413 or 415: the request itself is wrong (the message names the field)."""


class Unauthorized(ServerError):
    """401: the token is missing or wrong."""


class EpisodeError(ServerError):
    """404 or 409: the episode is unknown to the server, or has ended."""


class ServerUnavailable(ServerError):
    """The server did not answer, or kept answering 503 (or a proxy 502 or 504), for longer than
    the timeout."""

    def __init__(self, status: int | None, message: str, retry_after: float = 1.0) -> None:
        super().__init__(status, message)
        self.retry_after = retry_after

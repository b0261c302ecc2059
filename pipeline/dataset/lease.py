"""A lease on a dataset's upkeep: one compaction at a time, across processes and machines.

deltalake 1.6.6 lets two OPTIMIZE commits planned on the same snapshot both land (its conflict
checker lets through concurrent removes whose ``dataChange`` is false, so that appends can go on
during a compaction): each removes the same small files and adds its own merged copy, and every
row of them is then in the table twice (measured: 4 files of 200 rows, two compactions at once,
1600 rows of which 800 distinct). So compactions take a lease first.

The lease lives in a small Delta table of its own, ``DATASET/_upkeep`` (invisible to readers:
its name starts with ``_``), which holds no rows: each claim and each release is an empty commit
carrying the app transaction ``rlpipe-upkeep`` at the next version, and saying in its commit
info who holds the lease (``rlpipe.upkeep.holder``) until when (``rlpipe.upkeep.until``, Unix
seconds; 0 once released). Delta refuses a commit whose app transaction another commit updated
since the version it was made on, so of two claims made at once one fails; a claim that finds
another holder's unexpired lease gives up. The holder compacts on a snapshot read after its
claim and releases the lease when done; a holder that died blocks others until its lease
expires (``DEFAULT_LEASE_S``). (A metadata change would conflict too, but deltalake's
``alter`` hangs against moto's S3; app transactions are what writers commit with already.)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from pipeline.dataset.commits import read_commit
from pipeline.dataset.location import Location, storage_failure
from pipeline.errors import DatasetError

LEASE_TABLE = "_upkeep"
APP_ID = "rlpipe-upkeep"
HOLDER = "rlpipe.upkeep.holder"
UNTIL = "rlpipe.upkeep.until"
DEFAULT_LEASE_S = 3600.0
_EMPTY = pa.table({"holder": pa.array([], pa.string())})


class UpkeepBusy(DatasetError):
    """Another process holds the dataset's upkeep lease, or claimed it at the same moment."""


@contextlib.contextmanager
def upkeep_lease(location: Location, seconds: float = DEFAULT_LEASE_S) -> Iterator[str]:
    """Hold the dataset's upkeep lease for the body (at most ``seconds``); yields the holder's
    name.

    Raises:
        UpkeepBusy: another holder's lease has not expired, or it won a claim made at once.
        DatasetError: the store failed, naming the URI and the cause.
    """
    holder = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    table = _lease_table(location)
    _commit(location, table, holder, time.time() + seconds, claim=True)
    try:
        yield holder
    finally:
        with contextlib.suppress(DatasetError):  # else it expires
            table.update_incremental()
            if _state(location, table)[0] == holder:
                _commit(location, table, holder, 0.0, claim=False)


def _lease_table(location: Location) -> DeltaTable:
    uri = location.table_uri(LEASE_TABLE)
    options = dict(location.storage_options) or None
    try:
        try:
            return DeltaTable(uri, storage_options=options)
        except TableNotFoundError:
            with contextlib.suppress(DeltaError):  # another process made it first
                write_deltalake(uri, _EMPTY, mode="ignore", storage_options=options)
            return DeltaTable(uri, storage_options=options)
    except (DeltaError, OSError) as error:
        raise storage_failure(location, "opening the upkeep lease", error) from None


def _state(location: Location, table: DeltaTable) -> tuple[str | None, float]:
    """The holder the last claim or release names, and until when (0: released): from the
    commit info of the latest commit that has them (a creation that lost its race to another
    process's may commit after a claim), read with pyarrow: deltalake's ``history`` holds the
    GIL while it waits on the store, which stalls an S3 endpoint served in-process."""
    for version in range(table.version(), 0, -1):
        actions = read_commit(location, LEASE_TABLE, version)
        if actions is None:  # cleaned up past the log retention: older than any lease
            break
        for action in actions:
            info = action.get("commitInfo")
            if info is not None and HOLDER in info:
                return info[HOLDER], float(info.get(UNTIL) or 0)
    return None, 0.0


def _commit(location: Location, table: DeltaTable, holder: str, until: float, claim: bool) -> None:
    other, other_until = _state(location, table)
    if claim and other and other != holder and other_until > time.time():
        when = datetime.fromtimestamp(other_until, UTC).isoformat(timespec="seconds")
        raise UpkeepBusy(
            f"{location}: another compaction is running ({other}, its lease runs until {when})"
        )
    number = (table.transaction_version(APP_ID) or 0) + 1
    properties = CommitProperties(
        custom_metadata={HOLDER: holder, UNTIL: f"{until:.3f}"},
        app_transactions=[Transaction(APP_ID, number)],
    )
    try:
        table.create_write_transaction(
            [], mode="append", schema=table.schema(), commit_properties=properties
        )
    except CommitFailedError:
        if claim:
            raise UpkeepBusy(f"{location}: another compaction claimed it just now") from None
        raise storage_failure(location, "releasing the upkeep lease", ValueError("lost")) from None
    except (DeltaError, OSError) as error:
        doing = "claiming" if claim else "releasing"
        raise storage_failure(location, f"{doing} the upkeep lease", error) from None

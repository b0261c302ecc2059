"""What an :class:`~pipeline.dataset.reader.InputReader` reads and how it batches it, and the
filters that config makes."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from pipeline.errors import ConfigError
from pipeline.format import layout, schema


@dataclass(frozen=True)
class ReaderConfig:
    """What to read and how to batch it.

    Attributes:
        batch_size: transitions per batch (ignored for episodes: one episode per batch).
        columns: step-table columns (or Batch field names) to read; None reads the transition
            columns (reader.DEFAULT_COLUMNS).
        shuffle: shuffled transitions from a buffer of ``shuffle_buffer`` rows, seeded by ``seed``.
        episodes: yield whole episodes, ordered by ``t``.
        follow: keep reading shards as they are committed, until ``timeout_s`` passes with none
            (None: forever).
        min_policy_version, max_policy_version, since, until, training_enabled, client_ids,
            agent_ids: filters, pushed down to the files.
        skip_shards: shards not to read, as paths under the dataset root
            (``steps/date=.../part-....parquet``, as :attr:`InputReader.shards_read` gives them):
            a follower resumes after the shards an earlier one read, with ``version`` the
            :attr:`InputReader.version` it had then (files a later compaction merged them into
            have other names).
        version: read the step table as it was at this Delta version (with ``follow``, then
            follow on from it); None reads the latest. :attr:`InputReader.version` says which
            version a pass read.
        rank, world_size: this process's share in distributed training.
        device: yield torch batches on this device (``"cpu"``, ``"cuda:0"``), converted once per
            scanned chunk or shuffle buffer and sliced per batch: several times cheaper than
            calling ``Batch.to_torch`` on every batch. None yields numpy batches.
    """

    batch_size: int = 1024
    columns: tuple[str, ...] | None = None
    shuffle: bool = False
    seed: int = 0
    shuffle_buffer: int = 262_144
    episodes: bool = False
    follow: bool = False
    timeout_s: float | None = 30.0
    poll_interval_s: float = 0.2
    drop_last: bool = False
    min_policy_version: int | None = None
    max_policy_version: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    training_enabled: bool | None = None
    client_ids: tuple[str, ...] | None = None
    agent_ids: tuple[str, ...] | None = None
    skip_shards: tuple[str, ...] = ()
    version: int | None = None
    rank: int = 0
    world_size: int = 1
    device: str | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "shuffle_buffer", "world_size"):
            _check_int(name, getattr(self, name), 1)
        _check_int("rank", self.rank, 0)
        if self.version is not None:
            _check_int("version", self.version, 0)
        if self.device is not None and not isinstance(self.device, str):
            raise ConfigError("ReaderConfig", "device", "a torch device name or None", self.device)
        if self.rank >= self.world_size:
            raise ConfigError(
                "ReaderConfig", "rank", f"an integer < world_size={self.world_size}", self.rank
            )
        for name in ("columns", "client_ids", "agent_ids", "skip_shards"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError("ReaderConfig", name, "a sequence of strings", value)
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        for name in ("since", "until"):
            object.__setattr__(self, name, _as_datetime(name, getattr(self, name)))
        if self.timeout_s is not None and not self.timeout_s >= 0:
            raise ConfigError("ReaderConfig", "timeout_s", "seconds >= 0 or None", self.timeout_s)


def build_filter(config: ReaderConfig, extra: ds.Expression | None) -> tuple[Any, Any]:
    """(the shards' ``date`` partitions to read, the rows to keep of them): the config's
    filters and ``extra``, each an expression or None.

    The rows are judged once read (:func:`~pipeline.dataset.discovery.rows_where`), never on
    a shard footer's statistics.
    """
    terms = [] if extra is None else [extra]
    partitions = []
    if config.min_policy_version is not None:
        terms.append(ds.field("policy_version") >= config.min_policy_version)
    if config.max_policy_version is not None:
        terms.append(ds.field("policy_version") <= config.max_policy_version)
    if config.training_enabled is not None:
        terms.append(ds.field("training_enabled") == config.training_enabled)
    if config.client_ids is not None:
        terms.append(ds.field("client_id").isin(list(config.client_ids)))
    if config.agent_ids is not None:
        terms.append(ds.field("agent_id").isin(list(config.agent_ids)))
    if config.since is not None:
        terms.append(ds.field("logged_at") >= pa.scalar(config.since, schema.TIMESTAMP))
        # a shard's partition is its first row's date, so later rows may sit one day earlier
        partitions.append(ds.field(layout.PARTITION_KEY) >= _day(config.since - timedelta(days=1)))
    if config.until is not None:
        terms.append(ds.field("logged_at") < pa.scalar(config.until, schema.TIMESTAMP))
        partitions.append(ds.field(layout.PARTITION_KEY) <= _day(config.until))
    return _all_of(partitions), _all_of(terms)


def _all_of(terms: list[ds.Expression]) -> ds.Expression | None:
    return functools.reduce(operator.and_, terms) if terms else None


def _day(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def _as_datetime(name: str, value: object) -> datetime | None:
    """Accept datetimes and ISO strings; naive times are taken as UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError("ReaderConfig", name, "an ISO 8601 date or datetime", value) from None
    if not isinstance(value, datetime):
        raise ConfigError("ReaderConfig", name, "a datetime or ISO 8601 string", value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError("ReaderConfig", name, f"an integer >= {minimum}", value)

"""How a :class:`~pipeline.dataset.writer.DatasetWriter` rolls shards, and when it acknowledges."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError
from pipeline.format import layout


@dataclass(frozen=True)
class WriterConfig:
    """When shards roll, and how hard the writer pushes back.

    Attributes:
        max_rows: rows per shard before it rolls.
        max_bytes: bytes of log data (Arrow, or row lines) per shard before it rolls.
        max_age_s: seconds from a table's previous roll to its next; bounds how stale a
            following reader can be. The episodes table rolls by age at most every
            EPISODES_MIN_AGE_S, however short this (:meth:`roll_age`).
        row_group_rows: Parquet row group size; smaller groups prune and shuffle better.
        row_group_bytes: the most bytes (in Arrow, before encoding) of a row group: groups of
            large rows (camera frames: 131,072 of them are 2.7 GB) hold fewer rows.
        max_pending_shards: rolled shards waiting to be written before appends wait.
        sync: when an append is acknowledged. ``"always"``: after its rows are fsynced to the log,
            so they survive a power cut as well as a crash of this process. ``"background"``:
            once its rows are written to the log file, which the OS keeps through a ``kill -9``
            or any other death of this process; the log is fsynced every ``sync_interval_s``, so
            a power cut or kernel crash can lose at most that window. A disk sync costs 1-4 ms
            here, so ``"background"`` is what lets a server answer a step in well under that.
        sync_interval_s: how often ``"background"`` fsyncs the log.
    """

    max_rows: int = 1_000_000
    max_bytes: int = 256 * 2**20
    max_age_s: float = 5.0
    row_group_rows: int = 131_072
    row_group_bytes: int = 64 * 2**20
    max_pending_shards: int = 4
    sync: str = "always"
    sync_interval_s: float = 0.05

    def __post_init__(self) -> None:
        for name in (
            "max_rows",
            "max_bytes",
            "row_group_rows",
            "row_group_bytes",
            "max_pending_shards",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError("WriterConfig", name, "an integer >= 1", value)
        for name in ("max_age_s", "sync_interval_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ConfigError("WriterConfig", name, "a number of seconds > 0", value)
        if self.sync not in SYNC_MODES:
            raise ConfigError("WriterConfig", "sync", f"one of {SYNC_MODES}", self.sync)

    def roll_age(self, table: str) -> float:
        """Seconds from a table's previous roll to its next."""
        if table == layout.EPISODES:
            return max(self.max_age_s, EPISODES_MIN_AGE_S)
        return self.max_age_s


SYNC_MODES = ("always", "background")
# Summaries are read by inspection, not by a trainer following the steps, and a Delta commit costs
# some 10 ms of CPU whatever its size. A server committing steps every 50 ms for online PPO (two
# clients, 6,000 steps a second) spent 64-69% of a core with both tables rolling that often,
# 37-41% with the episodes table rolling every second.
EPISODES_MIN_AGE_S = 1.0

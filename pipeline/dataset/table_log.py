"""A table's log as the writer appends to it: its open segment of one kind (Arrow or lines),
and when the last one rolled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from pipeline.dataset import rowlog
from pipeline.dataset.wal import Segment
from pipeline.format import layout, schema


class TableLog:
    """One table's open log segment of one kind (Arrow or lines) and what rolls it."""

    def __init__(
        self, name: str, table_schema: pa.Schema, wal_dir: Path, seqs: Iterator[int], lines: bool
    ) -> None:
        self.name = name
        self.schema = table_schema
        self.lock = threading.Lock()
        self.segment: Segment | None = None
        self.date = ""
        # when it last rolled a segment (or was made): the open one rolls max_age_s after that,
        # not after its own first row, so a steady stream commits a shard every max_age_s, not
        # every max_age_s plus the wait for the first append after a roll (at 0.05 s with
        # appends every 25 ms: a shard every 50 ms, not 69, which an online trainer waits for)
        self.rolled = time.monotonic()
        self.encoder = rowlog.RowEncoder(table_schema) if lines else None
        defaults = schema.STEP_DEFAULTS if name == layout.STEPS else schema.EPISODE_DEFAULTS
        self.defaults = {k: v for k, v in defaults.items() if k != "logged_at"}
        self.given = set(table_schema.names) - {"logged_at"}  # the columns a line takes
        self._wal_dir = wal_dir
        self._seqs = seqs  # shared by the table's two kinds: one shard name per segment

    def open_segment(self, date: str) -> Segment:
        seq = next(self._seqs)
        path = self._wal_dir / layout.segment_name(self.name, seq, rows=self.encoder is not None)
        kind = Segment if self.encoder is None else rowlog.RowSegment
        self.segment = kind(path, self.schema, seq)
        self.date = date
        return self.segment

    def detach(self) -> Segment | None:
        segment, self.segment = self.segment, None
        self.rolled = time.monotonic()
        return segment

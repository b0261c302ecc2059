"""What committing and reading cost on object storage (``pipeline/dataset/delta.py``): the
requests a writer makes per shard it commits, and a reader per file it reads, counted at moto's
S3 endpoint (``s3_fixtures``) from the request log moto's server writes through werkzeug's
logger, one line a request."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import cartpole_spaces
from deltalake import DeltaTable
from s3_fixtures import Bucket

from pipeline import DatasetWriter, InputReader, WriterConfig
from pipeline.dataset.delta import Table
from pipeline.dataset.location import locate

COMMITS = 12  # after a first, which creates the table


def steps(name: str, rows: int) -> dict[str, object]:
    observations = np.zeros((rows, 4), np.float32)
    return {
        "episode_id": np.full(rows, name),
        "t": np.arange(rows),
        "observation": observations,
        "action": np.zeros(rows, np.int64),
        "reward": np.ones(rows),
        "next_observation": observations,
        "terminated": np.zeros(rows, bool),
        "truncated": np.zeros(rows, bool),
    }


def requests_of(bucket: Bucket) -> re.Pattern[str]:
    """The request line of anything in ``bucket``, as moto logs it: the method and the path.
    werkzeug colours the line of a status other than 200 (a 404, a 206) with ANSI codes."""
    return re.compile(rf'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (/{bucket.name}[/?][^ ]*)')


def test_a_commit_makes_a_few_requests_however_long_the_log(
    bucket: Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    """A shard's file and its commit take at most 10 requests, the same at the 3rd commit as at
    the 13th: deltalake's answers that replay the log (a transaction version asked of the
    table; a commit from a table object some versions behind) are not asked per commit."""
    writer = DatasetWriter(
        bucket.uri(),
        *cartpole_spaces(),
        config=WriterConfig(max_age_s=60.0),
        storage_options=bucket.options,
        state_dir=bucket.state_dir,
    )
    # werkzeug colours the line of a status other than 200 (a 404, a 206) with ANSI codes
    mine = requests_of(bucket)
    counts = []
    with writer, caplog.at_level(logging.INFO, logger="werkzeug"):
        for number in range(COMMITS + 1):
            caplog.clear()
            writer.append(steps(f"e{number}", 50))
            writer.flush()
            counts.append(sum(1 for r in caplog.records if mine.search(r.getMessage())))
    # after the commit that makes the table, the first that opens it also reads the commits
    # deltalake replayed, to check them (pipeline.dataset.commits): once per writer
    later = counts[2:]
    assert max(later) <= 10, counts
    assert sum(later[-4:]) <= sum(later[:4]), counts  # no growth with the log
    # deltalake's checkpoint interval here (100): a checkpoint costs some 25 requests
    table = Table(locate(bucket.uri(), bucket.options), "steps").open()
    assert table is not None and "delta.checkpointInterval" not in table.metadata().configuration


def test_a_local_table_checkpoints_every_10_commits(tmp_path: Path) -> None:
    """On a local disk a commit replays the log since the last checkpoint (14 ms a commit at
    deltalake's interval of 100, 7 ms at Delta's own default of 10), so rlpipe's tables there
    are made with 10."""
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        for number in range(COMMITS):
            writer.append(steps(f"e{number}", 10))
            writer.flush()
    table = DeltaTable(str(tmp_path / "steps"))
    assert table.metadata().configuration["delta.checkpointInterval"] == "10"
    assert list((tmp_path / "steps" / "_delta_log").glob("*.checkpoint.parquet"))  # at 9


def test_a_reader_asks_no_file_its_size(bucket: Bucket, caplog: pytest.LogCaptureFixture) -> None:
    """The snapshot gives each file's size, so a pass reads each file's footer and its data
    and asks nothing else of it (a HEAD per file before each of those two reads, otherwise);
    the manifest is read without a look first."""
    with DatasetWriter(
        bucket.uri(),
        *cartpole_spaces(),
        storage_options=bucket.options,
        state_dir=bucket.state_dir,
    ) as writer:
        for number in range(3):
            writer.append(steps(f"e{number}", 500))
            writer.flush()
    with caplog.at_level(logging.INFO, logger="werkzeug"):
        caplog.clear()
        reader = InputReader(bucket.uri(), storage_options=bucket.options, batch_size=4096)
        opening = made_in(bucket, caplog)
        caplog.clear()
        assert sum(len(batch) for batch in reader) == 1500
        reading = made_in(bucket, caplog)
    manifest = [method for method, path in opening if path.endswith("/manifest.json")]
    assert manifest == ["HEAD", "GET"], opening  # its size, then it: not "is it there?" first
    parquet = [method for method, path in reading if ".parquet" in path]
    assert parquet == ["GET"] * 6, reading


def made_in(bucket: Bucket, caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The (method, path) of each request moto logged for ``bucket`` in ``caplog``."""
    found = [requests_of(bucket).search(record.getMessage()) for record in caplog.records]
    return [(match[1], match[2]) for match in found if match]

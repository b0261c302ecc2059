"""DatasetWriter: what goes in comes out, bad rows are refused whole, shards roll and commit."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import cartpole_rollout, cartpole_spaces

from pipeline import (
    ConfigError,
    DatasetError,
    DatasetWriter,
    InputReader,
    SchemaError,
    SpaceError,
    WriterConfig,
    read_manifest,
)
from pipeline.dataset.writer_config import EPISODES_MIN_AGE_S
from pipeline.format.layout import DEFAULT_AGENT_ID
from pipeline.format.schema import rows_to_columns


def _read_all(path: Path, **options: Any) -> Any:
    batches = list(InputReader(path, batch_size=1_000_000, **options))
    assert len(batches) == 1
    return batches[0]


def test_rows_round_trip_exactly(tmp_path: Path) -> None:
    rows = cartpole_rollout(700)
    with DatasetWriter(tmp_path, *cartpole_spaces(), env_id="CartPole-v1") as writer:
        for start in range(0, 700, 100):
            writer.append({key: value[start : start + 100] for key, value in rows.items()})
        assert writer.rows_acknowledged == 700
    batch = _read_all(tmp_path)
    np.testing.assert_array_equal(batch.observations, rows["observation"])
    np.testing.assert_array_equal(batch.next_observations, rows["next_observation"])
    np.testing.assert_array_equal(batch.actions, rows["action"])
    np.testing.assert_array_equal(batch.rewards, rows["reward"])
    np.testing.assert_array_equal(batch.terminateds, rows["terminated"])
    np.testing.assert_array_equal(batch.episode_ids, rows["episode_id"])
    assert set(batch.agent_ids) == {DEFAULT_AGENT_ID}
    assert np.isnan(batch.action_logps).all() and (batch.policy_versions == -1).all()
    assert read_manifest(tmp_path).env_id == "CartPole-v1"


def test_rows_become_columns_at_the_edge(tmp_path: Path) -> None:
    rows = [
        {"episode_id": "e", "t": t, "observation": [0.1 * t] * 4, "action": t % 2, "reward": 1,
         "next_observation": [0.1 * t + 0.1] * 4, "terminated": t == 2, "truncated": False,
         "info": {"lives": 3}, "action_logp": -0.69, "policy_version": 4}
        for t in range(3)
    ]  # fmt: skip
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append(rows_to_columns(rows))
    batch = _read_all(tmp_path, columns=["observation", "info", "action_logp", "policy_version"])
    np.testing.assert_allclose(batch.observations[2], [0.2] * 4, rtol=1e-6)
    assert list(batch.infos) == ['{"lives": 3}'] * 3
    np.testing.assert_allclose(batch.action_logps, -0.69)
    assert list(batch.policy_versions) == [4, 4, 4]


def _good_rows(n: int = 4) -> dict[str, Any]:
    return {key: value[:n] for key, value in cartpole_rollout(n).items()}


BAD_ROWS = [
    ("reward", lambda r: r["reward"].__setitem__(2, np.nan),
     "row 2, field 'reward': expected finite values, got nan"),
    ("observation", lambda r: r.__setitem__("observation", np.zeros((4, 3), np.float32)),
     "field 'observation': expected float32 of shape (4,) per row, got shape (3,)"),
    ("action", lambda r: r["action"].__setitem__(1, 5),
     "row 1, field 'action': expected an integer in [0, 2), got 5"),
    ("t", lambda r: r["t"].__setitem__(3, -1),
     "row 3, field 't': expected a step index >= 0, got -1"),
    ("missing", lambda r: r.pop("reward"),
     "field 'reward': expected a value for every row, got no such column"),
    ("length", lambda r: r.__setitem__("t", np.arange(3)),
     "field 't': expected 4 rows like the other columns, got 3 rows"),
    ("episode_id", lambda r: r["episode_id"].__setitem__(0, ""),
     "row 0, field 'episode_id': expected a non-empty string, got ''"),
    ("info", lambda r: r.__setitem__("info", ["{}", "{bad", None, None]),
     "row 1, field 'info': expected JSON text, got '{bad'"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "spoil", "message"), BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_bad_rows_are_refused_whole(tmp_path: Path, case: str, spoil: Any, message: str) -> None:
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append(_good_rows())
        rows = _good_rows()
        spoil(rows)
        with pytest.raises(SchemaError, match=re.escape(message)):
            writer.append(rows)
        writer.append(_good_rows())
        assert writer.rows_acknowledged == 8
    assert len(_read_all(tmp_path)) == 8


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    rows = _good_rows()
    rows["reward"][0] = np.inf
    rows["action"][3] = -1
    rows["unknown"] = np.zeros(4)
    with (
        DatasetWriter(tmp_path, *cartpole_spaces()) as writer,
        pytest.raises(SchemaError) as caught,
    ):
        writer.append(rows)
    fields = sorted(problem.field for problem in caught.value.problems)
    assert fields == ["unknown"]  # an unknown column stops before per-row checks
    del rows["unknown"]
    with (
        DatasetWriter(tmp_path, *cartpole_spaces()) as writer,
        pytest.raises(SchemaError) as caught,
    ):
        writer.append(rows)
    assert sorted(problem.field for problem in caught.value.problems) == ["action", "reward"]


def test_shards_roll_by_rows_and_age(tmp_path: Path) -> None:
    config = WriterConfig(max_rows=300, max_age_s=0.2)
    rows = cartpole_rollout(1000)
    with DatasetWriter(tmp_path, *cartpole_spaces(), config=config) as writer:
        for start in range(0, 1000, 100):
            writer.append({key: value[start : start + 100] for key, value in rows.items()})
        deadline = time.monotonic() + 10
        # counted once the committing thread is done with the shard: its file shows while it is
        # being written (readers go by the table's log, which names it only once it is whole)
        while writer.shards_committed < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # the last 100 rows commit by age, without a flush
        shards = sorted(tmp_path.glob("steps/date=*/part-*.parquet"))
        assert [pq.read_metadata(s).num_rows for s in shards] == [300, 300, 300, 100]


def test_age_counts_from_the_tables_previous_roll(tmp_path: Path) -> None:
    """A segment rolls max_age_s after the table's previous roll, not after its own first row:
    rows appended after a longer quiet spell commit at the next tick, and a steady stream
    commits a shard every max_age_s (docs/format.md, "Rolling")."""
    rows = cartpole_rollout(100)
    config = WriterConfig(max_age_s=2.0)
    with DatasetWriter(tmp_path, *cartpole_spaces(), config=config) as writer:
        writer.append(rows)
        writer.flush()  # a roll
        time.sleep(2.1)  # longer than max_age_s since it
        appended = time.monotonic()
        writer.append(rows)
        while writer.shards_committed < 2 and time.monotonic() - appended < 10:
            time.sleep(0.02)
        waited = time.monotonic() - appended
        committing = writer.last_commit_seconds  # the second shard's, before close commits more
    assert writer.shards_committed == 2
    # rolled at the next tick (0.25 s), not 2 s after its first row: the time to the commit's
    # start, since writing and committing a shard took 1.9 s in all once on a busy CI machine
    assert waited - committing < 1.5


def test_episode_summaries_roll_at_most_once_a_second(tmp_path: Path) -> None:
    """With max_age_s of 50 ms the steps table commits every 50 ms, the episodes table (read by
    inspection, not by a following trainer) at most once a second; a flush commits both."""
    rows = cartpole_rollout(10)
    started = datetime(2026, 11, 26, tzinfo=UTC)
    summary = {
        "episode_id": "e",
        "agent_id": DEFAULT_AGENT_ID,
        "client_id": "",
        "started_at": started,
        "ended_at": started,
        "length": 10,
        "return": 10.0,
        "end_reason": "terminated",
    }
    config = WriterConfig(max_age_s=0.05)
    with DatasetWriter(tmp_path, *cartpole_spaces(), config=config) as writer:
        began = time.monotonic()
        for number in range(12):
            writer.append(rows)
            writer.append_episodes(rows_to_columns([{**summary, "episode_id": f"e{number}"}]))
            time.sleep(0.06)
        elapsed = time.monotonic() - began
        steps_log = list(tmp_path.glob("steps/_delta_log/*.json"))
        episodes_log = list(tmp_path.glob("episodes/_delta_log/*.json"))
        assert len(steps_log) >= 6
        assert len(episodes_log) <= elapsed / EPISODES_MIN_AGE_S + 1
        writer.flush()
    assert len(_read_all(tmp_path, columns=["t"])) == 120
    assert len(pq.ParquetDataset(tmp_path / "episodes").read()) == 12


def test_a_flush_racing_the_age_roll_still_waits_for_the_commit(tmp_path: Path) -> None:
    """With the ticker rolling every millisecond, a flush often finds the segment detached by
    it; flush must still return only once those rows are committed, and close must commit the
    last of them (a roll queued after close's own flush used to be dropped with the log)."""
    rows = cartpole_rollout(10)
    config = WriterConfig(max_age_s=0.004)
    appended = 0
    for _ in range(2):
        with DatasetWriter(tmp_path, *cartpole_spaces(), config=config) as writer:
            for _ in range(10):
                writer.append(rows)
                appended += 10
                writer.flush()
                assert len(_read_all(tmp_path, columns=["t"])) == appended
            writer.append(rows)
            appended += 10
            time.sleep(0.004)  # close around the ticker's roll of these rows
    assert len(_read_all(tmp_path, columns=["t"])) == appended


def _append_until_closed(writer: DatasetWriter, rows: Any, acknowledged: list[int]) -> None:
    with contextlib.suppress(DatasetError):  # closed: refused, nothing acknowledged
        while True:
            acknowledged.append(writer.append(rows))


def test_appends_racing_close_are_committed_or_refused(tmp_path: Path) -> None:
    """Appends from other threads while close() runs: each either raises (the writer is
    closed) or its rows are in the table after close; none is acknowledged, then dropped."""
    rows = cartpole_rollout(10)
    expected = 0
    for _ in range(5):
        writer = DatasetWriter(tmp_path, *cartpole_spaces())
        acknowledged: list[int] = []
        threads = [
            threading.Thread(target=_append_until_closed, args=(writer, rows, acknowledged))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.05)
        writer.close()
        for thread in threads:
            thread.join()
        expected += sum(acknowledged)
        assert len(_read_all(tmp_path, columns=["t"])) == expected


def test_shards_describe_themselves(make_dataset: Any) -> None:
    path = make_dataset(steps=100)
    shard = next(path.glob("steps/date=*/part-*.parquet"))
    metadata = pq.read_schema(shard).metadata
    assert b"rlpipe.observation_space" in metadata and b"rlpipe.format_version" in metadata
    encodings = pq.ParquetFile(shard).metadata.row_group(0)
    by_path = {
        encodings.column(i).path_in_schema: encodings.column(i)
        for i in range(encodings.num_columns)
    }
    assert "BYTE_STREAM_SPLIT" in by_path["observation.list.element"].encodings
    assert by_path["reward"].compression == "ZSTD"


def test_concurrent_appends_from_threads_all_land(tmp_path: Path) -> None:
    rows = cartpole_rollout(50)

    def append_many(writer: DatasetWriter, client: str) -> None:
        for _ in range(20):
            writer.append(rows | {"client_id": np.full(50, client)})

    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        threads = [threading.Thread(target=append_many, args=(writer, f"c{i}")) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    batch = _read_all(tmp_path, columns=["client_id"])
    assert len(batch) == 8 * 20 * 50
    assert sorted(set(batch.client_ids)) == [f"c{i}" for i in range(8)]


def test_shards_roll_by_bytes(tmp_path: Path) -> None:
    rows = cartpole_rollout(1000)
    # a CartPole step is ~60 bytes in Arrow: 10 kB rolls after every second 100-row append
    config = WriterConfig(max_bytes=10_000, max_age_s=60)
    with DatasetWriter(tmp_path, *cartpole_spaces(), config=config) as writer:
        for start in range(0, 1000, 100):
            writer.append({key: value[start : start + 100] for key, value in rows.items()})
        writer.flush()
        shards = sorted(tmp_path.glob("steps/date=*/*.parquet"))
        sizes = [pq.read_metadata(shard).num_rows for shard in shards]
    assert sum(sizes) == 1000 and len(sizes) >= 4
    assert all(size <= 200 for size in sizes)


def test_acknowledged_rows_survive_a_failed_commit(tmp_path: Path) -> None:
    """If shards cannot be written, close() fails loudly and the log keeps the rows for later."""
    rows = cartpole_rollout(100)
    writer = DatasetWriter(tmp_path, *cartpole_spaces())
    (tmp_path / "steps").write_text("a file where the steps directory should be")
    writer.append(rows)
    with pytest.raises(DatasetError, match="acknowledged rows are safe in the log"):
        writer.close()
    (tmp_path / "steps").unlink()
    with DatasetWriter(tmp_path) as again:
        assert [item.rows for item in again.recovered] == [100]
    assert len(_read_all(tmp_path)) == 100


def test_bad_spaces_leave_no_files(tmp_path: Path) -> None:
    with pytest.raises(SpaceError):
        DatasetWriter(tmp_path / "ds", gym.spaces.Box(0, 1, (0,)), gym.spaces.Discrete(2))
    assert not (tmp_path / "ds").exists()


def test_writers_opening_at_once_do_not_trip_over_each_other(tmp_path: Path) -> None:
    """Each new writer scans the log for dead writers while others are claiming theirs."""
    DatasetWriter(tmp_path, *cartpole_spaces()).close()
    rows = cartpole_rollout(10)
    errors: list[BaseException] = []

    def open_append_close() -> None:
        try:
            for _ in range(20):
                with DatasetWriter(tmp_path) as writer:
                    writer.append(rows)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=open_append_close) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert len(_read_all(tmp_path)) == 1200


def test_two_writers_share_a_directory(tmp_path: Path) -> None:
    rows = cartpole_rollout(100)
    first = DatasetWriter(tmp_path, *cartpole_spaces())
    second = DatasetWriter(tmp_path)  # spaces come from the manifest
    first.append(rows)
    second.append(rows)
    first.close()
    second.close()
    assert len(_read_all(tmp_path)) == 200
    assert first.writer_id != second.writer_id


def test_reopening_continues_the_dataset(make_dataset: Any) -> None:
    path = make_dataset(steps=100)
    with DatasetWriter(path) as writer:
        writer.append(cartpole_rollout(50, seed=1))
    assert len(_read_all(path)) == 150


def test_other_spaces_are_refused(make_dataset: Any) -> None:
    path = make_dataset(steps=10)
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    with pytest.raises(DatasetError, match="Write to a new directory"):
        DatasetWriter(path, box, gym.spaces.Discrete(2))


def test_missing_manifest_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not an rlpipe dataset"):
        DatasetWriter(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("max_rows", 0, "an integer >= 1"), ("max_age_s", -1.0, "a number of seconds > 0"),
     ("row_group_rows", 2.5, "an integer >= 1"),
     ("sync", "sometimes", "one of ('always', 'background')"),
     ("sync_interval_s", 0, "a number of seconds > 0")],
)  # fmt: skip
def test_config_is_validated(field: str, value: Any, expected: str) -> None:
    with pytest.raises(
        ConfigError, match=re.escape(f"WriterConfig.{field}: expected {expected}, got {value!r}")
    ):
        WriterConfig(**{field: value})


def test_episodes_table(tmp_path: Path) -> None:
    now = np.datetime64("2026-11-22T10:00:00", "us")
    with DatasetWriter(tmp_path, *cartpole_spaces(), env_id="CartPole-v1") as writer:
        writer.append_episodes(
            rows_to_columns(
                [
                    {
                        "episode_id": "e1",
                        "started_at": now,
                        "ended_at": now,
                        "length": 12,
                        "return": 12.0,
                        "end_reason": "terminated",
                        "seed": 3,
                        "reset_options": {"low": -0.1},
                    }
                ]
            )
        )
        with pytest.raises(SchemaError, match=re.escape("field 'end_reason': expected one of")):
            writer.append_episodes(
                rows_to_columns(
                    [
                        {
                            "episode_id": "e2",
                            "started_at": now,
                            "ended_at": now,
                            "length": 1,
                            "return": 0.0,
                            "end_reason": "done",
                        }
                    ]
                )
            )
        late = {"episode_id": "e3", "length": 1, "return": 0.0, "end_reason": "terminated"}
        for rows in ([late], [late] * 300):  # as a line, and as an Arrow batch
            message = (
                "row 0, field 'started_at': expected a time no later than ended_at, got "
                "2026-11-22 10:00:01+00:00, after ended_at 2026-11-22 10:00:00+00:00"
            )
            with pytest.raises(SchemaError, match=re.escape(message)):
                writer.append_episodes(
                    rows_to_columns(
                        [{**row, "started_at": now + 1_000_000, "ended_at": now} for row in rows]
                    )
                )
    table = pq.read_table(next(tmp_path.glob("episodes/date=*/*.parquet")))
    assert table.column("episode_id").to_pylist() == ["e1"]
    assert table.column("reset_options").to_pylist() == ['{"low": -0.1}']


def test_closed_writer_refuses_appends(tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path, *cartpole_spaces())
    writer.close()
    writer.close()
    with pytest.raises(DatasetError, match="closed"):
        writer.append(cartpole_rollout(1))

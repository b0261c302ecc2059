"""Line segments of the log: small appends stored exactly as the validating path stores them,
torn tails dropped, bad values refused, and tables the form does not fit left to Arrow."""

from __future__ import annotations

import errno
import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from conftest import cartpole_spaces

from pipeline import DatasetError, DatasetWriter, SchemaError, StorageError, recover
from pipeline.dataset import records, rowlog
from pipeline.dataset.writer import LINE_MAX_ROWS
from pipeline.errors import RlpipeWarning
from pipeline.format import schema
from pipeline.format.layout import DEFAULT_AGENT_ID


def _rows(n: int, episode: str = "e") -> list[dict[str, Any]]:
    """Steps as the server builds them: numpy observations, every column given."""
    rng = np.random.default_rng(3)
    observations = rng.standard_normal((n + 1, 4)).astype(np.float32)
    return [
        {"episode_id": episode, "agent_id": DEFAULT_AGENT_ID, "t": t,
         "observation": observations[t], "action": t % 2, "reward": 1.0 / (t + 3),
         "next_observation": observations[t + 1], "terminated": t == n - 1, "truncated": False,
         "action_logp": -0.1 * t, "policy_version": 7 if t else None, "training_enabled": True,
         "info": {"lives": t} if t % 2 else None, "client_id": "c1"}
        for t in range(n)
    ]  # fmt: skip


def _checked(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """The steps as the full validation builds them: appended, they take the Arrow log."""
    columns = schema.rows_to_columns(rows)
    return schema.steps_from_columns(
        schema.step_schema(*cartpole_spaces()), columns, *cartpole_spaces()
    )


def _columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The same steps column by column, as the server's vectorized path hands them."""
    columns: dict[str, Any] = {name: [row[name] for row in rows] for name in rows[0]}
    columns["next_observation"] = np.stack(columns["next_observation"])
    return columns


def _summary(episode: str, length: int) -> dict[str, Any]:
    start = datetime(2026, 11, 23, 5, 0, 0, 123456, tzinfo=UTC)
    return {"episode_id": episode, "agent_id": DEFAULT_AGENT_ID, "client_id": "c1",
            "started_at": start, "ended_at": start + timedelta(seconds=2), "length": length,
            "return": 2.5, "env_id": "CartPole-v1", "seed": 11, "reset_options": {"a": 1},
            "end_reason": "terminated", "training_enabled": True}  # fmt: skip


def _table(path: Path, name: str) -> pa.Table:
    table = ds.dataset(path / name, format="parquet", partitioning="hive").to_table()
    return table.drop_columns(["logged_at", "date"]).sort_by([("episode_id", "ascending")])


def test_small_appends_are_stored_as_the_validating_path_stores_them(tmp_path: Path) -> None:
    """Numbers packed as bytes, the rest as values, whether given as lists or arrays."""
    rows, summaries = _rows(5, "a") + _rows(3, "b") + _rows(2, "c"), [_summary("a", 5)]
    rows[6]["policy_version"] = None  # a column with a null keeps its values
    with DatasetWriter(tmp_path / "checked", *cartpole_spaces()) as writer:
        writer.append(_checked(rows))
        writer.append_episodes(schema.episodes_from_columns(schema.rows_to_columns(summaries)))
    with DatasetWriter(tmp_path / "logged", *cartpole_spaces()) as writer:
        writer.append(_columns(rows[:5]))
        writer.append(schema.rows_to_columns(rows[5:8]))
        writer.append(_columns(rows[8:]))
        writer.append_episodes(schema.rows_to_columns(summaries))
        segments = sorted(p.name for p in (tmp_path / "logged" / "_wal").glob("*/*"))
        assert segments == ["LOCK", "episodes-00000000.rows", "steps-00000000.rows"]
        lines = next((tmp_path / "logged" / "_wal").glob("*/steps-*")).read_bytes().split(b"\n")
        assert [line[9:10] for line in lines[1:]] == [b"{", b"{", b"{", b""]  # behind a CRC
    for name in ("steps", "episodes"):
        assert _table(tmp_path / "logged", name).equals(_table(tmp_path / "checked", name))
    stored = _table(tmp_path / "logged", "steps")
    assert stored.column("observation").to_pylist()[1] == rows[1]["observation"].tolist()


def test_large_appends_and_ones_with_their_own_clock_take_the_arrow_log(tmp_path: Path) -> None:
    rows = _rows(LINE_MAX_ROWS + 1)
    stamp = datetime(2026, 11, 20, tzinfo=UTC)
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append(_columns(rows))
        writer.append({**_columns(rows[:2]), "logged_at": [stamp] * 2})
        segments = sorted(p.name for p in (tmp_path / "_wal").glob("*/steps-*"))
        assert segments == ["steps-00000000.arrows", "steps-00000001.arrows"]  # two dates
    logged = ds.dataset(tmp_path / "steps", format="parquet").to_table().column("logged_at")
    assert logged.to_pylist().count(stamp) == 2


def test_a_small_append_with_defaults_is_one_line(tmp_path: Path) -> None:
    given = [
        "episode_id",
        "t",
        "observation",
        "action",
        "reward",
        "next_observation",
        "terminated",
        "truncated",
    ]
    rows = [{name: row[name] for name in given} for row in _rows(3)]
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append(schema.rows_to_columns(rows))
        segments = sorted(p.name for p in (tmp_path / "_wal").glob("*/steps-*"))
        assert segments == ["steps-00000000.rows"]
    stored = _table(tmp_path, "steps")
    assert stored.column("agent_id").to_pylist() == [DEFAULT_AGENT_ID] * 3
    assert stored.column("training_enabled").to_pylist() == [True] * 3


def test_a_dead_writers_line_segment_is_recovered_without_its_torn_tail(tmp_path: Path) -> None:
    table_schema = schema.step_schema(*cartpole_spaces())
    encoder = rowlog.RowEncoder(table_schema)

    def encode(rows: list[dict[str, Any]], now: int) -> tuple[Any, bytes]:
        return encoder.encode(_columns(rows), now)

    wal = tmp_path / "_wal" / "deadbeef0000"
    wal.mkdir(parents=True)
    (wal / "LOCK").touch()
    segment = rowlog.RowSegment(wal / "steps-00000000.rows", table_schema, 0)
    now = 1_795_410_975_201_755
    for part in (_rows(2, "a"), _rows(3, "b")):
        checked, line = encode(part, now)
        segment.write(line, len(part), checked)
    _, torn = encode(_rows(4, "c"), now)
    segment.write_message(torn[:-9])  # the append that was being written when the writer died
    segment.close()
    assert [r.rows for r in recover(tmp_path)] == [5]
    stored = _table(tmp_path, "steps")
    assert stored.column("episode_id").to_pylist() == ["a"] * 2 + ["b"] * 3
    expected = pa.Table.from_pylist(_rows(2, "a") + _rows(3, "b"))
    for name in ("observation", "reward", "terminated", "info", "policy_version"):
        want = [json.dumps(v) if isinstance(v, dict) else v
                for v in expected.column(name).to_pylist()]  # fmt: skip
        assert stored.column(name).to_pylist() == want, name
    assert not list(wal.parent.glob("*/*")), "recovery left the segment behind"
    logged = ds.dataset(tmp_path / "steps", format="parquet").to_table().column("logged_at")
    assert logged[0].value == now


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("reward", float("nan"), "row 1, field 'reward': expected finite values, got nan"),
        ("action_logp", float("-inf"), "row 1, field 'action_logp': expected finite values"),
        ("info", "{not json", "row 1, field 'info': expected JSON text"),
    ],
)  # fmt: skip
def test_small_appends_that_fail_the_checks_are_refused_whole(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    rows = _rows(3)
    rows[1][field] = value
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        with pytest.raises(SchemaError, match=re.escape(message)):
            writer.append(schema.rows_to_columns(rows))
        writer.append(schema.rows_to_columns(_rows(2, "good")))
    assert _table(tmp_path, "steps").column("episode_id").to_pylist() == ["good", "good"]


def test_tables_the_row_form_does_not_fit_stay_arrow(tmp_path: Path) -> None:
    image = gym.spaces.Box(0, 255, (16, 16), np.uint8)
    assert rowlog.fits(schema.step_schema(*cartpole_spaces()))
    assert not rowlog.fits(schema.step_schema(image, gym.spaces.Discrete(2)))
    rows = [dict(row, observation=np.full((16, 16), t, np.uint8),
                 next_observation=np.full((16, 16), t + 1, np.uint8))
            for t, row in enumerate(_rows(3))]  # fmt: skip
    with DatasetWriter(tmp_path, image, gym.spaces.Discrete(2)) as writer:
        writer.append(schema.rows_to_columns(rows))
        assert [p.name for p in (tmp_path / "_wal").glob("*/steps-*")] == ["steps-00000000.arrows"]
    assert _table(tmp_path, "steps").column("t").to_pylist() == [0, 1, 2]


BAD_VALUES = [
    ("episode_id", "e\ud800"),  # a lone surrogate: JSON carries it, UTF-8 and Arrow do not
    ("info", '{"x": "\ud800"}'),
    ("t", 2**63),
    ("reward", "1.5"),
    ("reward", float("inf")),
    ("action_logp", float("nan")),
    ("terminated", 1),
    ("observation", None),
    ("observation", [0.1, 0.2, 0.3]),
    ("observation", [0.1, None, 0.3, 0.4]),
    ("next_observation", "abcd"),
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES, ids=[f"{f}={v!r}" for f, v in BAD_VALUES])
def test_a_value_arrow_cannot_take_never_reaches_the_log(
    tmp_path: Path, field: str, value: Any
) -> None:
    """Accepted into the log but refused by Arrow at commit, a row would fail the commit and
    then every recovery of the dataset: each such value must be refused at the append."""
    rows = _rows(3, "bad")
    rows[2][field] = value  # not the segment's first row, nor the append's
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append(schema.rows_to_columns(_rows(2, "first")))
        with pytest.raises(SchemaError):
            writer.append(schema.rows_to_columns(rows))
        writer.append(schema.rows_to_columns(_rows(1, "after")))
    with DatasetWriter(tmp_path) as writer:
        assert writer.recovered == []
    assert _table(tmp_path, "steps").column("episode_id").to_pylist() == ["after"] + ["first"] * 2


SPACE_VALUES = [
    ("action", 2, "row 2, field 'action': expected an integer in [0, 2), got 2"),
    ("action", -1, "row 2, field 'action': expected an integer in [0, 2), got -1"),
    ("episode_id", "", "row 2, field 'episode_id': expected a non-empty string, got ''"),
    ("t", -1, "row 2, field 't': expected a step index >= 0, got -1"),
    ("observation", [0.0, 1e39, 0.0, 0.0], "field 'observation': expected finite values"),
    ("unknown", 1, "field 'unknown': expected one of the columns"),
]


@pytest.mark.parametrize(
    ("field", "value", "message"), SPACE_VALUES, ids=[f"{f}={v!r}" for f, v, _ in SPACE_VALUES]
)
def test_a_small_append_gets_the_checks_of_the_full_validation(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    """What Arrow takes but the dataset does not (an action outside its space, an empty id) is
    refused with the full validation's message, and nothing of the append is written."""
    rows = _rows(3, "bad")
    rows[2][field] = value
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        with pytest.raises(SchemaError, match=re.escape(message)):
            writer.append(schema.rows_to_columns(rows))
        writer.append(schema.rows_to_columns(_rows(1, "after")))
    assert _table(tmp_path, "steps").column("episode_id").to_pylist() == ["after"]


def test_an_episode_the_dataset_does_not_take_is_refused(tmp_path: Path) -> None:
    bad = [dict(_summary("a", 1), length=-1), dict(_summary("b", 1), end_reason="done")]
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        for summary in bad:
            with pytest.raises(SchemaError):
                writer.append_episodes(schema.rows_to_columns([summary]))
        writer.append_episodes(schema.rows_to_columns([_summary("c", 1)]))
    assert _table(tmp_path, "episodes").column("episode_id").to_pylist() == ["c"]


def test_a_nan_beside_a_null_never_reaches_the_log(tmp_path: Path) -> None:
    """A float column with a null is written value by value, where NaN must still be refused
    (JSON has no NaN; written as null it would pass for a missing value)."""
    rows = _rows(3, "bad")
    rows[0]["action_logp"], rows[2]["action_logp"] = None, float("nan")
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        for append in (
            lambda: writer.append(schema.rows_to_columns(rows)),
            lambda: writer.append(_columns(rows)),
        ):
            with pytest.raises(SchemaError, match="field 'action_logp': expected finite values"):
                append()
        writer.append(schema.rows_to_columns(_rows(1, "after")))
    assert _table(tmp_path, "steps").column("episode_id").to_pylist() == ["after"]


def test_an_episode_row_arrow_cannot_take_never_reaches_the_log(tmp_path: Path) -> None:
    summary = dict(_summary("b", 1), started_at=np.datetime64("2026-11-23T05:00:00.123456789"))
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append_episodes(schema.rows_to_columns([_summary("a", 1)]))
        with pytest.raises(SchemaError):
            writer.append_episodes(schema.rows_to_columns([summary]))
    assert _table(tmp_path, "episodes").column("episode_id").to_pylist() == ["a"]


def test_lists_of_either_shape_and_reused_buffers_are_stored_as_appended(tmp_path: Path) -> None:
    """A float Box(2, 2): the columnar step path hands (2, 2) arrays, the general one flat
    lists; a caller may refill its array once the append returns."""
    space = gym.spaces.Box(-1, 1, (2, 2), np.float32)
    buffer = np.zeros((2, 2), np.float32)
    stored = []
    with DatasetWriter(tmp_path, space, gym.spaces.Discrete(2)) as writer:
        for t in range(3):
            buffer[:] = t / 4
            flat = (buffer + 0.5).reshape(-1).tolist()
            row = dict(_rows(1, f"e{t}")[0], observation=buffer, next_observation=flat)
            writer.append(schema.rows_to_columns([row]))
            stored.append(buffer.reshape(-1).tolist())
        assert [p.suffix for p in (tmp_path / "_wal").glob("*/steps-*")] == [".rows"]
    table = _table(tmp_path, "steps")
    assert table.column("observation").to_pylist() == stored
    assert table.column("next_observation").to_pylist()[2] == [1.0] * 4


def test_an_unknown_row_segment_stops_recovery_and_stays(tmp_path: Path) -> None:
    segment = tmp_path / "_wal" / "deadbeef0000" / "steps-00000000.rows"
    segment.parent.mkdir(parents=True)
    (segment.parent / "LOCK").touch()
    segment.write_bytes(b'{"format": "rlpipe-rows-v9"}\n[["e"]]\n')
    with pytest.raises(DatasetError, match="not a row segment this rlpipe reads"):
        recover(tmp_path)
    assert segment.exists(), "rows a later rlpipe wrote must not be dropped as torn"


def test_a_write_that_fails_part_way_rolls_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk mid-append: that append fails, the acknowledged ones and later ones land."""
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append(schema.rows_to_columns(_rows(2, "a")))
        real_write = os.write

        def full_disk(fd: int, data: Any) -> int:
            real_write(fd, bytes(data)[:7])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full_disk)
        with pytest.raises(StorageError, match=r"disk is full \(ENOSPC: No space left"):
            writer.append(schema.rows_to_columns(_rows(2, "b")))
        monkeypatch.setattr(os, "write", real_write)
        writer.append(schema.rows_to_columns(_rows(2, "c")))
    assert _table(tmp_path, "steps").column("episode_id").to_pylist() == ["a"] * 2 + ["c"] * 2


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (b"[[not json]]", "line 3 fails its checksum"),
        (records.line(b"[[not json]]"), "line 3 is not a row record"),
        (records.line(b'{"n": 3, "columns": []}'), "line 3 is not a row record"),
        (b"packed", "line 3 is not a row record"),
    ],
)
def test_a_damaged_complete_line_is_quarantined_and_named(
    tmp_path: Path, damage: bytes, problem: str
) -> None:
    """Sound lines around it are committed; the segment is moved aside, never deleted."""
    table_schema = schema.step_schema(*cartpole_spaces())
    wal = tmp_path / "_wal" / "deadbeef0000"
    wal.mkdir(parents=True)
    (wal / "LOCK").touch()
    segment = rowlog.RowSegment(wal / "steps-00000000.rows", table_schema, 0)
    encoder = rowlog.RowEncoder(table_schema)
    checked, line = encoder.encode(_columns(_rows(2)), 1)
    segment.write(line, 2, checked)
    if damage == b"packed":  # a packed column one value short, behind a sound checksum
        damage = records.line(re.sub(rb'"n":2', b'"n":3', line.rstrip(b"\n")[9:]))
    segment.write_message(damage if damage.endswith(b"\n") else damage + b"\n")
    segment.write(line, 2, checked)
    segment.close()
    with pytest.warns(RlpipeWarning, match=re.escape(problem)):
        (found,) = recover(tmp_path)
    assert (found.rows, found.problems) == (4, (problem,))
    assert not segment.path.exists()
    assert list(tmp_path.glob("_quarantine/*/_wal/deadbeef0000/steps-00000000.rows"))

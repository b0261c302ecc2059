"""Damaged files: a flipped bit or a cut in a shard, a log segment or the manifest is named by the
reader, by ``recover`` and by ``rlpipe inspect``, never read as wrong rows; ``inspect --repair``
moves it into ``_quarantine/`` and lists what was lost, and readers go on with the rest."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import cartpole_spaces

from pipeline import DamagedFileError, DatasetWriter, InputReader, WriterConfig, recover
from pipeline.dataset import records
from pipeline.errors import DatasetError, RlpipeWarning
from pipeline.format import schema

EPISODES, LENGTH = 6, 50
ROOT = Path(__file__).parents[1]


def _episode(number: int) -> dict[str, Any]:
    t = np.arange(LENGTH)
    observation = (number * 1000 + t[:, None] * 4 + np.arange(4)).astype(np.float32)
    return {
        "episode_id": [f"e{number}"] * LENGTH,
        "t": t,
        "observation": observation,
        "action": t % 2,
        "reward": np.ones(LENGTH),
        "next_observation": observation + 0.5,
        "terminated": t == LENGTH - 1,
        "truncated": np.zeros(LENGTH, bool),
    }


def _summary(number: int) -> dict[str, Any]:
    start = datetime(2026, 11, 25, tzinfo=UTC)
    return {
        "episode_id": f"e{number}",
        "agent_id": "agent0",
        "client_id": "",
        "started_at": start,
        "ended_at": start + timedelta(seconds=1),
        "length": LENGTH,
        "return": float(LENGTH),
        "end_reason": "terminated",
    }


def _dataset(path: Path) -> Path:
    """Two step shards of three episodes each, one row group per episode, and the summaries."""
    config = WriterConfig(max_rows=3 * LENGTH, row_group_rows=LENGTH)
    with DatasetWriter(path, *cartpole_spaces(), env_id="CartPole-v1", config=config) as writer:
        for number in range(EPISODES):
            writer.append(_episode(number))
            writer.append_episodes(schema.rows_to_columns([_summary(number)]))
    return path


def _rows(path: Path) -> dict[tuple[str, int], list[float]]:
    """Every stored step, keyed by (episode, t): its observation."""
    found: dict[tuple[str, int], list[float]] = {}
    for batch in InputReader(path, batch_size=1000):
        for episode, t, observation in zip(
            batch.episode_ids, batch.ts, batch.observations, strict=True
        ):
            key = (str(episode), int(t))
            assert key not in found
            found[key] = observation.tolist()
    return found


def _expected(episodes: range | list[int]) -> dict[tuple[str, int], list[float]]:
    return {
        (f"e{n}", t): _episode(n)["observation"][t].tolist()
        for n in episodes
        for t in range(LENGTH)
    }


def _inspect(path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "inspect", str(path), *options],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _shards(path: Path) -> list[Path]:
    return sorted(path.glob("steps/date=*/*.parquet"))


def _flip(file: Path, offset: int, bit: int = 0x10) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= bit
    file.write_bytes(bytes(data))


def _repair(path: Path) -> dict[str, Any]:
    done = _inspect(path, "--repair", "--json")
    assert done.returncode == 0, done.stderr
    repaired, _ = json.JSONDecoder().raw_decode(done.stdout)
    return dict(repaired)


def _check_named_and_repaired(path: Path, shard: Path, problem: str, rest: range) -> dict[str, Any]:
    """The reader, inspect and repair name the shard; after repair the rest reads whole."""
    relative = str(shard.relative_to(path))
    with pytest.raises(DamagedFileError, match=problem) as raised:
        _rows(path)
    assert raised.value.path == str(shard)
    done = _inspect(path)
    assert done.returncode == 0, done.stderr
    assert re.search(f"unreadable file {re.escape(relative)}: .*{problem}", done.stdout)
    repaired = _repair(path)
    (entry,) = repaired["quarantined"]
    assert entry["file"] == relative and re.search(problem, entry["problem"])
    assert (path / entry["moved_to"]).is_file() and not shard.exists()
    assert (path / entry["moved_to"]).parent.parent.parent.joinpath("report.json").is_file()
    assert _rows(path) == _expected(rest)  # the other shard, every row right
    return repaired


def test_a_flipped_bit_in_a_data_page_fails_its_checksum(tmp_path: Path) -> None:
    path = _dataset(tmp_path / "ds")
    assert _rows(path) == _expected(range(EPISODES))
    shard = _shards(path)[0]
    chunk = pq.read_metadata(shard).row_group(1).column(3)  # episode e1's observations
    assert chunk.path_in_schema == "observation.list.element"
    # in the page's data: without its checksum, this flip decodes into other observations
    _flip(shard, chunk.data_page_offset + chunk.total_compressed_size // 2)
    repaired = _check_named_and_repaired(
        path, shard, "CRC checksum verification failed", range(3, EPISODES)
    )
    (entry,) = repaired["quarantined"]
    assert entry["lost"]["rows"] == 3 * LENGTH
    # the observations' page is damaged, the ids' pages are not: every lost step is known
    assert [(e["episode_id"], e["t"], e["rows"]) for e in entry["lost"]["episodes"]] == [
        (f"e{n}", [0, LENGTH - 1], LENGTH) for n in range(3)
    ]
    assert [(e["episode_id"], e["missing_t"]) for e in repaired["episodes_missing_steps"]] == [
        (f"e{n}", [[0, LENGTH - 1]]) for n in range(3)
    ]


def test_a_list_column_read_as_another_type_after_a_flip_is_named(tmp_path: Path) -> None:
    """A footer whose observation lost its LIST annotation still parses, and the shard alone
    reads: as a struct of lists, which no scan of the table can cast to its type."""
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[0]
    data = shard.read_bytes()
    footer = len(data) - 8 - pq.read_metadata(shard).serialized_size
    # the schema element's name, num_children 1 (i32, zigzag 02), converted_type LIST (i32 3)
    element = data.index(b"\x0bobservation\x15\x02\x15\x06", footer)
    _flip(shard, element + 14, 0x80)  # converted_type's field header: now another field
    assert pa.types.is_struct(pq.read_schema(shard).field("observation").type)
    _check_named_and_repaired(path, shard, "Unsupported cast from struct", range(3, EPISODES))


def test_a_flipped_bit_in_a_dictionary_page_header_is_named(tmp_path: Path) -> None:
    """Page checksums cover a page's data, not its header: a dictionary of one id that now says
    it holds none leaves every index past its end, which a dictionary read does not check."""
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[0]
    chunk = pq.read_metadata(shard).row_group(0).column(0)
    assert chunk.path_in_schema == "episode_id"
    # the dictionary page header's own struct (field 7), then its num_values: i32 1 (zigzag 02)
    count = shard.read_bytes().index(b"\x3c\x15\x02", chunk.dictionary_page_offset) + 2
    _flip(shard, count, 0x02)  # one value -> none
    _check_named_and_repaired(path, shard, "Index not in dictionary bounds", range(3, EPISODES))


def test_a_truncated_shard_is_named(tmp_path: Path) -> None:
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[1]
    os.truncate(shard, shard.stat().st_size // 2)
    repaired = _check_named_and_repaired(path, shard, "footer cannot be read", range(3))
    (entry,) = repaired["quarantined"]
    assert entry["lost"]["rows"] is None and "cannot be known" in entry["lost"]["unknown"]
    # the episodes table still tells which steps are gone
    assert [(e["episode_id"], e["missing_t"]) for e in repaired["episodes_missing_steps"]] == [
        (f"e{n}", [[0, LENGTH - 1]]) for n in range(3, EPISODES)
    ]


def _check_named(path: Path, shard: Path, problem: str) -> None:
    with pytest.raises(DamagedFileError, match=problem):
        _rows(path)
    done = _inspect(path)
    assert re.search(
        f"unreadable file {re.escape(str(shard.relative_to(path)))}: .*{problem}", done.stdout
    )


def test_a_flipped_column_name_in_a_footer_is_named_not_read_as_nulls(tmp_path: Path) -> None:
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[0]
    data = shard.read_bytes()
    footer = len(data) - 8 - pq.read_metadata(shard).serialized_size
    _flip(shard, data.index(b"reward", footer), 0x20)  # the schema's "reward" now "Reward"
    _check_named(path, shard, re.escape("missing ['reward'], unknown ['Reward']"))


def test_a_flipped_row_count_in_a_footer_is_named_not_read_short(tmp_path: Path) -> None:
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[0]
    data = shard.read_bytes()
    footer = len(data) - 8 - pq.read_metadata(shard).serialized_size
    # a row group's num_rows: field 3, i64, zigzag varint of 50 (0x64), after its total_byte_size
    count = re.compile(rb"\x16[\x80-\xff]*[\x00-\x7f]\x16\x64").search(data, footer)
    assert count is not None
    _flip(shard, count.end() - 1, 0x04)  # 50 rows -> 48
    assert pq.read_metadata(shard).row_group(0).num_rows == 48
    _check_named(path, shard, re.escape("says 150 rows, its row groups [48, 50, 50]"))


def test_a_flipped_column_repetition_in_a_footer_is_named_not_a_crash(tmp_path: Path) -> None:
    """A nullable column made required in the footer's schema no longer fits its level
    histograms. pyarrow checks them as it builds a column chunk's metadata, and where no C++
    handler is in place (``row_group(i).column(j)``) the check ends the process."""
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[0]
    data = shard.read_bytes()
    footer = len(data) - 8 - pq.read_metadata(shard).serialized_size
    # action_logp's schema element: repetition_type OPTIONAL (i32 1, zigzag 02), then its name
    element = data.index(b"\x25\x02\x18\x0baction_logp", footer)
    _flip(shard, element + 1, 0x02)  # OPTIONAL -> REQUIRED
    done = _inspect(path)  # first, in a process of its own: before, this ended it with SIGABRT
    assert done.returncode == 0, done.stderr[-500:]
    relative = re.escape(str(shard.relative_to(path)))
    assert re.search(f"unreadable file {relative}: .*level histogram", done.stdout)
    with pytest.raises(DamagedFileError, match="level histogram size mismatch"):
        _rows(path)


def test_a_flipped_bit_in_a_footer_statistic_drops_no_row_of_a_filtered_read(
    tmp_path: Path,
) -> None:
    """The footer has no checksum, and a min or max that changed still parses: a filter judged
    on the statistics would skip the row group; rlpipe judges rows once read."""
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[0]
    data = shard.read_bytes()
    footer = len(data) - 8 - pq.read_metadata(shard).serialized_size
    # row group 0's max of ``t``, as max and max_value: the first two int64 49s in the footer
    copies = [m.start() for m in re.finditer(re.escape(struct.pack("<q", 49)), data[footer:])]
    for offset in copies[:2]:
        _flip(shard, footer + offset)  # 49 -> 33
    assert pq.read_metadata(shard).row_group(0).column(2).statistics.max == 33
    late = InputReader(path, batch_size=1000, filter=ds.field("t") >= 40)
    found = {
        (str(e), int(t)) for batch in late for e, t in zip(batch.episode_ids, batch.ts, strict=True)
    }
    assert found == {(f"e{n}", t) for n in range(EPISODES) for t in range(40, LENGTH)}


def test_flipped_bits_where_no_checksum_looks_read_right_or_are_named(tmp_path: Path) -> None:
    """Page checksums cover the pages' data; the footer and the page headers are covered by
    nothing. A bit flipped there (a sample of 1,000, in a process of their own, since a flip
    can end one) reads as the rows written or is named, never as other rows."""
    path = _dataset(tmp_path / "ds")
    shard = _shards(path)[0]
    metadata = pq.read_metadata(shard)
    size = shard.stat().st_size
    unchecked = list(range(size - 8 - metadata.serialized_size, size - 8))  # the footer
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            for start in {chunk.dictionary_page_offset, chunk.data_page_offset} - {None}:
                unchecked += range(start, start + 24)  # a page header is about 20 bytes
    rng = np.random.default_rng(0)
    flips = [f"{offset}:{1 << int(rng.integers(8))}" for offset in rng.choice(unchecked, 1000)]
    reader = Path(__file__).with_name("flip_reader.py")
    done = subprocess.run(
        [sys.executable, str(reader), str(path), str(shard), *flips],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=300,
        check=False,
    )
    lines = done.stdout.splitlines()
    ended = "" if len(lines) == len(flips) else f"; the flip {flips[len(lines)]} ended it"
    assert done.returncode == 0, f"{done.stderr[-300:]}{ended}"
    outcomes = {line.split()[2] for line in lines}
    others = [line for line in lines if line.split()[2] not in ("same", "named")]
    assert not others, others[:5]
    assert outcomes == {"same", "named"}  # the sample reached both kinds of byte


@pytest.mark.parametrize(
    ("found", "at", "bit", "version"),
    [
        (b'{"add"', 3, 0x02, None),  # "add" -> "afd": an action Delta readers skip
        (b'{"add"', 3, 0x02, 0),
        (b'"path"', 2, 0x02, 0),  # the add's "path" -> "pcth"
        (b'numRecords\\":', 12, 0x10, 0),  # its statistics' ':' -> '*': not JSON
    ],
    ids=["action-opening", "action-following", "path-following", "statistics-following"],
)
def test_a_damaged_commit_is_named(
    tmp_path: Path, found: bytes, at: int, bit: int, version: int | None
) -> None:
    """The Delta log has no checksum, and Delta readers skip an action they do not know. A
    reader that opens the table checks the commits deltalake replayed, and a follower each new
    commit it reads: both name the commit rather than reading on without the shard it added
    (or failing on a KeyError). Opening, deltalake itself refuses a missing path or broken
    statistics ("opening the steps table failed")."""
    path = _dataset(tmp_path / "ds")
    commit = path / "steps" / "_delta_log" / f"{1:020d}.json"
    _flip(commit, commit.read_bytes().index(found) + at, bit)
    with pytest.raises(DatasetError, match=r"01\.json: line 2 is not one Delta action"):
        for _ in InputReader(path, batch_size=1000, version=version, follow=True, timeout_s=1.0):
            pass
    if version is None:
        assert "01.json: line 2 is not one Delta action" in _inspect(path).stderr


@pytest.mark.parametrize("damage", ["flipped", "cut"])
def test_a_damaged_manifest_is_named_and_rebuilt(tmp_path: Path, damage: str) -> None:
    path = _dataset(tmp_path / "ds")
    manifest = path / "manifest.json"
    text = manifest.read_text()
    if damage == "flipped":  # still JSON, and a space that would decode the rows otherwise
        manifest.write_text(text.replace('"n": 2', '"n": 3'))
        problem = "its checksum '[0-9a-f]{8}' is not that of its content"
    else:
        manifest.write_text(text[: len(text) // 2])
        problem = "unreadable manifest"
    with pytest.raises(DamagedFileError, match=f"manifest.json: damaged: {problem}"):
        InputReader(path)
    done = _inspect(path)
    assert done.returncode == 2 and re.search(f"manifest.json: damaged: {problem}", done.stderr)
    repaired = _repair(path)
    assert [entry["file"] for entry in repaired["quarantined"]] == ["manifest.json"]
    assert _rows(path) == _expected(range(EPISODES))
    assert InputReader(path).action_space == cartpole_spaces()[1]


WRITER = textwrap.dedent(
    """
    import sys
    import time
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from conftest import cartpole_spaces
    from pipeline import DatasetWriter, WriterConfig

    rows = int(sys.argv[3])
    config = WriterConfig(max_age_s=3600, sync="always")
    writer = DatasetWriter(sys.argv[1], *cartpole_spaces(), config=config)
    for number in range(6):
        t = np.arange(rows)
        observation = (number * 1000 + t[:, None] * 4 + np.arange(4)).astype(np.float32)
        writer.append({"episode_id": [f"e{number}"] * rows, "t": t, "observation": observation,
                       "action": t % 2, "reward": np.ones(rows), "next_observation": observation,
                       "terminated": np.zeros(rows, bool), "truncated": np.zeros(rows, bool)})
        print(number, flush=True)
    time.sleep(600)
    """
)


def _killed_writer(path: Path, rows: int) -> Path:
    """A writer that acknowledged six appends of ``rows`` rows, killed with SIGKILL; its segment."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-c", WRITER, str(path), str(ROOT / "tests"), str(rows)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as process:
        assert process.stdout is not None
        acknowledged = [process.stdout.readline() for _ in range(6)]
        process.send_signal(signal.SIGKILL)
    assert acknowledged == [f"{n}\n" for n in range(6)]
    (segment,) = path.glob("_wal/*/steps-*")
    return segment


def _record_offsets(segment: Path) -> list[tuple[int, int]]:
    """(start, end) of each append's record in a segment, header excluded."""
    data = segment.read_bytes()
    if segment.suffix == ".rows":
        ends = [m.end() for m in re.finditer(b"\n", data)]
        return list(itertools.pairwise(ends))
    found, position = [], len(records.MAGIC)
    while position < len(data):
        (length,) = struct.unpack_from("<I", data, position)
        found.append((position, position + 12 + length))
        position += 12 + length
    return found[1:]


@pytest.mark.parametrize(
    ("kind", "where"),
    [(k, w) for k in ("rows", "arrows") for w in ("middle", "last")] + [("rows", "last newline")],
)
def test_a_damaged_log_record_is_named_and_quarantined(
    tmp_path: Path, kind: str, where: str
) -> None:
    """Records of a writer killed with kill -9; the damaged one, acknowledged and synced, is
    named, the others committed, and the segment kept in quarantine."""
    path = tmp_path / "ds"
    segment = _killed_writer(path, rows=3 if kind == "rows" else 300)
    assert segment.suffix == f".{kind}"
    records_at = _record_offsets(segment)
    assert len(records_at) == 6
    start, end = records_at[2 if where == "middle" else 5]
    _flip(segment, end - 1 if where == "last newline" else (start + end) // 2, 0x01)
    relative = str(segment.relative_to(path))
    done = _inspect(path)
    assert re.search(f"unreadable file {re.escape(relative)}: .*(checksum|no newline)", done.stdout)
    with pytest.warns(RlpipeWarning, match=f"{re.escape(str(segment))}: damaged: .*"):
        (found,) = recover(path)
    lost = 2 if where == "middle" else 5
    rows = 3 if kind == "rows" else 300
    assert found.rows == 5 * rows and len(found.problems) == 1
    assert not segment.exists()
    assert list(path.glob(f"_quarantine/*/{relative}"))
    stored = {(episode, t) for episode, t in _rows(path)}
    assert stored == {(f"e{n}", t) for n in range(6) if n != lost for t in range(rows)}
    assert _rows(path) == {
        key: value for key, value in _expected_rows(rows).items() if key in stored
    }


def _expected_rows(rows: int) -> dict[tuple[str, int], list[float]]:
    return {
        (f"e{n}", t): [float(n * 1000 + t * 4 + i) for i in range(4)]
        for n in range(6)
        for t in range(rows)
    }

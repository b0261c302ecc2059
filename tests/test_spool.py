"""The spool and the uploader: numbered batches on disk, delivered oldest first, each once."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.client.spool import Spool, Uploader, to_ipc


def _build(table: str, rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([dict(row) for row in rows])


def _rows(batch: bytes) -> list[int]:
    with pa.ipc.open_stream(batch) as reader:
        return list(reader.read_all().column("n").to_pylist())


def test_spool_names_batches_by_client_and_number_and_lists_oldest_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    body = to_ipc(_build("steps", [{"n": 1}]))
    spool.put("b", 10, "steps", body)
    spool.put("a", 2, "episodes", body)
    (tmp_path / ".a-0000000001-steps.arrows.tmp").write_bytes(b"half")  # a crash mid-write
    pending = spool.pending()
    assert [(client, seq, table) for _, client, seq, table in pending] == [
        ("a", 2, "episodes"), ("b", 10, "steps"),
    ]  # fmt: skip
    assert pending[0][0].name == "a-0000000002-episodes.arrows"
    assert _rows(pending[1][0].read_bytes()) == [1]


def test_uploader_retries_after_the_wait_the_server_asks_for(tmp_path: Path) -> None:
    delivered: list[tuple[str, int, str, list[int]]] = []
    refusals = iter([0.05, 0.05])
    lock = threading.Lock()

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        with lock:
            wait = next(refusals, None)  # the first two attempts get "503, Retry-After"
            if wait is None:
                delivered.append((client_id, seq, table, _rows(body)))
            return wait

    uploader = Uploader("c1", _build, send, Spool(tmp_path), max_rows=2, interval_s=0.01)
    uploader.add("steps", [{"n": 0}, {"n": 1}])
    uploader.add("episodes", [{"n": 9}])
    assert uploader.flush(5)
    uploader.add("steps", [{"n": 2}])
    assert uploader.close(5)
    assert delivered == [
        ("c1", 0, "steps", [0, 1]), ("c1", 1, "episodes", [9]), ("c1", 2, "steps", [2]),
    ]  # fmt: skip
    assert uploader.failure is None and not list(tmp_path.glob("*.arrows"))


def test_a_healthy_server_gets_batches_straight_from_memory(tmp_path: Path) -> None:
    """Nothing touches the disk while the server takes every batch; a refusal spools it."""
    delivered: list[int] = []
    refuse = threading.Event()

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        assert not list(tmp_path.glob("*.arrows"))  # sent from memory, not from the spool
        if refuse.is_set():
            return 60.0  # 503, Retry-After: 60
        delivered.append(seq)
        return None

    uploader = Uploader("c1", _build, send, Spool(tmp_path), max_rows=1, interval_s=0.01)
    uploader.add("steps", [{"n": 0}])
    assert uploader.flush(5)
    refuse.set()
    uploader.add("steps", [{"n": 1}])
    assert not uploader.flush(0.2)
    assert [p.name for p in tmp_path.glob("*.arrows")] == ["c1-0000000001-steps.arrows"]
    uploader.close(0.1)
    assert delivered == [0]


def test_rows_a_batch_cannot_be_built_from_stay_and_close_says_so(tmp_path: Path) -> None:
    """A build failure (int agent ids once did this) keeps the rows, spools the batches built
    before it, surfaces the error and makes close() return False: nothing vanishes quietly."""
    delivered: list[tuple[str, list[int]]] = []

    def build(table: str, rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
        if table == "episodes":
            raise ValueError("field 'agent_id': expected string, got int")
        return _build(table, rows)

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        delivered.append((table, _rows(body)))
        return None

    uploader = Uploader("c1", build, send, Spool(tmp_path), max_rows=10, interval_s=0.01)
    uploader.add("steps", [{"n": 0}])
    uploader.add("episodes", [{"n": 9}])
    assert not uploader.flush(5)
    assert isinstance(uploader.failure, ValueError)
    assert uploader._rows == {"steps": [], "episodes": [{"n": 9}]}  # kept, not dropped
    assert not uploader.close(0.5)
    steps = [rows for table, rows in delivered if table == "steps"]
    spooled = [_rows(path.read_bytes()) for path in tmp_path.glob("*-steps.arrows")]
    assert steps + spooled == [[0]]  # the batch built before the failure is not lost either

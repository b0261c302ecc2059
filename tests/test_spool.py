"""The spool and the uploader: numbered batches on disk, delivered oldest first, each once."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from pipeline.client import spool
from pipeline.client.local import RowBuffer
from pipeline.client.spool import Spool, Uploader, to_ipc
from pipeline.errors import RequestRejected


def _build(table: str, rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([dict(row) for row in rows])


class _Waiting:
    """Rows waiting per table, drained as the uploader's source (the client's RowBuffer
    holds step rows; these are plain numbers, so the batches are easy to read back)."""

    def __init__(self) -> None:
        self.tables: dict[str, list[dict[str, Any]]] = {"steps": [], "episodes": []}

    @property
    def ready(self) -> int:
        return sum(map(len, self.tables.values()))

    def add(self, table: str, rows: list[dict[str, Any]]) -> None:
        self.tables[table] += rows

    def due_in(self) -> float:
        return 0.0 if self.ready else math.inf

    def drain(self, everything: bool) -> list[tuple[str, pa.RecordBatch]]:
        tables, self.tables = self.tables, {"steps": [], "episodes": []}
        return [(name, _build(name, rows)) for name, rows in tables.items() if rows]


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


def test_the_parts_of_a_split_batch_are_listed_where_the_batch_stood(tmp_path: Path) -> None:
    """A server may store a batch and die before answering, and its successor checks only a
    client's first uploads against what is stored (``server.uploads``). So the parts of a batch
    split before the outage must go out before the batches made during it: numbered from 2**40,
    they went last, and the outage test stored a half of a batch twice."""
    store = Spool(tmp_path)
    body = to_ipc(_build("steps", [{"n": 1}]))
    left, right = spool._halves(7) or (0, 0)
    left_left, left_right = spool._halves(left) or (0, 0)
    for seq in (9, right, 8, left_right, left_left, 6):
        store.put("a", seq, "steps", body)
    order = [seq for _, _, seq, _ in store.pending()]
    assert order == [6, left_left, left_right, right, 8, 9]


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

    waiting = _Waiting()
    uploader = Uploader("c1", waiting, send, Spool(tmp_path), interval_s=0.01)
    waiting.add("steps", [{"n": 0}, {"n": 1}])
    waiting.add("episodes", [{"n": 9}])
    assert uploader.flush(5)
    waiting.add("steps", [{"n": 2}])
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

    waiting = _Waiting()
    uploader = Uploader("c1", waiting, send, Spool(tmp_path), interval_s=0.01)
    waiting.add("steps", [{"n": 0}])
    assert uploader.flush(5)
    refuse.set()
    waiting.add("steps", [{"n": 1}])
    assert not uploader.flush(0.2)
    assert [p.name for p in tmp_path.glob("*.arrows")] == ["c1-0000000001-steps.arrows"]
    uploader.close(0.1)
    assert delivered == [0]


def test_rows_a_batch_cannot_be_built_from_stay_and_close_says_so(tmp_path: Path) -> None:
    """A build failure (int agent ids once did this) keeps the rows in the client's buffer,
    surfaces the error and makes close() return False: nothing vanishes quietly."""
    delivered: list[str] = []

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        delivered.append(table)
        return None

    rows = RowBuffer(
        gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2), 10, lambda: None
    )
    observation = np.zeros(2, np.float32)
    row = ("e", 0, 0, observation, 1, 0.0, observation, True, False, None, None, True, None, "c")
    rows.add([row])  # agent_id 0: not a string
    uploader = Uploader("c1", rows, send, Spool(tmp_path), interval_s=0.01)
    assert not uploader.flush(5)
    assert uploader.failure is not None
    assert rows.ready == 1  # kept, not dropped
    assert not uploader.close(0.5)
    assert delivered == [] and not list(tmp_path.glob("*.arrows"))


def test_a_build_that_fails_in_the_simulators_thread_reaches_it_at_its_next_call(
    tmp_path: Path,
) -> None:
    """The simulator's thread builds (ready_rows=1 here) and must not raise for rows of calls
    it already returned from; the upload thread tries the build again, and its failure is
    what PolicyClient raises at the simulator's next call, with no flush asked for."""
    rows = RowBuffer(
        gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2), 1, lambda: None
    )
    uploader = Uploader("c1", rows, lambda *_: None, Spool(tmp_path), interval_s=0.05)
    observation = np.zeros(2, np.float32)
    row = ("e", 0, 0, observation, 1, 0.0, observation, True, False, None, None, True, None, "c")
    rows.add([row])  # built here, and failed
    deadline = time.monotonic() + 5
    while uploader.failure is None and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert "agent_id" in str(uploader.failure) and rows.ready == 1
    assert not uploader.close(0.5)


def _step_rows(rows: RowBuffer, first: int, count: int) -> None:
    """Add ``count`` complete step rows of episode "e" (``t`` from ``first``) to ``rows``."""
    observation = np.zeros(2, np.float32)
    for t in range(first, first + count):
        row = ("e", "a", t, observation, 1, 0.0, observation, False, False)
        row += (None, None, True, None, "c")
        rows.add([row])


def _ts(batches: list[tuple[str, pa.RecordBatch]]) -> list[int]:
    return [t for _, batch in batches for t in batch.column("t").to_pylist()]


def test_the_thread_that_adds_rows_builds_them_once_enough_wait_or_the_oldest_is_due() -> None:
    """The simulator's thread builds its rows into batches (a build from the upload thread cost
    the GIL hand-overs RowBuffer's docstring tells of); the upload thread's cycle takes the
    batches built, and builds rows itself only once the oldest is due: a simulator gone quiet."""
    woken: list[threading.Thread] = []
    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    wake = lambda: woken.append(threading.current_thread())  # noqa: E731
    rows = RowBuffer(space, gym.spaces.Discrete(2), 3, wake, build_after_s=0.3)
    _step_rows(rows, 0, 2)
    assert rows.drain(everything=False) == [] and rows.ready == 2 and not woken
    assert 0 < rows.due_in() <= 0.3
    _step_rows(rows, 2, 1)  # three wait: built here, and the upload thread woken
    assert woken == [threading.current_thread()]
    assert _ts(rows.drain(everything=False)) == [0, 1, 2] and rows.ready == 0
    assert rows.due_in() == math.inf
    _step_rows(rows, 3, 1)
    assert rows.drain(everything=False) == []
    threading.Event().wait(0.35)  # nobody calls: the upload thread builds the row, now due
    assert rows.due_in() <= 0 and _ts(rows.drain(everything=False)) == [3]
    _step_rows(rows, 4, 1)
    assert _ts(rows.drain(everything=True)) == [4]  # a flush takes everything at once


def test_a_quiet_simulators_last_rows_leave_about_an_interval_after_they_came(
    tmp_path: Path,
) -> None:
    """The upload thread sleeps until the oldest row is due, not a whole interval after it
    last looked: a row waits in memory about ``interval_s``, never two."""
    sent: list[float] = []

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        sent.append(time.monotonic())
        return None

    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    rows = RowBuffer(space, gym.spaces.Discrete(2), 1000, lambda: None, build_after_s=0.6)
    uploader = Uploader("c1", rows, send, Spool(tmp_path), interval_s=0.6)
    threading.Event().wait(0.05)  # the upload thread looks next 0.55 s after the row comes
    came = time.monotonic()
    _step_rows(rows, 0, 1)
    deadline = came + 5
    while not sent and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert sent and sent[0] - came < 0.9  # due at 0.6 s, taken at 0.63 s; not at 1.15 s, when
    # the thread would look again had it slept whole intervals
    assert uploader.close(5)


def _stored_once(sent: list[tuple[str, int, bytes]]) -> list[int]:
    """The rows a server keeping each (client, number) once would hold."""
    stored: dict[tuple[str, int], bytes] = {}
    for client_id, seq, body in sent:
        stored.setdefault((client_id, seq), body)
    return sorted(n for body in stored.values() for n in _rows(body))


def test_batches_are_bounded_in_rows_and_bytes_however_much_waits(tmp_path: Path) -> None:
    """An outage's worth of rows leaves as many bounded batches, never one huge body."""
    sent: list[tuple[str, int, bytes]] = []

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        sent.append((client_id, seq, body))
        return None

    waiting = _Waiting()
    waiting.add("steps", [{"n": n, "pad": "x" * 300} for n in range(3 * spool.BATCH_ROWS)])
    uploader = Uploader("c1", waiting, send, Spool(tmp_path), interval_s=0.01)
    assert uploader.close(10)
    assert len(sent) >= 3 and len({seq for _, seq, _ in sent}) == len(sent)
    assert all(len(_rows(body)) <= spool.BATCH_ROWS for _, _, body in sent)
    assert all(len(body) <= 1.1 * spool.BATCH_BYTES for _, _, body in sent)
    assert _stored_once(sent) == list(range(3 * spool.BATCH_ROWS))


def test_a_batch_too_large_for_the_server_is_split_until_it_fits(tmp_path: Path) -> None:
    """413 splits a batch in halves under numbers of their own, never a stuck spool; a later
    client finding both a batch and its halves (a crash mid-split) stores each row once."""
    limit = 150_000  # half of 5000 rows fits, the whole does not
    sent: list[tuple[str, int, bytes]] = []

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        if len(body) > limit:
            raise RequestRejected(413, f"body of {len(body)} bytes, past the limit of {limit}")
        sent.append((client_id, seq, body))
        return None

    big = to_ipc(_build("steps", [{"n": n, "pad": "x" * 40} for n in range(5000)]))
    crashed = Spool(tmp_path)
    crashed.put("old", 7, "steps", big)
    first = (spool._halves(7) or (0, 0))[0]
    half = to_ipc(pa.ipc.open_stream(big).read_all().slice(0, 2500))
    crashed.put("old", first, "steps", half)
    sent.append(("old", first, half))  # delivered before the crash took the rest
    waiting = _Waiting()
    waiting.add("steps", [{"n": n, "pad": "y" * 40} for n in range(5000, 10_000)])
    uploader = Uploader("c1", waiting, send, Spool(tmp_path), interval_s=0.01)
    assert uploader.close(20), uploader.failure
    assert all(len(body) <= limit for _, _, body in sent)
    assert _stored_once(sent) == list(range(10_000))
    assert not list(tmp_path.glob("*.arrows"))


def test_the_parts_of_a_batch_split_now_go_before_the_batches_after_it(tmp_path: Path) -> None:
    """A dead server may have stored batch 7 whole before its successor, with a smaller body
    limit, refused it: the successor's check of a client's uploads lasts until one comes in
    with nothing stored before, so 7's parts must come before 8."""
    limit = 150_000  # half of 5000 rows fits, the whole does not
    sent: list[int] = []

    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        if len(body) > limit:
            raise RequestRejected(413, f"body of {len(body)} bytes, past the limit of {limit}")
        sent.append(seq)
        return None

    store = Spool(tmp_path)
    store.put(
        "c1", 7, "steps", to_ipc(_build("steps", [{"n": n, "pad": "x" * 40} for n in range(5000)]))
    )
    store.put("c1", 8, "steps", to_ipc(_build("steps", [{"n": 5000}])))
    uploader = Uploader("c1", _Waiting(), send, store, interval_s=0.01)
    assert uploader.close(20), uploader.failure
    assert sent == [*(spool._halves(7) or ()), 8]


def test_a_batch_refused_for_its_content_is_kept_and_reported(tmp_path: Path) -> None:
    def send(client_id: str, seq: int, table: str, body: bytes) -> float | None:
        raise RequestRejected(400, "steps.t: expected integers >= 0, got -1")

    waiting = _Waiting()
    waiting.add("steps", [{"n": 0}, {"n": 1}])
    uploader = Uploader("c1", waiting, send, Spool(tmp_path), interval_s=0.01)
    assert not uploader.close(2)
    assert isinstance(uploader.failure, RequestRejected)
    assert [p.name for p in tmp_path.glob("*.arrows")] == ["c1-0000000000-steps.arrows"]

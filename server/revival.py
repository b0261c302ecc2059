"""A starting server takes over the open episodes of dead servers from their journals.

A journal directory (:mod:`server.journal`) whose lock can be taken belongs to a server that
died. Once the dead server's log is committed (:func:`pipeline.dataset.recovery.recover`), its
journal is replayed: the newest file's snapshot, then each record through the same code the live
server ran (a pass through :func:`server.stepper.settle`, a close through the step core), so
that every episode comes back with its pending steps, accrued rewards and retry memory, and
ended ones with their last answers. The reap timer of each starts again.

Only the journal's last record can be an intent whose rows never landed (the kill came between
it and its rows). Its rows, if any, are looked for among the dead server's shards written since:
found, it is replayed (and episode summaries it wrote only in part are written now); not found,
it is dropped, so the client's retry runs it afresh. The adopted episodes go into this server's
own journal before the dead one is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from functools import reduce
from pathlib import Path
from typing import Any

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.dataset.delta import Table
from pipeline.dataset.location import Location
from pipeline.dataset.recovery import recover, take_dead_lock
from pipeline.dataset.wal import release_log_dir
from pipeline.errors import SchemaError
from pipeline.format import layout
from pipeline.recording import recorder
from pipeline.recording.episode import Episode, Returns
from pipeline.recording.recorder import Completion
from server import records
from server.errors import ApiError
from server.journal import Journal, journal_files, journal_root
from server.stepper import joined, settle

_log = logging.getLogger("rlpipe.server")
_CLOCK_SLACK_S = 2.0  # a shard's mtime against the intent's wall clock
_COMMIT_WAIT_S = 60.0  # how long to wait for another process recovering the dead log


def open_journal(service: Any) -> Journal:
    """Adopt the open episodes of every dead server of the dataset into ``service``'s book,
    then open its own journal (which starts with them)."""
    root = service.writer.location.state_dir
    dead = _dead_journals(root)
    adopted = []
    for fd, directory in dead:
        try:
            _adopt(service, directory)
            adopted.append((fd, directory))
        except Exception:  # a journal that cannot be read must not stop the server
            _log.exception("adopting the episodes of journal %s failed; left in place", directory)
            os.close(fd)
    writer = service.config.writer
    journal = Journal(
        root,
        service.writer.writer_id,
        service.episodes,
        writer.sync,
        writer.sync_interval_s,
        service.writer.disk,
        service.config.retry_after_s,
    )
    for fd, directory in adopted:  # only now: the episodes are in this server's journal
        for path in journal_files(directory):
            path.unlink()
        release_log_dir(fd, directory, keep=False)
    return journal


def _dead_journals(root: Path) -> list[tuple[int, Path]]:
    """The journal directories whose lock this process could take, with the lock held."""
    base = journal_root(root)
    if not base.is_dir():
        return []
    found = []
    for directory in sorted(base.iterdir()):
        if directory.name.startswith(".") or not directory.is_dir():
            continue
        fd = take_dead_lock(directory)  # None: its server is alive, or another adopts it
        if fd is not None:
            found.append((fd, directory))
    return found


def _adopt(service: Any, directory: Path) -> None:
    writer_id = directory.name
    _wait_committed(service.writer.location, writer_id)
    docs = _read(directory)
    if not docs:
        return
    book, space = service.episodes, service.observation_space
    for doc in docs[0]["episodes"]:
        book.start(records.episode_of(doc, space))
    for episode_id, last in docs[0]["ended"]:
        book.remember_ended(episode_id, None if last is None else (last[0], last[1]))
    rest = docs[1:]
    for i, doc in enumerate(rest):
        following = rest[i + 1] if i + 1 < len(rest) else None
        if doc["k"] == "abort" or (following is not None and following["k"] == "abort"):
            continue
        _replay(service, writer_id, doc, uncertain=following is None)
    _log.info("adopted the open episodes of dead server %s: %d open now", writer_id, len(book))


def _read(directory: Path) -> list[dict[str, Any]]:
    """The records of the newest file that starts with a whole snapshot (a roll that died
    before its snapshot was written leaves the file before it in place); a torn last line,
    never acknowledged, is dropped."""
    for path in reversed(journal_files(directory)):
        docs = []
        for line in path.read_bytes().split(b"\n"):
            if not line:
                continue
            try:
                docs.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                break
        if docs and docs[0].get("k") == "snapshot":
            return docs
    return []


def _replay(service: Any, writer_id: str, doc: dict[str, Any], uncertain: bool) -> None:
    book, kind = service.episodes, doc["k"]
    if kind == "start":
        book.start(records.episode_of(doc["e"], service.observation_space))
        return
    if kind == "pass":
        _replay_pass(service, writer_id, doc, uncertain)
        return
    episode = _open(book, doc["id"])
    if episode is None:
        return
    if kind == "drop":
        book.withdraw(episode)
    elif kind == "returns":
        with contextlib.suppress(SchemaError):  # refused live as well
            episode.add_returns(Returns(*doc["r"]))
    elif kind == "close":
        done = recorder.close(episode, doc["why"])
        if not uncertain or _landed(service, writer_id, doc, done):
            recorder.settle(done)
            book.finish(episode)


def _replay_pass(service: Any, writer_id: str, doc: dict[str, Any], uncertain: bool) -> None:
    space, book = service.observation_space, service.episodes
    requests = [records.request_of(q, space) for q in doc["q"]]
    starts = [start for q in doc["q"] for start in q.get("starts", ())]  # older journals: none
    started = [book.start(records.episode_of(start, space)) for start in starts]
    # the pass's own: a start also recorded on its own (a log_returns came first) stays open
    opened = [episode for episode, created in started if created]
    try:
        episodes = book.get_many([i for request in requests for i in request.episode_ids])
    except ApiError:
        _log.warning("journal of %s: a pass names an episode it never opened", writer_id)
        return
    start = 0
    for request in requests:
        request.bind(episodes[start : start + len(request.episode_ids)])
        start += len(request.episode_ids)
    steps = joined(requests)
    done = recorder.complete(steps)
    if not uncertain or _landed(service, writer_id, doc, done):
        settle(requests, steps, done, doc["a"], doc["l"], doc["v"], book)
    else:  # the client's retry opens them again
        for episode in opened:
            book.withdraw(episode)


def _open(book: Any, episode_id: str) -> Episode | None:
    try:
        episode: Episode = book.get(episode_id)
    except ApiError:
        return None
    return episode


def _landed(service: Any, writer_id: str, doc: dict[str, Any], done: Completion) -> bool:
    """Whether the rows of the journal's last intent were written; if they were and its
    summaries were not (the kill came between the two), the summaries are written now."""
    root, since = service.writer.location, doc["at"] - _CLOCK_SLACK_S
    who = (writer_id, doc["k"])
    if done.rows:
        episode_id, agent_id, t = done.rows[0][:3]
        key = {"episode_id": episode_id, "agent_id": agent_id, "t": t}
        if not _stored(root, layout.STEPS, writer_id, since, key):
            _log.info("journal of %s: the rows of its last %s never landed; dropped", *who)
            return False
    ids = ("episode_id", "agent_id")
    missing = [
        summary
        for summary in done.summaries
        if not _stored(root, layout.EPISODES, writer_id, since, {k: summary[k] for k in ids})
    ]
    _log.info("journal of %s: its last %s stored its rows; replayed", *who)
    if missing:
        service.write_rows(recorder.columns_of([]), missing)
        _log.info(
            "journal of %s: %d summaries it had not stored written now", writer_id, len(missing)
        )
    return True


def _stored(
    location: Location, table: str, writer_id: str, since: float, key: dict[str, Any]
) -> bool:
    """Whether a row with ``key``'s values is in a shard of the writer committed since then."""
    condition = reduce(lambda a, b: a & b, [pc.field(k) == v for k, v in key.items()])
    prefix = layout.shard_name(writer_id, 0).split("00000000")[0]
    for entry in Table(location, table).files():
        if not entry.path.rsplit("/", 1)[-1].startswith(prefix) or entry.modified_ms < since * 1e3:
            continue
        path = location.path(table, entry.path)
        found = pq.read_table(
            path, columns=list(key), filters=condition, filesystem=location.filesystem
        )
        if found.num_rows:
            return True
    return False


def _wait_committed(location: Location, writer_id: str) -> None:
    """The dead server's log committed into shards (by this process, or by another one that
    is recovering it right now)."""
    deadline = time.monotonic() + _COMMIT_WAIT_S
    log = layout.wal_root(location.state_dir) / writer_id
    while log.exists():
        recover(location)
        if not log.exists():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{log}: the dead server's log was not committed in time")
        time.sleep(0.05)

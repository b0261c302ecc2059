"""The server's open episodes, the ids of recently ended ones (so late requests get 409), and
retried requests recognised by their numbers (``docs/protocol.md``, "Retrying is safe").

A retry is recognised in its step, under its episodes' locks, so a copy that arrives while the
first try still runs waits for it and then finds its answers; one that finds an episode the first
try ended looks there (:func:`server.handlers.late_replay`). A batch is run whole or not at all,
so its retry repeats every numbered row or none: else 409, rather than half its rows stored twice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from pipeline.recording.episode import Episode
from server.errors import ApiError

Last = tuple[int, Any] | None  # an episode's last numbered request and the answer it got


class EpisodeBook:
    """The open episodes, and the last ``remember_ended`` ended ids (for 409 rather than 404)."""

    def __init__(self, remember_ended: int = 100_000) -> None:
        self._open: dict[str, Episode] = {}
        self._ended: OrderedDict[str, Last] = OrderedDict()  # last answer
        self._remember = remember_ended
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def start(self, episode: Episode) -> tuple[Episode, bool]:
        """Open ``episode``; a retried start of an open episode returns it (created=False)."""
        with self._lock:
            if episode.episode_id in self._ended:
                raise ApiError(409, ended_message(episode.episode_id))
            existing = self._open.get(episode.episode_id)
            if existing is not None:
                if existing.client_id != episode.client_id:
                    raise ApiError(
                        409,
                        f"episode '{episode.episode_id}' is already open for "
                        "another client; choose another episode_id",
                    )
                return existing, False
            self._open[episode.episode_id] = episode
            return episode, True

    def withdraw(self, episode: Episode) -> None:
        """Forget an episode a refused request opened, if nothing has touched it since."""
        with episode.lock, self._lock:
            untouched = episode.requests == 0 and not episode.agents and not episode.ended
            if untouched and self._open.get(episode.episode_id) is episode:
                del self._open[episode.episode_id]

    def get(self, episode_id: str) -> Episode:
        with self._lock:
            episode = self._open.get(episode_id)
            if episode is not None:
                return episode
            if episode_id in self._ended:
                raise ApiError(409, ended_message(episode_id))
        raise ApiError(
            404, f"episode '{episode_id}' is not open on this server; call start_episode() first"
        )

    def get_many(self, episode_ids: list[str]) -> list[Episode]:
        """:meth:`get` for many ids under one acquisition of the lock."""
        with self._lock:
            found = [self._open.get(episode_id) for episode_id in episode_ids]
        for episode_id, episode in zip(episode_ids, found, strict=True):
            if episode is None:
                self.get(episode_id)  # raises the 404 or 409
        return found  # type: ignore[return-value]  # no None left

    def finish(self, episode: Episode) -> None:
        with self._lock:
            episode.ended = True
            self._open.pop(episode.episode_id, None)
            self._ended[episode.episode_id] = episode.last_request
            while len(self._ended) > self._remember:
                self._ended.popitem(last=False)

    def last_requests(self, episode_ids: list[str]) -> list[Last]:
        """Each episode's last numbered request and its answer, open or recently ended (None if
        it has none or is unknown)."""
        with self._lock:
            return [
                e.last_request if (e := self._open.get(i)) is not None else self._ended.get(i)
                for i in episode_ids
            ]

    def idle(self, older_than_s: float) -> list[Episode]:
        cutoff = time.monotonic() - older_than_s
        with self._lock:
            return [e for e in self._open.values() if e.last_seen < cutoff]

    def all_open(self) -> list[Episode]:
        with self._lock:
            return list(self._open.values())

    def recently_ended(self, n: int) -> list[tuple[str, Last]]:
        """The ``n`` most recently ended ids and their last answers, oldest first (what a
        server that takes over this book's episodes needs to answer their retries)."""
        with self._lock:
            return list(self._ended.items())[-n:]

    def remember_ended(self, episode_id: str, last: Last) -> None:
        """Take an id another server ended, with its last answer (:mod:`server.revival`)."""
        with self._lock:
            self._ended[episode_id] = last
            while len(self._ended) > self._remember:
                self._ended.popitem(last=False)


def refuse_repeats(episode_ids: Sequence[str], field: str) -> None:
    """The 400 for a request that names an episode twice (its rows would race for it)."""
    counts = Counter(episode_ids)
    twice = next((episode_id for episode_id in episode_ids if counts[episode_id] > 1), None)
    if twice is not None:
        raise ApiError(
            400,
            f"field '{field}': expected each episode at most once per request, got '{twice}' twice",
        )


def ended_message(episode_id: str) -> str:
    return f"episode '{episode_id}' has ended; call start_episode() for a new one"


def replayed_rows(
    episode_ids: Sequence[str],
    requests: Sequence[int | None],
    lasts: Sequence[Last],
    field: str = "requests",
) -> list[dict[str, Any]] | None:
    """Each row's earlier answer when every row repeats its episode's last request; None when
    none does (the request is new); a 409 when some do and some do not."""
    answers = [
        last[1] if request is not None and last is not None and last[0] == request else None
        for request, last in zip(requests, lasts, strict=True)
    ]
    repeated = len(answers) - answers.count(None)
    if repeated == 0:
        return None
    if repeated < len(answers):
        again = [i for i, answer in zip(episode_ids, answers, strict=True) if answer is not None]
        new = [i for i, answer in zip(episode_ids, answers, strict=True) if answer is None]
        raise ApiError(
            409,
            f"field '{field}': episodes {_few(again)} repeat their last request "
            f"and episodes {_few(new)} do not; send a retried batch again whole, "
            "as it was first sent",
        )
    return [answer for answer in answers if answer is not None]  # all of them


def replayed(
    episodes: Sequence[Episode], requests: Sequence[int | None], field: str = "request"
) -> list[dict[str, Any]] | None:
    """With the episodes' locks held: :func:`replayed_rows`, and for a new request, a 409
    unless each numbered row is the next request of its episode."""
    if all(r is None or r == e.requests + 1 for e, r in zip(episodes, requests, strict=True)):
        return None  # the usual case, each row its episode's next request (never a repeat)
    ids = [episode.episode_id for episode in episodes]
    answers = replayed_rows(ids, requests, [e.last_request for e in episodes], field)
    if answers is None:
        for episode, request in zip(episodes, requests, strict=True):
            if request is not None and request != episode.requests + 1:
                raise ApiError(
                    409,
                    f"field '{field}': expected {episode.requests + 1} (the next "
                    f"request of episode '{episode.episode_id}'), "
                    f"got {request}",
                )
    return answers


def _few(ids: list[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:3])
    return f"[{shown}{', ...' if len(ids) > 3 else ''}]"

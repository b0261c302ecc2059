"""Retried requests, recognised: a client numbers its requests within each episode (1, 2, 3, ...),
so a request sent again after its answer was lost gets the answer it got the first time and its
rows are not stored twice (``docs/protocol.md``, "Retrying is safe").

A batch request (many episodes' rows) is run whole or not at all, so a retry of it repeats the
last request of every numbered row, or of none. A batch that repeats some and not others is not
the batch that was sent: it gets a 409 rather than half its rows stored twice.

A retry is recognised in its step, under its episodes' locks, so a copy that arrives while the
first try still runs (the client gave up waiting) waits for it and then finds its answers. A
retry that finds an episode the first try ended gets a 409 on its way, and looks for its answers
there (:func:`server.handlers._late_replay`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.recording.recorder import Episode
from server.errors import ApiError

Last = tuple[int, Any] | None  # an episode's last numbered request and the answer it got


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
        raise ApiError(409, f"field '{field}': episodes {_few(again)} repeat their last request "
                            f"and episodes {_few(new)} do not; send a retried batch again whole, "
                            "as it was first sent")  # fmt: skip
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
                raise ApiError(409, f"field '{field}': expected {episode.requests + 1} (the next "
                                    f"request of episode '{episode.episode_id}'), "
                                    f"got {request}")  # fmt: skip
    return answers


def _few(ids: list[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:3])
    return f"[{shown}{', ...' if len(ids) > 3 else ''}]"

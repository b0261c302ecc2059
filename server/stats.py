"""What the live page (``GET /``) shows, served as JSON at ``GET /v1/stats``.

Nothing here runs per step. The totals are the Prometheus counters the server keeps anyway
(:mod:`server.metrics`), read when the page asks; what else is recorded is recorded once per
ended episode (a bounded deque: appending is atomic in CPython, so no lock), once per upload
(a local-inference client's batch of rows), and once per refused request. Rates, and the
history of the charts, are worked out by the page from successive answers.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.format import layout
from server.schemas import object_schema

if TYPE_CHECKING:
    from server.service import Service

RECENT_S = 30.0  # a client seen within this many seconds counts as connected
PER_GROUP = 500  # the latest episodes of a policy version, or of a time bin, figures are drawn from
SHOWN_EPISODES = 12  # rows of the page's table of recent episodes
KEPT_ERRORS = 8  # the last refusals shown with their messages
BIN_S = 10  # seconds per point of the return-over-time chart
BINS = 60  # points of it (ten minutes)
VERSIONS = 20  # policy versions the by-version chart keeps (the newest)
MAX_TRACKED = 10_000  # local clients, or open local episodes, tracked at most (the oldest go)
REMOTE, LOCAL = "remote", "local"  # inference modes


class Ended(NamedTuple):
    """One ended episode (one agent's, for a multi-agent one), as the page shows it."""

    ended_at: float  # unix seconds
    episode_id: str
    client_id: str
    mode: str
    policy_version: int | None
    episode_return: float
    length: int
    end_reason: str


class Stats:
    """The few things the page needs that the metrics do not count."""

    def __init__(self) -> None:
        self.started_at = time.time()
        self.episodes: deque[Ended] = deque(maxlen=SHOWN_EPISODES)
        self.by_version: dict[int | None, deque[Ended]] = {}
        self.by_time: dict[float, deque[Ended]] = {}  # BIN_S seconds from the key on
        self.errors: deque[dict[str, Any]] = deque(maxlen=KEPT_ERRORS)
        self.uploaders: dict[str, float] = {}  # local-inference client -> its last upload
        self.local_open: dict[str, float] = {}  # an uploaded episode not yet ended -> last seen
        self.local_versions: dict[str, tuple[int, float]] = {}  # client -> oldest version acting
        # a group's figures, kept while its newest episode is the same (read by the page alone)
        self.figures: dict[tuple[str, Any], tuple[Ended, dict[str, Any]]] = {}

    def ended(self, summaries: list[dict[str, Any]], version: int | None) -> None:
        """Episodes the server ended (remote inference): their summary rows, and the version
        acting when they ended."""
        self._keep(
            [
                Ended(
                    row["ended_at"].timestamp(),
                    row["episode_id"],
                    row["client_id"],
                    REMOTE,
                    version,
                    float(row["return"]),
                    int(row["length"]),
                    row["end_reason"],
                )
                for row in summaries
            ],
            version,
        )

    def _keep(self, ended: list[Ended], version: int | None) -> None:
        """Episodes that ended (with policy ``version`` acting), in the table and the figures:
        appends and dict look-ups, atomic in CPython (the page's reads need no lock), a group
        at a time (an upload ends a few hundred episodes, most in one time bin)."""
        if not ended:
            return
        self.episodes.extend(ended[-SHOWN_EPISODES:])
        _group(self.by_version, version).extend(ended)
        bins = [episode.ended_at // BIN_S * BIN_S for episode in ended]
        if min(bins) == max(bins):
            _group(self.by_time, bins[0]).extend(ended)
            return
        for episode, start in zip(ended, bins, strict=True):
            _group(self.by_time, start).append(episode)

    def uploaded(self, client_id: str, tables: dict[str, pa.Table]) -> None:
        """A local-inference client's stored upload: the client is connected, its episodes are
        open until a row or summary ends them, and its rows say which version acted."""
        now = time.time()
        self.uploaders[client_id] = now
        _bound(self.uploaders)
        steps = tables.get(layout.STEPS)
        version = self.local_versions.get(client_id, (None, 0.0))[0]
        if steps is not None and steps.num_rows:
            seen = pc.unique(steps.column("episode_id")).to_pylist()
            self.local_open.update(dict.fromkeys(seen, now))
            _bound(self.local_open)
            if "policy_version" in steps.column_names:
                low = pc.min(steps.column("policy_version")).as_py()
                if low is not None:
                    version = low
                    self.local_versions[client_id] = (low, now)
                    _bound(self.local_versions)
        summaries = tables.get(layout.EPISODES)
        if summaries is not None and summaries.num_rows:
            # column by column: a datetime per row made this a seventh of a busy server's time
            micros = summaries.column("ended_at").cast(pa.timestamp("us", "UTC")).cast(pa.int64())
            ids, returns, lengths, reasons = (
                summaries.column(name).to_pylist() for name in _SUMMARY
            )
            # forget each ended episode, in one C loop (an upload ends hundreds)
            deque(map(self.local_open.pop, ids, repeat(None)), maxlen=0)
            n = len(ids)
            columns = zip(
                (micros.to_numpy() / 1e6).tolist(),
                ids,
                [client_id] * n,
                [LOCAL] * n,
                [version] * n,
                returns,
                lengths,
                reasons,
                strict=True,
            )
            self._keep(list(map(Ended._make, columns)), version)

    def refused(self, status: int, route: str, body: Any) -> None:
        """A refused request (status >= 400) and the message it was answered with."""
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = str(error.get("message", "")) if isinstance(error, dict) else ""
        self.errors.append(
            {"at": time.time(), "status": status, "route": route, "message": message}
        )


def _bound(tracked: dict[str, Any]) -> None:
    """Forget the entries first added past MAX_TRACKED (a page that nobody opens never prunes
    them by age), so uploads of rows that never form episodes cost no memory."""
    if len(tracked) > MAX_TRACKED:
        for key in list(tracked)[: len(tracked) - MAX_TRACKED // 2]:
            tracked.pop(key, None)


def _group(groups: dict[Any, deque[Ended]], key: Any) -> deque[Ended]:
    group = groups.get(key)
    return group if group is not None else groups.setdefault(key, deque(maxlen=PER_GROUP))


_SUMMARY = ["episode_id", "return", "length", "end_reason"]


def snapshot(service: Service) -> dict[str, Any]:
    """The document of ``GET /v1/stats`` (its JSON schema: :func:`schema`)."""
    stats, now = service.stats, time.time()
    episodes = list(stats.episodes)
    _forget(stats, now)
    runner, writer = service.runner, service.writer
    served = runner.version
    return {
        "now": now,
        "started_at": stats.started_at,
        "env_id": service.env_id,
        "totals": service.metrics.totals(),
        "modes": _modes(service, now),
        "policy": {
            "version": served,
            "loaded_at": runner.loaded_at,
            "checkpoint": None if runner.checkpoint_path is None else runner.checkpoint_path.name,
            "refused_checkpoint": runner.refused,
            "lag": _lag(stats, served, now),
        },
        "writer": {
            "backlog": writer.backlog,
            "shards_committed": writer.shards_committed,
            "last_commit_seconds": writer.last_commit_seconds,
            "last_committed_at": writer.last_committed_at,
            "storage_error": None if writer.disk.error is None else writer.disk.error.reason,
        },
        "refused": list(stats.errors)[::-1],
        "by_version": _by_version(stats),
        "over_time": _over_time(stats),
        "recent_episodes": [_row(e) for e in episodes[-SHOWN_EPISODES:][::-1]],
    }


def _modes(service: Service, now: float) -> dict[str, Any]:
    """Open episodes and connected clients (seen within RECENT_S), by inference mode."""
    stats, cutoff = service.stats, now - RECENT_S
    open_remote = service.episodes.all_open()
    idle = now - service.config.idle_timeout_s
    for episode_id, seen in list(stats.local_open.items()):
        if seen < idle:  # a client that died with it open: its rows stop, as the reaper's would
            stats.local_open.pop(episode_id, None)
    age = time.monotonic() - now  # Episode.last_seen is monotonic
    remote_clients = {e.client_id for e in open_remote if e.last_seen - age >= cutoff}
    for start, group in list(stats.by_time.items()):  # and those between episodes
        if start + BIN_S >= cutoff:
            remote_clients |= {e.client_id for e in list(group) if e.mode == REMOTE}
    local_clients = [client for client, seen in list(stats.uploaders.items()) if seen >= cutoff]
    return {
        REMOTE: {"open_episodes": len(open_remote), "clients": len(remote_clients)},
        LOCAL: {"open_episodes": len(stats.local_open), "clients": len(local_clients)},
    }


def _lag(stats: Stats, served: int | None, now: float) -> dict[str, int | None]:
    """Versions the acting policy is behind the served one: remote inference acts with the
    served policy itself; local clients act with the weights they last pulled."""
    cutoff = now - RECENT_S
    acting = [v for v, seen in list(stats.local_versions.values()) if seen >= cutoff]
    local = None if served is None or not acting else max(0, served - min(acting))
    return {REMOTE: None if served is None else 0, LOCAL: local}


def _quantiles(values: list[float]) -> dict[str, float]:
    p10, p50, p90 = np.percentile(np.asarray(values, np.float64), [10, 50, 90]).tolist()
    return {"p10": p10, "p50": p50, "p90": p90}


def _figures(stats: Stats, key: tuple[str, Any], group: deque[Ended]) -> dict[str, Any] | None:
    """A group's count, and the quantiles of its returns and lengths: worked out again only
    when an episode has joined it since the last answer (most groups are done: older time
    bins, older versions)."""
    try:
        newest = group[-1]
    except IndexError:  # an empty group
        return None
    cached = stats.figures.get(key)
    if cached is not None and cached[0] is newest:
        return cached[1]
    episodes = list(group)
    versions = [e.policy_version for e in episodes if e.policy_version is not None]
    figures = {
        "episodes": len(episodes),
        "newest_version": max(versions) if versions else None,
        "return": _quantiles([e.episode_return for e in episodes]),
        "length": _quantiles([float(e.length) for e in episodes]),
    }
    stats.figures[key] = (episodes[-1], figures)
    return figures


def _forget(stats: Stats, now: float) -> None:
    """Drop time bins older than the chart, and all but the newest VERSIONS versions."""
    first = (now // BIN_S - BINS + 1) * BIN_S
    for start in [start for start in list(stats.by_time) if start < first]:
        stats.by_time.pop(start, None)
        stats.figures.pop(("time", start), None)
    versions = sorted(v for v in list(stats.by_version) if v is not None)
    for version in versions[:-VERSIONS]:
        stats.by_version.pop(version, None)
        stats.figures.pop(("version", version), None)


def _by_version(stats: Stats) -> list[dict[str, Any]]:
    """Return and length of the latest episodes of each policy version (None: acting at
    random)."""
    out = []
    for version, group in sorted(
        list(stats.by_version.items()), key=lambda item: -1 if item[0] is None else item[0]
    ):
        figures = _figures(stats, ("version", version), group)
        if figures is not None:
            out.append({"policy_version": version, **_shown(figures)})
    return out


def _over_time(stats: Stats) -> list[dict[str, Any]]:
    """Return and length of the episodes that ended in each BIN_S seconds of the last
    BINS * BIN_S, with the newest version among them."""
    out = []
    for start, group in sorted(list(stats.by_time.items())):
        figures = _figures(stats, ("time", start), group)
        if figures is not None:
            out.append({"t": start, "policy_version": figures["newest_version"], **_shown(figures)})
    return out


def _shown(figures: dict[str, Any]) -> dict[str, Any]:
    return {key: figures[key] for key in ("episodes", "return", "length")}


def _row(episode: Ended) -> dict[str, Any]:
    row = episode._asdict()
    row["return"] = row.pop("episode_return")
    return row


def schema() -> dict[str, Any]:
    """The JSON schema of :func:`snapshot`'s document, for the OpenAPI document."""
    number, integer = {"type": "number"}, {"type": "integer"}
    maybe_int, maybe_number = {"type": ["integer", "null"]}, {"type": ["number", "null"]}
    maybe_text = {"type": ["string", "null"]}
    counts = object_schema(open_episodes=integer, clients=integer)
    spread = object_schema(p10=number, p50=number, p90=number)
    figures = {"episodes": integer, "return": spread, "length": spread}
    return object_schema(
        None,
        now={**number, "description": "the server's clock, unix seconds"},
        started_at=number,
        env_id=maybe_text,
        totals=object_schema(
            steps_accepted=integer,
            steps_rejected=integer,
            episodes_ended=integer,
            responses={"type": "object", "additionalProperties": integer},
        ),
        modes={
            **object_schema(remote=counts, local=counts),
            "description": f"open episodes, and clients seen in the last {RECENT_S:.0f} s, by "
            "inference mode",
        },
        policy=object_schema(
            version=maybe_int,
            loaded_at=maybe_number,
            checkpoint=maybe_text,
            refused_checkpoint=maybe_text,
            lag={
                **object_schema(remote=maybe_int, local=maybe_int),
                "description": "versions the acting policy is behind the served one",
            },
        ),
        writer=object_schema(
            backlog=integer,
            shards_committed=integer,
            last_commit_seconds=number,
            last_committed_at=maybe_number,
            storage_error=maybe_text,
        ),
        refused={
            "type": "array",
            "maxItems": KEPT_ERRORS,
            "items": object_schema(at=number, status=integer, route=_TEXT, message=_TEXT),
        },
        by_version={
            "type": "array",
            "items": object_schema(None, policy_version=maybe_int, **figures),
        },
        over_time={
            "type": "array",
            "items": object_schema(None, t=number, policy_version=maybe_int, **figures),
        },
        recent_episodes={
            "type": "array",
            "maxItems": SHOWN_EPISODES,
            "items": object_schema(
                None,
                episode_id=_TEXT,
                client_id=_TEXT,
                mode={"enum": [REMOTE, LOCAL]},
                policy_version=maybe_int,
                end_reason=_TEXT,
                ended_at=number,
                length=integer,
                **{"return": number},
            ),
        },
    )


_TEXT = {"type": "string"}

"""What the server counts, exposed through ``prometheus_client`` at ``GET /v1/metrics``.

Each :class:`Metrics` has its own :class:`~prometheus_client.CollectorRegistry`, so several
servers in one process (tests, an embedding app) keep separate counts. The names:

==================================  =========  ==================================================
``rlpipe_steps_accepted_total``     counter    steps made durable
``rlpipe_steps_rejected_total``     counter    steps in requests that were refused
``rlpipe_responses_total``          counter    responses sent, by ``status``
``rlpipe_request_seconds``          histogram  time to answer, by ``route`` and ``status``
``rlpipe_append_seconds``           histogram  time to make rows durable, one per writer append
``rlpipe_open_episodes``            gauge      episodes open in server memory
``rlpipe_queue_depth``              gauge      rolled shards waiting to be written
``rlpipe_commit_seconds``           gauge      how long the last shard commit took
``rlpipe_policy_version``           gauge      version of the policy acting; -1 at random
==================================  =========  ==================================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

# a step is answered in about a millisecond and an append takes less: the library's default
# buckets start at 5 ms and would put nearly everything in the first
_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    """The server's counters, gauges and histograms, in a registry of its own (thread-safe)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self._accepted = Counter("rlpipe_steps_accepted", "Steps made durable.", registry=registry)
        self._rejected = Counter(
            "rlpipe_steps_rejected", "Steps in requests that were refused.", registry=registry
        )
        self._responses = Counter(
            "rlpipe_responses", "Responses sent, by status.", ["status"], registry=registry
        )
        self._requests = Histogram(
            "rlpipe_request_seconds",
            "Time to answer a request, by route and status.",
            ["route", "status"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self._appends = Histogram(
            "rlpipe_append_seconds",
            "Time spent making rows durable, per writer append.",
            buckets=_BUCKETS,
            registry=registry,
        )
        self._open = Gauge(
            "rlpipe_open_episodes", "Episodes open in server memory.", registry=registry
        )
        self._queue = Gauge(
            "rlpipe_queue_depth", "Rolled shards waiting to be written.", registry=registry
        )
        self._commit = Gauge(
            "rlpipe_commit_seconds", "How long the last shard commit took.", registry=registry
        )
        self._policy = Gauge(
            "rlpipe_policy_version",
            "Version of the policy acting; -1 when acting at random.",
            registry=registry,
        )

    def observe_append(self, seconds: float, rows: int) -> None:
        """One writer append of ``rows`` steps, which took ``seconds``."""
        self._appends.observe(seconds)
        self._accepted.inc(rows)

    def accepted(self, rows: int) -> None:
        """Steps made durable outside the step path (uploads)."""
        self._accepted.inc(rows)

    def response(
        self, status: int, steps: int = 0, route: str | None = None, seconds: float | None = None
    ) -> None:
        """One answer: its status, the steps it refused when it is an error, and how long it
        took on ``route`` (the route's template, never the raw path: ids would make a series
        each)."""
        self._responses.labels(status).inc()
        if status >= 400 and steps:
            self._rejected.inc(steps)
        if route is not None and seconds is not None:
            self._requests.labels(route, status).observe(seconds)

    def render(
        self,
        accept: str,
        open_episodes: int,
        queue_depth: int,
        commit_seconds: float,
        policy_version: int | None,
    ) -> tuple[bytes, str]:
        """The exposition, with the gauges read now, and its content type: in the format the
        scraper's ``Accept`` asks for, as prometheus_client chooses (Prometheus' text format
        0.0.4 unless OpenMetrics is asked for)."""
        self._open.set(open_episodes)
        self._queue.set(queue_depth)
        self._commit.set(commit_seconds)
        self._policy.set(-1 if policy_version is None else policy_version)
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type

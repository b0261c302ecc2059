"""What the server counts, exposed through ``prometheus_client`` at ``GET /v1/metrics``
(``docs/protocol.md`` lists the names).

Each :class:`Metrics` has its own :class:`~prometheus_client.CollectorRegistry`, so several
servers in one process (tests, an embedding app) keep separate counts.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

# a step is answered in about a millisecond and an append takes less: the library's default
# buckets start at 5 ms and would put nearly everything in the first
_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_GAUGES = {  # read when scraped
    "open_episodes": "Episodes open in server memory.",
    "queue_depth": "Rolled shards waiting to be written.",
    "commit_seconds": "How long the last shard commit took.",
    "policy_version": "Version of the policy acting; -1 when acting at random.",
    "storage_failing": "1 while the dataset's disk refuses writes (GET /v1/health says why).",
}


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
        self._gauges = {
            name: Gauge(f"rlpipe_{name}", text, registry=registry) for name, text in _GAUGES.items()
        }
        self._storage_errors = Counter(
            "rlpipe_storage_errors",
            "Writes the dataset's disk refused (full, over quota, I/O error).",
            registry=registry,
        )
        self._storage_counted = 0
        # labelled series by their metric and labels (see _series)
        self._series: dict[tuple[Any, ...], Any] = {}
        self._ended = Counter(
            "rlpipe_episodes_ended",
            "Episodes ended (by the client or the server).",
            registry=registry,
        )

    def accepted(self, rows: int, append_seconds: float | None = None) -> None:
        """Steps made durable, by a writer append that took ``append_seconds`` (None: an
        upload's, not timed)."""
        self._accepted.inc(rows)
        if append_seconds is not None:
            self._appends.observe(append_seconds)

    def ended(self, episodes: int) -> None:
        """Episodes ended: summary rows written (an upload's included)."""
        self._ended.inc(episodes)

    def totals(self) -> dict[str, Any]:
        """The counters as they stand, for ``GET /v1/stats``: read, not reset (rates are the
        reader's differences). Costs a look at each counter, never the step path."""
        responses = {
            sample.labels["status"]: int(sample.value)
            for family in self._responses.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        }
        return {
            "steps_accepted": int(_value(self._accepted)),
            "steps_rejected": int(_value(self._rejected)),
            "episodes_ended": int(_value(self._ended)),
            "responses": responses,
        }

    def response(
        self, status: int, steps: int = 0, route: str | None = None, seconds: float | None = None
    ) -> None:
        """One answer: its status, the steps it refused when it is an error, and how long it
        took on ``route`` (the route's template, never the raw path: ids would make a series
        each)."""
        self._labelled(self._responses, status).inc()
        if status >= 400 and steps:
            self._rejected.inc(steps)
        if route is not None and seconds is not None:
            self._labelled(self._requests, route, status).observe(seconds)

    def _labelled(self, metric: Any, *labels: Any) -> Any:
        """``metric.labels(*labels)``, looked up once: labels() takes a lock and builds its key
        on every call, 6% of the server's Python time under 8x16 vector clients."""
        key = (metric, *labels)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = metric.labels(*labels)
        return series

    def render(self, accept: str, storage_errors: int = 0, **gauges: float) -> tuple[bytes, str]:
        """The exposition, with the gauges of :data:`_GAUGES` as read now (and the count of
        writes the disk refused), and its content type: in the format the scraper's ``Accept``
        asks for, as prometheus_client chooses (Prometheus' text format 0.0.4 unless OpenMetrics
        is asked for)."""
        for name, value in gauges.items():
            self._gauges[name].set(value)
        self._storage_errors.inc(max(0, storage_errors - self._storage_counted))
        self._storage_counted = max(storage_errors, self._storage_counted)
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


def _value(counter: Counter) -> float:
    """A label-less counter's total, through the collector interface every scrape uses."""
    samples = (s for family in counter.collect() for s in family.samples)
    return next(s.value for s in samples if s.name.endswith("_total"))

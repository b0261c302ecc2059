"""Counters the server keeps, rendered in Prometheus' text format (no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter


class Metrics:
    """Thread-safe counters and a latency sum, enough for rates and means in Prometheus."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps_accepted = 0
        self.steps_rejected = 0
        self.appends = 0
        self.append_seconds = 0.0
        self.responses: Counter[int] = Counter()

    def observe_append(self, seconds: float, rows: int) -> None:
        with self._lock:
            self.appends += 1
            self.append_seconds += seconds
            self.steps_accepted += rows

    def accepted(self, rows: int) -> None:
        with self._lock:
            self.steps_accepted += rows

    def response(self, status: int, steps: int = 0) -> None:
        with self._lock:
            self.responses[status] += 1
            if status >= 400:
                self.steps_rejected += steps

    def render(self, open_episodes: int, queue_depth: int, commit_seconds: float,
               policy_version: int | None) -> str:  # fmt: skip
        """The exposition text: HELP and TYPE lines, then samples."""
        with self._lock:
            lines = [
                *_metric("rlpipe_steps_accepted_total", "counter",
                         "Steps made durable.", self.steps_accepted),
                *_metric("rlpipe_steps_rejected_total", "counter",
                         "Steps in requests that were refused.", self.steps_rejected),
                *_metric("rlpipe_open_episodes", "gauge", "Episodes open in server memory.",
                         open_episodes),
                *_metric("rlpipe_queue_depth", "gauge", "Rolled shards waiting to be written.",
                         queue_depth),
                *_metric("rlpipe_commit_seconds", "gauge",
                         "How long the last shard commit took.", commit_seconds),
                *_metric("rlpipe_append_seconds_sum", "counter",
                         "Time spent making rows durable.", self.append_seconds),
                *_metric("rlpipe_append_seconds_count", "counter",
                         "Durable appends made.", self.appends),
                *_metric("rlpipe_policy_version", "gauge",
                         "Version of the policy acting; -1 when acting at random.",
                         -1 if policy_version is None else policy_version),
                "# HELP rlpipe_responses_total Responses sent, by status.",
                "# TYPE rlpipe_responses_total counter",
            ]  # fmt: skip
            lines += [
                f'rlpipe_responses_total{{status="{status}"}} {count}'
                for status, count in sorted(self.responses.items())
            ]
        return "\n".join(lines) + "\n"


def _metric(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]

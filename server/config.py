"""The server's one config: where the data goes, which policy acts, and the limits it enforces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from pipeline.dataset.writer_config import WriterConfig
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``create_app`` needs, checked once at construction.

    Attributes:
        data: the dataset every step goes to (created when new): a directory, or a URI
            (``s3://bucket/prefix``), whose checkpoints then come from ``policy``.
        storage_options: endpoint and credentials for a URI, as ``DatasetWriter`` takes them.
        observation_space: the per-agent observation space; None to read it from ``data``.
        action_space: as ``observation_space``.
        env_id: the gymnasium id, recorded in a new dataset's manifest.
        policy: a checkpoint file, checkpoints directory or run directory; None means the
            dataset's own ``checkpoints/``.
        token: when set, every request but health must carry ``Authorization: Bearer TOKEN``.
        max_body_bytes: larger request bodies get 413.
        idle_timeout_s: episodes without a request for this long are closed as truncated.
        policy_poll_s: how often the server looks for a newer checkpoint.
        max_backlog: rolled shards waiting to be written before the server answers 503.
        backlog_wait_s: how long a request that finds ``max_backlog`` shards waiting waits
            for the writer to catch up before that 503 (0: at once). A commit that is slow
            for a moment then slows answers by as much, instead of sending clients to sleep
            for ``retry_after_s``.
        retry_after_s: what a 503 asks clients to wait.
        seed: seeds the server's action sampling, so runs can be repeated.
        writer: the dataset writer's config; a 2xx answers an append it acknowledged, so the
            server's default ``sync="background"`` (see ``WriterConfig``) answers without an
            fsync, and ``"always"`` after one (1.5-4 ms a request here).
    """

    data: Path | str
    observation_space: gym.Space[Any] | None = None
    action_space: gym.Space[Any] | None = None
    env_id: str | None = None
    policy: Path | None = None
    token: str | None = None
    max_body_bytes: int = 64 * 2**20
    idle_timeout_s: float = 300.0
    policy_poll_s: float = 0.2
    max_backlog: int = 3
    backlog_wait_s: float = 1.0
    retry_after_s: int = 1
    seed: int = 0
    writer: WriterConfig = field(default_factory=lambda: WriterConfig(sync="background"))
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)  # secrets

    def __post_init__(self) -> None:
        uri = "://" in str(self.data)
        object.__setattr__(self, "data", str(self.data) if uri else Path(self.data))
        if self.policy is not None:
            object.__setattr__(self, "policy", Path(self.policy))
        if (self.observation_space is None) != (self.action_space is None):
            raise ConfigError(
                "ServerConfig",
                "action_space",
                "both spaces or neither",
                f"observation_space={self.observation_space}, action_space={self.action_space}",
            )
        if self.token is not None and (not isinstance(self.token, str) or not self.token):
            raise ConfigError("ServerConfig", "token", "a non-empty string or None", self.token)
        for name in ("max_body_bytes", "max_backlog", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError("ServerConfig", name, "an integer >= 1", value)
        wait = self.backlog_wait_s
        if not isinstance(wait, int | float) or isinstance(wait, bool) or not wait >= 0:
            raise ConfigError("ServerConfig", "backlog_wait_s", "a number of seconds >= 0", wait)
        for name in ("idle_timeout_s", "policy_poll_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ConfigError("ServerConfig", name, "a number of seconds > 0", value)

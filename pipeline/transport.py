"""The client's side of the wire: HTTP with timeouts and typed errors, and JSON-ready values.

Kept apart from :mod:`pipeline.client` so the client module holds the verbs and little else.
Importing this imports neither torch nor Flask.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import requests

from pipeline import layout, spaces
from pipeline.errors import RlpipeError

ARROW_TYPE = "application/vnd.apache.arrow.stream"


class ServerError(RlpipeError):
    """The server refused a request or could not be reached; ``status`` is None for the latter."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status or 'no answer'}: {message}")
        self.status = status
        self.message = message


class RequestRejected(ServerError, ValueError):
    """400, 413 or 415: the request itself is wrong (the message names the field)."""


class Unauthorized(ServerError):
    """401: the token is missing or wrong."""


class EpisodeError(ServerError):
    """404 or 409: the episode is unknown to the server, or has ended."""


class ServerUnavailable(ServerError):
    """The server did not answer, or kept answering 503, for longer than the timeout."""

    def __init__(self, status: int | None, message: str, retry_after: float = 1.0) -> None:
        super().__init__(status, message)
        self.retry_after = retry_after


_BY_STATUS: dict[int, type[ServerError]] = {
    400: RequestRejected, 413: RequestRejected, 415: RequestRejected, 401: Unauthorized,
    404: EpisodeError, 409: EpisodeError, 503: ServerUnavailable,
}  # fmt: skip


def base_url(address: str) -> str:
    """``"localhost:9900"`` (RLlib's form) or a full URL, as the URL requests are built on."""
    text = address.strip().rstrip("/")
    return text if "://" in text else f"http://{text}"


class Http:
    """Requests with a timeout each, 503 Retry-After honoured, and typed errors."""

    def __init__(self, address: str, session: requests.Session | None, timeout: float,
                 token: str | None) -> None:  # fmt: skip
        self.url = base_url(address)
        self.session = session or requests.Session()
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def call(self, method: str, path: str, patience_s: float | None = None,
             **kwargs: Any) -> requests.Response:  # fmt: skip
        """One request, retried on no answer and on 503 until ``patience_s`` (default timeout)."""
        deadline = time.monotonic() + (self.timeout if patience_s is None else patience_s)
        headers = {**self.headers, **kwargs.pop("headers", {})}
        while True:
            try:
                response = self.session.request(method, self.url + path, headers=headers,
                                                timeout=self.timeout, **kwargs)  # fmt: skip
            except (requests.ConnectionError, requests.Timeout) as error:
                if time.monotonic() + 0.1 >= deadline:
                    raise ServerUnavailable(None, f"{self.url}: {error}") from None
                time.sleep(0.1)
                continue
            if response.status_code == 503:
                wait = _retry_after(response)
                if time.monotonic() + wait < deadline:
                    time.sleep(wait)
                    continue
            if response.status_code >= 400:
                raise _error(response)
            return response


def _retry_after(response: requests.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


def _error(response: requests.Response) -> ServerError:
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = response.text[:200] or response.reason
    if response.status_code == 503:
        return ServerUnavailable(503, message, _retry_after(response))
    return _BY_STATUS.get(response.status_code, ServerError)(response.status_code, message)


def parse_spaces(doc: dict[str, Any]) -> tuple[gym.Space[Any], gym.Space[Any], str | None]:
    return (spaces.space_from_json(doc["observation_space"]),
            spaces.space_from_json(doc["action_space"]), doc.get("env_id"))  # fmt: skip


def row_of(batch: Any, i: int) -> Any:
    """Row ``i`` of a batch in :mod:`pipeline.spaces` layout, as the env would take it."""
    if isinstance(batch, dict):
        return {k: row_of(v, i) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(row_of(v, i) for v in batch)
    value = np.asarray(batch)[i]
    return value.item() if value.ndim == 0 else value


def jsonable(value: Any) -> Any:
    """numpy arrays and scalars as JSON values (envs hand out numpy; JSON wants lists)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


class RemoteEpisode:
    """What rides on the next request: rewards, infos and done flags logged since the last."""

    def __init__(self) -> None:
        self.rewards: dict[str, float] = {}
        self.infos: dict[str, Any] = {}
        self.dones: dict[str, bool] = {}
        self.request = 0

    def add(self, rewards: dict[str, Any], infos: dict[str, Any], dones: dict[str, bool]) -> None:
        for agent_id, reward in rewards.items():
            self.rewards[agent_id] = self.rewards.get(agent_id, 0.0) + float(reward)
        self.infos.update(infos)
        self.dones.update(dones)

    def body(self, multiagent: bool, observation: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"request": self.request + 1}
        if multiagent:
            body.update(observations=observation, rewards=self.rewards,
                        infos=jsonable(self.infos), dones=self.dones)  # fmt: skip
        else:
            agent = layout.DEFAULT_AGENT_ID
            body.update(observation=observation, reward=self.rewards.get(agent, 0.0),
                        info=jsonable(self.infos.get(agent)))  # fmt: skip
        return body

    def sent(self) -> None:
        self.request += 1
        self.rewards, self.infos, self.dones = {}, {}, {}

"""The client's side of the wire: HTTP with timeouts and typed errors, and JSON-ready values.

Kept apart from :mod:`pipeline.client` so the client module holds the verbs and little else.
Importing this imports neither torch nor Flask.
"""

from __future__ import annotations

import functools
import json as _json
import os
import ssl
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import gymnasium as gym
import numpy as np
import requests

from pipeline.client.connection import BadAnswer, Connection, Disconnected, Reply
from pipeline.errors import (
    ConfigError,
    EpisodeError,
    RequestRejected,
    SchemaError,
    ServerError,
    ServerUnavailable,
    Unauthorized,
)
from pipeline.format import spaces

ARROW_TYPE = "application/vnd.apache.arrow.stream"
TOKEN_VARIABLE = "RLPIPE_TOKEN"  # the same variable ``rlpipe serve`` reads its token from

# how the server's certificate is checked, as requests' and httpx's ``verify``: True (the
# system's CAs), the path of a PEM CA bundle, or an ssl.SSLContext
Verify = bool | str | os.PathLike[str] | ssl.SSLContext


_BY_STATUS: dict[int, type[ServerError]] = {
    400: RequestRejected,
    413: RequestRejected,
    415: RequestRejected,
    401: Unauthorized,
    404: EpisodeError,
    409: EpisodeError,
    503: ServerUnavailable,
}
# A proxy's answers for a server behind it that gave no answer (502) or none in time (504): the
# server may be restarting, so these are taken as no answer, and retried as such (a repeat of a
# numbered call the server acted on writes nothing twice: docs/protocol.md)
_GATEWAY = frozenset({502, 504})
_WAITED_OUT = _GATEWAY | {503}  # retried within the call's patience
_NO_ANSWER_WAIT_S = 0.1  # between tries while the server does not answer


def base_url(address: str) -> str:
    """``"localhost:9900"`` (RLlib's form) or a full URL, as the URL requests are built on."""
    text = address.strip().rstrip("/")
    return text if "://" in text else f"http://{text}"


# what a request on a keep-alive connection the server has closed meets (TLS has its own)
_CLOSED = (
    ConnectionResetError,
    BrokenPipeError,
    Disconnected,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


class _NoAnswer(Exception):
    """The connection failed or timed out: the server may be down, so the call may retry."""


class Http:
    """Requests with a timeout each, retried while the server does not answer (a proxy's 502 and
    504 count as no answer), 503 Retry-After honoured, and typed errors.

    Without a ``session`` each thread keeps one keep-alive
    :class:`~pipeline.client.connection.Connection`. A step of remote inference is one small
    request, on machines where the simulator shares the CPU: ``requests`` spends 0.3-0.5 ms of
    CPU on each (more than the server's work), a ``urllib3`` pool about 0.3 ms, ``http.client``
    about 0.2 ms and pycurl 0.1 ms, against 0.05 ms here. With a ``session`` (proxies,
    certificates, adapters) every request goes through it.

    An ``https://`` address is served over TLS with the certificate verified against
    ``verify`` (see :data:`Verify`); a certificate that does not verify is a
    :class:`ServerError` at once, never retried as a server that is down. ``token`` None
    takes ``RLPIPE_TOKEN`` from the environment, if set.
    """

    def __init__(
        self,
        address: str,
        session: requests.Session | None,
        timeout: float,
        token: str | None,
        verify: Verify = True,
    ) -> None:
        self.url = base_url(address)
        self.session = session
        self.timeout = timeout
        if token is None:
            token = os.environ.get(TOKEN_VARIABLE) or None
        if token is not None and any(c in token for c in "\r\n\0"):  # the secret is not echoed
            raise ConfigError("PolicyClient", "token", "a token without line breaks", "<hidden>")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        parts = urlsplit(self.url)
        self._verify = _session_verify(verify, session)
        tls = None
        if parts.scheme == "https":
            tls = _tls_context(verify) if session is None else None
        elif verify is not True:  # a CA given for plain HTTP: the token would go in clear
            wanted = "an https:// address, as verify names how to check its certificate"
            raise ConfigError("PolicyClient", "address", wanted, self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        authority = parts.netloc.rpartition("@")[2]
        self._new = functools.partial(
            Connection, parts.hostname or "localhost", port, authority, timeout, tls
        )
        self._prefix = parts.path.rstrip("/")
        self._local = threading.local()
        self._open: set[Connection] = set()  # every thread's, to close them all
        weakref.finalize(self, _close_all, self._open)

    def close(self) -> None:
        """Close the keep-alive connections of every thread (a later call opens new ones)."""
        _close_all(self._open)

    def call(
        self,
        method: str,
        path: str,
        patience_s: float | None = None,
        *,
        json: Any = None,
        data: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """One request, retried on no answer (a proxy's 502 or 504 too) and on 503 until
        ``patience_s`` (default timeout)."""
        deadline = time.monotonic() + (self.timeout if patience_s is None else patience_s)
        sent = {**self.headers, **(headers or {})}
        if json is not None:
            data = _json.dumps(json, separators=(",", ":")).encode()  # NaN: the server says 400
            sent["Content-Type"] = "application/json"
        if params:
            path += "?" + urlencode(params)
        while True:
            try:
                response = self._send(method, path, data, sent)
            except _NoAnswer as error:
                if time.monotonic() + _NO_ANSWER_WAIT_S >= deadline:
                    raise ServerUnavailable(None, f"{self.url}: {error}") from None
                time.sleep(_NO_ANSWER_WAIT_S)
                continue
            if response.status_code in _WAITED_OUT:
                wait = _retry_after(response)
                if time.monotonic() + wait < deadline:
                    time.sleep(wait)
                    continue
            if response.status_code >= 400:
                raise _error(response)
            return response

    def _send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        if self.session is not None:
            try:
                answer = self.session.request(
                    method,
                    self.url + path,
                    data=body,
                    headers=headers,
                    timeout=self.timeout,
                    **self._verify,
                )
            except (requests.ConnectionError, requests.Timeout) as error:
                raise _failure(self.url, error) from None
            return Reply(answer.status_code, answer.headers, answer.content, answer.reason)
        connection = self._connection()
        reused = connection.sock is not None
        try:
            return connection.exchange(method, self._prefix + path, body, headers)
        except _CLOSED as error:
            if not reused:  # a fresh connection failed: the server is not there
                raise _NoAnswer(str(error) or type(error).__name__) from None
        except (OSError, BadAnswer) as error:
            raise _failure(self.url, error) from None
        try:  # the server closed an idle keep-alive connection: once more, on a new one
            return connection.exchange(method, self._prefix + path, body, headers)
        except (OSError, BadAnswer) as error:
            raise _failure(self.url, error) from None

    def _connection(self) -> Connection:
        connection: Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self._new()
        self._open.add(connection)  # again after close(): it reconnects on its next request
        return connection


def _tls_context(verify: Verify) -> ssl.SSLContext:
    """The context that checks the server's certificate, as ``verify`` asks."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if verify is True:
        return ssl.create_default_context()  # the system's CAs (SSL_CERT_FILE, if set)
    if isinstance(verify, bool):
        raise ConfigError("PolicyClient", "verify", _VERIFY_VALUES, verify)
    try:  # that bundle alone, as requests' verify=PATH
        return ssl.create_default_context(cafile=os.fspath(verify))
    except (OSError, ssl.SSLError) as error:
        got = f"{os.fspath(verify)} ({getattr(error, 'strerror', None) or error})"
        raise ConfigError("PolicyClient", "verify", "a readable PEM file of CAs", got) from None


_VERIFY_VALUES = (
    "True (the system's CAs), a PEM CA bundle's path or an ssl.SSLContext (one whose "
    "verify_mode is ssl.CERT_NONE turns the check off, if you must)"
)


def _session_verify(verify: Verify, session: requests.Session | None) -> dict[str, Any]:
    """What a ``requests`` session is told about ``verify`` with each request."""
    if session is None or verify is True:
        return {}  # the session's own setting (session.verify, REQUESTS_CA_BUNDLE)
    if isinstance(verify, ssl.SSLContext | bool):
        raise ConfigError(
            "PolicyClient", "verify", "with a session: True or a CA bundle's path", verify
        )
    return {"verify": os.fspath(verify)}


def _failure(url: str, error: BaseException) -> Exception:
    """What a failed exchange raises: an error at once when TLS says the peer is not the
    server asked for, else :class:`_NoAnswer` (the server may be down: the call may retry)."""
    for cause in _causes(error):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return ServerError(
                None,
                f"{url}: the server's TLS certificate was refused ({cause.verify_message}); "
                "if a CA of your own signed it, pass that CA: PolicyClient(..., verify=PATH)",
            )
        if isinstance(cause, ssl.SSLError) and cause.reason == "WRONG_VERSION_NUMBER":
            return ServerError(None, f"{url}: the server does not speak TLS; use http://")
        if isinstance(cause, BadAnswer) and cause.start.startswith(b"\x15\x03"):
            # a TLS alert record (type 21, version 3.x): a TLS server's answer to plain HTTP
            return ServerError(None, f"{url}: the server speaks TLS only; use https://")
    return _NoAnswer(str(error) or type(error).__name__)


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps (requests wraps urllib3's errors, which wrap ssl's)."""
    found: list[BaseException] = []
    todo = [error]
    while todo and len(found) < 20:
        item = todo.pop()
        if item in found:
            continue
        found.append(item)
        wrapped = [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
        todo.extend(x for x in wrapped if isinstance(x, BaseException))
    return found


def _close_all(connections: set[Connection]) -> None:
    for connection in list(connections):
        connections.discard(connection)
        connection.close()


def _retry_after(response: Reply) -> float:
    """The seconds a 503 asks for (1 if it does not say); a proxy's 502 or 504, as no answer."""
    if response.status_code in _GATEWAY:
        return _NO_ANSWER_WAIT_S
    try:
        return max(0.0, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


def _error(response: Reply) -> ServerError:
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = response.text[:200] or response.reason
    if response.status_code in _WAITED_OUT:
        return ServerUnavailable(response.status_code, message, _retry_after(response))
    return _BY_STATUS.get(response.status_code, ServerError)(response.status_code, message)


def parse_spaces(doc: dict[str, Any]) -> tuple[gym.Space[Any], gym.Space[Any], str | None]:
    return (
        spaces.space_from_json(doc["observation_space"]),
        spaces.space_from_json(doc["action_space"]),
        doc.get("env_id"),
    )


def jsonable(value: Any) -> Any:
    """numpy arrays and scalars as JSON values (envs hand out numpy; JSON wants lists)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


class AgentIds:
    """One episode's agent ids: any JSON scalar the simulator uses (a string or an integer,
    as RLlib's multi-agent envs do) becomes the text the wire and the ``agent_id`` column
    carry, and answers are keyed by the ids as given again."""

    def __init__(self) -> None:
        self._given: dict[str, Any] = {}

    def encode(self, mapping: Mapping[Any, Any], field: str) -> dict[str, Any]:
        """``mapping`` keyed by text; 1 and "1" in one episode are refused (one column value).

        Raises:
            SchemaError: naming ``field``, for an id of another type or one that clashes.
        """
        out = {}
        for key, value in mapping.items():
            given = int(key) if isinstance(key, np.integer) else key
            if isinstance(given, bool) or not isinstance(given, int | str) or given == "":
                raise SchemaError.single(
                    field,
                    "agent ids that are non-empty strings or integers",
                    f"{type(key).__name__} {key!r}",
                )
            text = str(given)
            known = self._given.setdefault(text, given)
            if type(known) is not type(given):
                raise SchemaError.single(
                    field,
                    f"one agent per agent_id: {known!r} and {given!r} are both stored as '{text}'",
                    repr(given),
                )
            out[text] = value
        return out

    def decode(self, mapping: Mapping[str, Any]) -> dict[Any, Any]:
        return {self._given.get(key, key): value for key, value in mapping.items()}

"""The client's HTTP (pipeline/client/transport.py) against a real socket server that answers in
each of HTTP/1.1's framings (Content-Length, chunked with a trailer, close), and records what it was
sent: the prefix, the token, quoted paths, one connection kept alive, timeouts and retries."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from pipeline.client.transport import Http
from pipeline.errors import ConfigError, RequestRejected, ServerUnavailable

ANSWERS = {
    "/length": b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Rlpipe-Policy-Version: 3\r\n\r\n"
    b'{"a": true}',
    "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'4;ext=1\r\n{"b"\r\n6\r\n: [1]}\r\n0\r\nX-Trailer: 1\r\n\r\n',
    "/close": b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"c": 3}',
    "/busy": b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 45\r\n\r\n"
    b'{"error": {"status": 503, "message": "busy"}}',
    "/refused": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 45\r\n\r\n"
    b'{"error": {"status": 400, "message": "nope"}}',
}


@dataclass
class Seen:
    """What the stub server was sent: request heads (lowercased header names) and bodies."""

    paths: list[str] = field(default_factory=list)
    heads: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0


@contextmanager
def _server(silent: bool = False) -> Iterator[tuple[str, Seen]]:
    """Answers each request from ANSWERS by the path's last part (``/length`` when unknown);
    keeps the connection unless told. ``silent``: reads requests and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = Seen()

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            seen.connections += 1
            threading.Thread(target=_answer, args=(connection, seen, silent), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        listener.close()


def _answer(connection: socket.socket, seen: Seen, silent: bool) -> None:
    with connection, connection.makefile("rb") as reader:
        while request_line := reader.readline():
            path = request_line.decode().split(" ")[1]
            head = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                head[name.strip().lower()] = value.strip()
            seen.paths.append(path)
            seen.heads.append(head)
            seen.bodies.append(reader.read(int(head.get("content-length", 0))))
            if silent:
                continue
            name = "/" + path.split("?")[0].rsplit("/", 1)[1]
            connection.sendall(ANSWERS.get(name, ANSWERS["/length"]))
            if name == "/close":
                return


def test_every_framing_is_read_and_keep_alive_is_kept_where_offered() -> None:
    with _server() as (url, seen):
        http = Http(url, None, 5.0, None)
        first = http.call("GET", "/length")
        assert first.json() == {"a": True}
        assert first.headers["x-rlpipe-policy-version"] == "3"
        assert http.call("GET", "/chunked").json() == {"b": [1]}
        assert http.call("GET", "/close").json() == {"c": 3}
        assert http.call("GET", "/length").json() == {"a": True}  # on a new connection
        with pytest.raises(ServerUnavailable, match="busy") as caught:
            http.call("GET", "/busy", patience_s=0)
        assert caught.value.retry_after == 7.0
        with pytest.raises(RequestRejected, match="nope") as refused:
            http.call("GET", "/refused")
        assert refused.value.status == 400
        http.close()
        http.call("GET", "/length")  # close() leaves the client usable, on a new connection
    assert seen.paths == [
        "/length",
        "/chunked",
        "/close",
        "/length",
        "/busy",
        "/refused",
        "/length",
    ]
    assert seen.connections == 3


def _calls(http: Http) -> None:
    http.call("POST", "/v1/episodes/a%2Fb%20c/actions", json={"observation": [1.5]})
    http.call("GET", "/v1/weights", params={"version": 2})
    http.call("POST", "/v1/uploads", data=b"\x00\x01", headers={"X-Rlpipe-Table": "steps"})


def test_requests_carry_the_prefix_the_token_and_quoted_paths_as_given() -> None:
    with _server() as (url, seen):
        _calls(Http(url + "/base/", None, 5.0, "secret"))
    assert seen.paths == [
        "/base/v1/episodes/a%2Fb%20c/actions",
        "/base/v1/weights?version=2",
        "/base/v1/uploads",
    ]
    assert {head["authorization"] for head in seen.heads} == {"Bearer secret"}
    assert seen.heads[0]["content-type"] == "application/json"
    assert seen.heads[2]["x-rlpipe-table"] == "steps"
    assert seen.bodies == [b'{"observation":[1.5]}', b"", b"\x00\x01"]
    assert seen.connections == 1  # one kept-alive connection for all three


def test_a_session_passed_in_sends_every_request() -> None:
    session = requests.Session()
    sent: list[str] = []
    session.hooks["response"].append(lambda answer, **_: sent.append(answer.request.url))
    session.headers["X-Proxy-Tag"] = "mine"
    with _server() as (url, seen):
        _calls(Http(url + "/base", session, 5.0, "secret"))
    assert sent == [url + path for path in seen.paths]
    assert seen.paths[0] == "/base/v1/episodes/a%2Fb%20c/actions"
    assert {head["x-proxy-tag"] for head in seen.heads} == {"mine"}
    assert {head["authorization"] for head in seen.heads} == {"Bearer secret"}


@pytest.mark.parametrize("session", [None, requests.Session()], ids=["pool", "session"])
def test_a_silent_server_times_out_after_the_patience(session: Any) -> None:
    with _server(silent=True) as (url, seen):
        http = Http(url, session, 0.3, None)
        started = time.monotonic()
        with pytest.raises(ServerUnavailable) as caught:
            http.call("POST", "/v1/actions", json={})
        elapsed = time.monotonic() - started
    assert caught.value.status is None
    assert 0.3 <= elapsed < 3.0
    assert len(seen.paths) >= 1


def test_no_answer_is_retried_until_the_server_comes_up() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free once closed: nobody listens there yet
    listening = threading.Event()

    def late_server() -> None:
        time.sleep(0.4)
        with socket.create_server(("127.0.0.1", port)) as listener:
            listening.set()
            connection, _ = listener.accept()
            _answer(connection, Seen(), silent=False)

    thread = threading.Thread(target=late_server, daemon=True)
    thread.start()
    http = Http(f"127.0.0.1:{port}", None, 0.5, None)
    assert http.call("GET", "/length", patience_s=10).json() == {"a": True}
    assert listening.is_set()
    http.close()
    thread.join(5)


def test_a_token_that_cannot_be_a_header_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as caught:
        Http("127.0.0.1:1", None, 1.0, "se\r\ncret")
    assert str(caught.value) == (
        "PolicyClient.token: expected a token without line breaks, got '<hidden>'"
    )


def test_a_large_body_arrives_whole_and_a_header_with_a_line_break_sends_nothing() -> None:
    body = bytes(range(256)) * 1024  # 256 KiB: written after the head, not joined to it
    with _server() as (url, seen):
        http = Http(url, None, 5.0, None)
        assert http.call("POST", "/v1/uploads", data=body).json() == {"a": True}
        with pytest.raises(ValueError, match="control byte"):
            http.call("POST", "/v1/uploads", data=b"x", headers={"X-Rlpipe-Table": "a\r\nB: c"})
        http.call("GET", "/length")
    assert seen.bodies == [body, b""]
    assert seen.paths == ["/v1/uploads", "/length"]

"""The client's HTTP response reader (pipeline/client/transport.py) against a real socket server
that answers in each of HTTP/1.1's framings: Content-Length, chunked (with a trailer), and close."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pipeline.client.transport import Http
from pipeline.errors import ServerUnavailable

ANSWERS = {
    "/length": b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Rlpipe-Policy-Version: 3\r\n\r\n"
    b'{"a": true}',
    "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'4;ext=1\r\n{"b"\r\n6\r\n: [1]}\r\n0\r\nX-Trailer: 1\r\n\r\n',
    "/close": b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"c": 3}',
    "/busy": b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 45\r\n\r\n"
    b'{"error": {"status": 503, "message": "busy"}}',
}


@contextmanager
def _server() -> Iterator[tuple[str, list[str]]]:
    """Answers each request line's path from ANSWERS; keeps the connection unless told."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                buffer = b""
                while True:
                    while b"\r\n\r\n" not in buffer:
                        chunk = connection.recv(4096)
                        if not chunk:
                            break
                        buffer += chunk
                    if b"\r\n\r\n" not in buffer:
                        break
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    path = head.split(b" ")[1].decode()
                    seen.append(path)
                    connection.sendall(ANSWERS[path])
                    if path == "/close":
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        listener.close()


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
        http.close()
    assert seen == ["/length", "/chunked", "/close", "/length", "/busy"]

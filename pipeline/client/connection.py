"""One keep-alive HTTP/1.1 connection of the client: a request written in one piece, its answer
parsed by httptools (llhttp, the parser of Node.js), over plain TCP or TLS.

A step of remote inference is one small exchange on a machine the simulator shares, so its cost
is the client's: ``http.client`` spent about 200 us of CPU on each (its header parser is the
``email`` package's), this about 50 (``bench/serve.py`` figures in the commit that made it).
Framing and parsing are llhttp's; this module only moves bytes and keeps the connection.
"""

from __future__ import annotations

import json as _json
import re
import socket
import ssl
from typing import Any

import httptools
from requests.structures import CaseInsensitiveDict

_READ = 65536  # bytes asked of the socket at a time
_JOINED = 65536  # a body up to this size leaves in the same write (segment) as the head
_UNSAFE_TARGET = re.compile(r"[\x00-\x20\x7f]")  # http.client's test: no spaces or controls


class Reply:
    """An answer: the parts of ``requests.Response`` the client reads, whichever sent it."""

    def __init__(self, status_code: int, headers: Any, content: bytes, reason: str) -> None:
        self.status_code = status_code
        self._headers = headers  # requests' (case-insensitive), or ours: lowercase -> (name, value)
        self.content = content
        self.reason = reason

    @property
    def headers(self) -> Any:
        """The answer's fields, case-insensitive (CaseInsensitiveDict), made when first read: a
        step's answer is read for its body alone."""
        if isinstance(self._headers, dict):
            self._headers = CaseInsensitiveDict(dict(self._headers.values()))
        return self._headers

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return _json.loads(self.content)


class Disconnected(ConnectionError):
    """The server closed the connection before any byte of an answer: what a request on a
    keep-alive connection the server has since closed meets."""


class BadAnswer(Exception):
    """Bytes that are not an HTTP/1.1 answer, or one cut off; ``start`` is what came first
    (a TLS alert, when a TLS server was spoken to in plain HTTP)."""

    def __init__(self, message: str, start: bytes) -> None:
        super().__init__(message)
        self.start = start


class Connection:
    """A connection to ``host:port``, opened on first use and after the server closed it;
    ``tls`` wraps it, checking the certificate against ``host``. ``timeout`` bounds connecting
    and every wait for the server's bytes."""

    def __init__(
        self, host: str, port: int, authority: str, timeout: float, tls: ssl.SSLContext | None
    ) -> None:
        self.host, self.port, self.timeout, self.tls = host, port, timeout, tls
        self._host = f"Host: {authority}\r\n"
        self.sock: socket.socket | None = None
        self._answer = _Answer()  # with its parser, for the connection's every answer

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def exchange(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str]
    ) -> Reply:
        """One request and its whole answer; the connection is kept where the answer allows.

        Raises:
            OSError: connecting, sending or receiving failed (:class:`Disconnected` included).
            BadAnswer: the bytes that came back are not an answer.
            ValueError: a header or the target holds a line break or a control character.
        """
        head = self._head(method, target, body, headers)
        sock = self.sock or self._open()
        try:
            if body and len(body) <= _JOINED:
                sock.sendall(head + body)
            else:
                sock.sendall(head)
                if body:
                    sock.sendall(body)
            reply, keep = _read(sock, self._answer)
        except BaseException:
            self.close()  # half an exchange leaves the connection out of step
            raise
        if not keep:
            self.close()
        return reply

    def _open(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock, self._answer = sock, _Answer()  # a new connection, a new parser
        return sock

    def _head(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> bytes:
        lines = [f"{method} {target} HTTP/1.1\r\n", self._host, "Accept-Encoding: identity\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        text = "".join(lines)
        broken = text.count("\n") != len(lines) or text.count("\r") != len(lines)
        if broken or "\0" in text or _UNSAFE_TARGET.search(target):
            raise ValueError(f"{method} {target!r}: a header or the target holds a control byte")
        return (text + "\r\n").encode("latin-1")


class _Answer:
    """httptools' callbacks: the parts of one answer as they are parsed, by the parser of the
    connection, which llhttp resets for each answer of a keep-alive connection."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.next()

    def next(self) -> None:
        """Ready for the connection's next answer."""
        self.reason = ""
        self.fields: dict[str, tuple[str, str]] = {}  # lowercased name: (name, value)
        self.body: list[bytes] = []
        self.head_done = False
        self.complete = False
        self.keep = False  # the connection may carry another exchange

    @property
    def framed(self) -> bool:
        """A length or chunks frame the body, not "until the connection closes"."""
        return "content-length" in self.fields or "transfer-encoding" in self.fields

    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        lower = key.lower()
        if lower in self.fields:  # a repeated field: one value, comma-separated (RFC 9110)
            text = f"{self.fields[lower][1]}, {text}"
        self.fields[lower] = (key, text)

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep = self.parser.should_keep_alive()  # not after


def _read(sock: socket.socket, answer: _Answer) -> tuple[Reply, bool]:
    """The answer on ``sock``, parsed into ``answer`` (its connection's), and whether the
    connection may carry another exchange."""
    answer.next()
    parser = answer.parser
    start = b""
    while not answer.complete:
        data = sock.recv(_READ)
        if not data:
            if not start:
                raise Disconnected("the server closed the connection without answering")
            if answer.head_done and not answer.framed:
                break  # the body ran until the connection closed
            raise BadAnswer("the connection closed in the middle of the answer", start)
        start = start or data[:16]
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as error:
            raise BadAnswer(f"not an HTTP answer ({error})", start) from None
    reply = Reply(parser.get_status_code(), answer.fields, b"".join(answer.body), answer.reason)
    return reply, answer.keep

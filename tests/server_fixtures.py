"""A real policy server on 127.0.0.1 for the server and client tests, in a thread or a process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import gymnasium as gym
import numpy as np
import requests
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.serving import make_server

from pipeline.policy.checkpoint import Checkpoint, ModelSpec, save_checkpoint
from server.app import create_app
from server.config import ServerConfig
from server.service import Service

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
# whether a started server answers yet, as every benchmark waits for one
from common import answers as answers  # noqa: E402

# a pid and its descendants, as the soak finds the server's processes
from soak import process_tree as process_tree  # noqa: E402


@dataclass
class Running:
    url: str
    app: Flask

    @property
    def service(self) -> Service:
        service: Service = self.app.extensions["rlpipe"]
        return service


def cartpole_config(data: Path, **overrides: Any) -> ServerConfig:
    return env_config(data, "CartPole-v1", **overrides)


def env_config(data: Path, env_id: str, **overrides: Any) -> ServerConfig:
    """A server for a registered gymnasium env's spaces."""
    env = gym.make(env_id)
    config = ServerConfig(
        data=data,
        observation_space=env.observation_space,
        action_space=env.action_space,
        env_id=env_id,
        **overrides,
    )
    env.close()
    return config


def container_spaces() -> tuple[gym.Space[Any], gym.Space[Any]]:
    """A Dict observation and a Tuple action (MultiDiscrete and float64 Box): the layouts a
    JSON body and an answer nest (a Tuple's value is a list, a Dict's an object)."""
    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1, 1, (3,), np.float32),
            "mode": gym.spaces.Discrete(3),
            "flags": gym.spaces.MultiBinary(4),
        }
    )
    action_space = gym.spaces.Tuple(
        (gym.spaces.MultiDiscrete([3, 5]), gym.spaces.Box(-2, 2, (2,), np.float64))
    )
    return observation_space, action_space


@contextmanager
def running_server(config: ServerConfig) -> Iterator[Running]:
    """The app on an OS-picked port, served by werkzeug's threaded server in a thread."""
    app = create_app(config)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Running(f"http://127.0.0.1:{server.server_port}", app)
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
        app.extensions["rlpipe"].close()


def metric(text: str, sample: str, **labels: str) -> float | None:
    """One sample of a ``/v1/metrics`` answer, read by prometheus_client's own parser (None when
    the server has not exposed it)."""
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == sample and found.labels == labels:
                return float(found.value)
    return None


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    """Until ``condition()`` holds, looking every 50 ms; fails naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_SERVER_LOGS: dict[int, IO[bytes]] = {}  # a served process's pid -> its stderr, in a file


def start_serve_process(
    data: Path | str,
    port: int,
    *extra: str,
    env_id: str | None = "CartPole-v1",
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``rlpipe serve`` (granian) as a subprocess, returned once it answers health; ``env`` is
    added to its environment. Its stderr goes to a file (:func:`server_log` reads it): a pipe
    nobody reads fills up, and a server that logs much then blocks on it."""
    source = ["--env", env_id] if env_id is not None else []
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by kill)
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", "--data", str(data), *source,
         "--port", str(port), *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
        env={**os.environ, "PYTHONWARNINGS": "error", **(env or {})},
    )  # fmt: skip
    _SERVER_LOGS[process.pid] = log
    if answers(f"http://127.0.0.1:{port}/v1/health", process, 30.0):
        return process
    kill(process)
    raise RuntimeError(f"rlpipe serve did not start: {server_log(process)[-2000:]}")


def server_log(process: subprocess.Popen[bytes]) -> str:
    """What a process of :func:`start_serve_process` wrote to stderr so far."""
    log = _SERVER_LOGS.get(process.pid)
    if log is None or log.closed:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace")


def kill(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal a process and wait for it; a served one's stderr file is closed."""
    process.send_signal(sig)
    process.wait(timeout=20)
    if process.stderr is not None:
        process.stderr.close()
    log = _SERVER_LOGS.pop(process.pid, None)
    if log is not None:
        log.close()


def cartpole_checkpoint(directory: Path, version: int, seed: int = 0) -> Path:
    """A small random CartPole policy (one hidden layer of 8) saved as ``version``."""
    env = gym.make("CartPole-v1")
    spec = ModelSpec(env.observation_space, env.action_space, hidden=(8,))
    rng = np.random.default_rng(seed)
    weights = {
        "pi.0.weight": rng.standard_normal((8, 4)).astype(np.float32),
        "pi.0.bias": np.zeros(8, np.float32),
        "pi.1.weight": rng.standard_normal((2, 8)).astype(np.float32),
        "pi.1.bias": np.zeros(2, np.float32),
    }
    return save_checkpoint(directory, Checkpoint(version, spec, weights))


@contextmanager
def lossy_proxy(target: str, drop: Callable[[str, bytes], bool]) -> Iterator[str]:
    """An HTTP proxy on loopback in front of ``target`` that forwards every request and loses the
    answers ``drop(path, body)`` picks: the server did the work, the client never hears of it
    and sees its connection closed (what a retry after a timeout or a broken link sees)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_forward, args=(connection, target, drop), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


def _forward(connection: socket.socket, target: str, drop: Callable[[str, bytes], bool]) -> None:
    """Requests of one keep-alive connection, forwarded one at a time."""
    with connection, connection.makefile("rb") as reader:
        while request_line := reader.readline():
            method, path, _ = request_line.decode().split(" ", 2)
            headers = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, value = line.decode().split(":", 1)
                headers[name.strip().lower()] = value.strip()
            body = reader.read(int(headers.get("content-length", 0)))
            sent = {k: v for k, v in headers.items() if k not in ("host", "connection")}
            answer = requests.request(method, target + path, data=body, headers=sent, timeout=30)
            if drop(path, body):
                return  # served, and the answer lost
            head = (f"HTTP/1.1 {answer.status_code} {answer.reason}\r\n"
                    f"Content-Type: {answer.headers.get('Content-Type', 'text/plain')}\r\n"
                    f"Content-Length: {len(answer.content)}\r\n\r\n")  # fmt: skip
            connection.sendall(head.encode() + answer.content)

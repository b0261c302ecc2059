"""A real policy server on 127.0.0.1 for the server and client tests, in a thread or a process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import requests
from flask import Flask
from werkzeug.serving import make_server

from pipeline.policy import Checkpoint, ModelSpec, save_checkpoint
from server.app import create_app
from server.config import ServerConfig
from server.service import Service

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Running:
    url: str
    app: Flask

    @property
    def service(self) -> Service:
        service: Service = self.app.extensions["rlpipe"]
        return service


def cartpole_config(data: Path, **overrides: Any) -> ServerConfig:
    env = gym.make("CartPole-v1")
    config = ServerConfig(
        data=data,
        observation_space=env.observation_space,
        action_space=env.action_space,
        env_id="CartPole-v1",
        **overrides,
    )
    env.close()
    return config


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_serve_process(
    data: Path, port: int, *extra: str, env_id: str | None = "CartPole-v1"
) -> subprocess.Popen[bytes]:
    """``rlpipe serve`` (granian) as a subprocess, returned once it answers health."""
    source = ["--env", env_id] if env_id is not None else []
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "serve", "--data", str(data), *source,
         "--port", str(port), *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).ok:
                return process
        except requests.ConnectionError:
            time.sleep(0.1)
        if process.poll() is not None:
            break
    process.kill()
    _, err = process.communicate()
    raise RuntimeError(f"rlpipe serve did not start: {err.decode()[-2000:]}")


def kill(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    process.send_signal(sig)
    process.wait(timeout=20)
    if process.stderr is not None:
        process.stderr.close()


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

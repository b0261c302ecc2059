"""server.process: a real ``rlpipe serve`` child on an OS-picked port, and its failure message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from server_fixtures import wait_for

from server import process

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def test_start_returns_a_listening_server_and_its_address(tmp_path: Path) -> None:
    server, address = process.start(["--data", str(tmp_path / "ds"), "--env", "CartPole-v1"],
                                     env=ENV, cwd=ROOT)  # fmt: skip
    try:
        assert address.startswith("http://127.0.0.1:") and not address.endswith(":0")
        assert requests.get(f"{address}/v1/health", timeout=5).json()["status"] == "ok"
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
    assert (tmp_path / "ds" / "manifest.json").exists()


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    refused = r"(?s)exited \(2\) before listening: .*--env.*NoSuchEnv-v0"
    with pytest.raises(RuntimeError, match=refused):
        process.start(["--data", str(tmp_path / "ds"), "--env", "NoSuchEnv-v0"], env=ENV, cwd=ROOT)
    assert not (tmp_path / "ds").exists()  # nothing written


def test_a_second_server_on_a_taken_port_is_refused(tmp_path: Path) -> None:
    server, address = process.start(["--data", str(tmp_path / "a"), "--env", "CartPole-v1"],
                                     env=ENV, cwd=ROOT)  # fmt: skip
    try:
        port = address.rpartition(":")[2]
        second = subprocess.run(
            [sys.executable, "-m", "pipeline", "serve", "--data", str(tmp_path / "b"),
             "--env", "CartPole-v1", "--port", port],
            env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 2
        assert second.stderr == (
            "rlpipe serve: serve.--host/--port: expected an address of this machine and a port "
            f"nothing listens on, got '127.0.0.1:{port} (Address already in use)'\n"
        )
        assert requests.get(f"{address}/v1/health", timeout=5).ok  # the first still serves
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


def test_kill_9_of_the_server_stops_its_worker(tmp_path: Path) -> None:
    """Granian serves from a worker process: it must not outlive a killed ``rlpipe serve``."""
    server, address = process.start(["--data", str(tmp_path / "ds"), "--env", "CartPole-v1"],
                                     env=ENV, cwd=ROOT)  # fmt: skip
    workers = [int(pid) for pid in subprocess.check_output(
        ["pgrep", "-P", str(server.pid)], text=True).split()]  # fmt: skip
    assert workers
    server.kill()
    server.wait(timeout=30)
    wait_for(lambda: not any(_alive(pid) for pid in workers), 10, "the workers to exit")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{address}/v1/health", timeout=5)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has died; only its exit status is left

"""server.process: a real ``rlpipe serve`` child on an OS-picked port, and its failure message."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import requests

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

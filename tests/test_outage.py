"""An outage of the server under a local-inference client playing at full speed: every step is
stored exactly once afterwards, and ``close()`` says so within a stated bound."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import gymnasium as gym
import pyarrow.compute as pc
import pyarrow.dataset as ds
from server_fixtures import free_port, kill, start_serve_process

from pipeline.client import PolicyClient
from pipeline.client.spool import BATCH_BYTES

OUTAGE_S = 10.0
CLOSE_BOUND_S = 30.0  # docs/guarantees.md: what close() needs after an outage
BODY_LIMIT = 256 * 1024  # far under the client's batch bound: every batch after the outage splits


def _play(client: PolicyClient, stop: threading.Event, played: list[int]) -> None:
    env = gym.make("CartPole-v1")
    while not stop.is_set():
        episode_id = client.start_episode()
        observation, _ = env.reset()
        while True:
            action = client.get_action(episode_id, observation)
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            played[0] += 1
            if terminated or truncated or stop.is_set():
                client.end_episode(episode_id, observation)
                break


def _watch(spool: Path, seconds: float) -> list[int]:
    """The sizes of the batches seen in the spool while the server is away (the upload thread
    may still be waiting out a send when the outage begins, so files come when they come)."""
    sizes: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for path in spool.glob("*.arrows"):
            with contextlib.suppress(FileNotFoundError):
                sizes.append(path.stat().st_size)
        time.sleep(0.5)
    return sizes


def test_an_outage_at_full_speed_is_delivered_once_afterwards(tmp_path: Path) -> None:
    port, data, spool = free_port(), tmp_path / "data", tmp_path / "spool"
    limit = ("--max-body-bytes", str(BODY_LIMIT))
    server = start_serve_process(data, port, *limit)
    client = PolicyClient(f"127.0.0.1:{port}", "local", update_interval=None, spool_dir=spool)
    stop, played = threading.Event(), [0]
    player = threading.Thread(target=_play, args=(client, stop, played))
    player.start()
    try:
        time.sleep(1.0)
        kill(server)
        spooled = _watch(spool, OUTAGE_S)
        server = start_serve_process(data, port, *limit)
        time.sleep(2.0)
    finally:
        stop.set()
        player.join()
    started = time.monotonic()
    delivered = client.close(CLOSE_BOUND_S)
    took = time.monotonic() - started
    kill(server, 15)
    assert delivered, f"close() gave up after {took:.1f} s: {client.spool_dir} kept"
    assert max(spooled, default=0) <= 1.1 * BATCH_BYTES, "batches are not bounded"
    steps = ds.dataset(data / "steps", format="parquet").to_table(
        columns=["episode_id", "agent_id", "t"]
    )
    keys = pc.binary_join_element_wise(
        steps["episode_id"], steps["agent_id"], pc.cast(steps["t"], "string"), "/"
    )
    assert len(pc.unique(keys)) == steps.num_rows, "a step was stored twice"
    assert steps.num_rows == played[0], (steps.num_rows, played[0])

"""Camera-sized observations (84x84x3 uint8 frames) through both modes: every step delivered
once, and no buffer, batch, log segment or row group larger than its bound (issue 23)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import orjson
import pandas as pd
import pyarrow.parquet as pq
import pytest
from server_fixtures import free_port, kill, running_server, start_serve_process

from pipeline import InputReader, WriterConfig
from pipeline.client import PolicyClient
from pipeline.client import binary as client_binary
from pipeline.commands import cli
from pipeline.dataset import discovery
from pipeline.dataset.location import locate
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.recording.episode import AgentState, Episode, Pending
from server import records
from server.config import ServerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import pixel_cartpole

FRAME = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
ACTIONS = gym.spaces.Discrete(3)
FRAME_BYTES = 84 * 84 * 3


def _frames(n: int, seed: int = 0) -> np.ndarray:
    """Random frames: incompressible, the worst case for every byte bound."""
    return np.random.default_rng(seed).integers(0, 256, (n, *FRAME.shape), np.uint8)


def _config(data: Path, **writer: int) -> ServerConfig:
    return ServerConfig(
        data=data,
        observation_space=FRAME,
        action_space=ACTIONS,
        writer=WriterConfig(sync="background", **writer),
    )


def test_a_local_client_playing_frames_at_full_speed_delivers_every_step_once(
    tmp_path: Path,
) -> None:
    """The bar of issue 23, shortened: 6 s of frames at full speed (the benchmark plays 30 s).
    The upload knobs would let rows pile up (a million rows, a minute), so only the byte bounds
    keep the client's buffer small; the server's log segments (8 MiB) and row groups (1 MiB)
    are lowered so that many of each are crossed."""
    data, frames = tmp_path / "ds", _frames(64)
    row_group_bytes = 2**20
    with running_server(_config(data, max_bytes=8 * 2**20, row_group_bytes=row_group_bytes)) as s:
        client = PolicyClient(
            s.url, spool_dir=tmp_path / "spool", upload_rows=10**6, upload_interval_s=60, seed=0
        )
        rows = client._local.rows  # type: ignore[union-attr]
        steps, most_waiting = 0, 0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            episode = client.start_episode()
            for t in range(100):
                client.get_action(episode, frames[(steps + t) % 64])
                client.log_returns(episode, 1.0)
                most_waiting = max(most_waiting, rows.ready)
            steps += 100
            client.end_episode(episode, frames[steps % 64], truncated=True)
        assert client.close(60)
    assert most_waiting <= 800  # 32 MiB of 42 KB rows (and a few summaries), never all of them
    stored = pd.read_parquet(data / "steps", columns=["episode_id", "t"])
    assert len(stored) == steps > 1000
    assert not stored.duplicated().any()
    shards = discovery.list_shards(locate(data))  # not the Delta log's checkpoints
    assert len(shards) > 1  # segments rolled by bytes
    for shard in shards:
        metadata = pq.ParquetFile(shard).metadata
        for group in range(metadata.num_row_groups):  # 2 frames a row: ~42 KB
            assert metadata.row_group(group).num_rows <= row_group_bytes // (2 * FRAME_BYTES)


def test_remote_frames_travel_as_arrow_and_store_the_frames_sent(tmp_path: Path) -> None:
    """A remote client sends an 84x84x3 frame as Arrow (its bytes, not 21,168 JSON numbers),
    one episode and a batch of several; the stored observations are the frames, bit for bit."""
    data, frames = tmp_path / "ds", _frames(8, seed=1)
    assert frames[0].nbytes >= client_binary.BINARY_MIN_BYTES
    with running_server(_config(data)) as server:
        client = PolicyClient(server.url, inference_mode="remote")
        episode = client.start_episode(episode_id="one")
        for t in range(3):
            assert client.get_action(episode, frames[t]) in range(3)
            client.log_returns(episode, 1.0)
        client.log_action(episode, frames[3], 2)
        client.end_episode(episode, frames[4])
        ids = ["v0", "v1", "v2"]
        assert len(client.step_many(ids, frames[:3], starts=[{}] * 3)) == 3
        assert client.step_many(ids, frames[3:6], terminated=[True] * 3) == [None] * 3
        assert client.close()
    batch = InputReader(data, batch_size=100, columns=_COLUMNS).next()
    order = np.lexsort((batch.ts, batch.episode_ids))
    ids_of, ts, observations, following = (
        batch.episode_ids[order],
        batch.ts[order],
        batch.observations[order],
        batch.next_observations[order],
    )
    one = np.flatnonzero(ids_of == "one")
    assert ts[one].tolist() == [0, 1, 2, 3]
    for t, row in enumerate(one):
        assert np.array_equal(observations[row], frames[t])
        assert np.array_equal(following[row], frames[t + 1])
    vector = np.flatnonzero(np.isin(ids_of, ids))
    assert [np.array_equal(observations[row], frames[i]) for i, row in enumerate(vector)] == [
        True
    ] * 3
    stored = pd.read_parquet(data / "steps")
    assert stored["observation"].map(len).eq(FRAME_BYTES).all()  # raw bytes, one value a row
    # each frame once: only each episode's last row carries its next observation
    assert stored["next_observation"].notna().sum() == 4


_COLUMNS = ("episode_id", "t", "observation", "next_observation")


def test_a_snapshot_keeps_a_pending_frame_as_its_bytes_and_gives_it_back() -> None:
    """The journal's snapshot of open episodes holds a pending frame as its bytes (base64), not
    21,168 JSON numbers: 128 open episodes of frames made a snapshot past the journal's 4 MiB,
    and every record after it rolled the journal again."""
    frame = _frames(1, seed=2)[0]
    episode = Episode("e", "c", True, None, None, None)
    episode.agents["agent_0"] = AgentState(t=3, pending=Pending(frame, 1, -0.5, 7))
    line = records.dumps({"k": "snapshot", "episodes": [records.episode_doc(episode)]})
    assert len(line) < 1.5 * FRAME_BYTES  # base64: 4/3 of the frame, and the rest
    back = records.episode_of(orjson.loads(line)["episodes"][0], FRAME)
    pending = back.agents["agent_0"].pending
    assert pending is not None and np.array_equal(pending.observation, frame)
    assert pending.observation.dtype == np.uint8
    assert (pending.action, pending.action_logp, pending.policy_version) == (1, -0.5, 7)


def test_pixel_cartpole_goes_through_serve_both_clients_train_replay_and_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23, point 4: CartPole as 84x84x3 frames (examples/pixel_cartpole.py) through
    ``rlpipe serve``, a remote and a local client, ``rlpipe train bc`` (its policy a CNN, which
    clients run in numpy: tests/test_encoder.py), ``rlpipe replay`` (frames re-rendered bit for
    bit) and ``rlpipe inspect``."""
    data, run, port = tmp_path / "ds", tmp_path / "run", free_port()
    server = start_serve_process(data, port, env_id=pixel_cartpole.ENV_REF)
    try:
        assert pixel_cartpole.play(port, "remote", episodes=1, seed=0)
        assert pixel_cartpole.play(port, "local", episodes=1, seed=1)
    finally:
        kill(server, signal.SIGTERM)  # a clean stop commits every row
    train = ["train", "bc", "--data", str(data), "--run-dir", str(run), "--max-updates", "3",
             "--eval-episodes", "1", "--batch-size", "16"]  # fmt: skip
    assert cli.main(train) == 0
    checkpoint = load_checkpoint(latest_checkpoint(run / "checkpoints"))
    assert checkpoint.spec.encoder == "cnn"
    episodes = pd.read_parquet(data / "episodes")
    assert len(episodes) == 2
    capsys.readouterr()
    for episode_id in episodes["episode_id"]:
        assert cli.main(["replay", str(data), "--episode", episode_id, "--json"]) == 0
        replayed = orjson.loads(capsys.readouterr().out)
        assert replayed["divergence"] is None and replayed["replayed_steps"] > 0
    assert cli.main(["inspect", str(data)]) == 0
    report = capsys.readouterr().out
    assert "Box(0, 255, (84, 84, 3), uint8)" in report and "2 complete" in report

"""PolicyClient against a real server on loopback, with real CartPole and a multi-agent env."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import play_client
from server_fixtures import cartpole_config, free_port, kill, running_server, start_serve_process
from stored import read_steps

from pipeline.client import (
    EpisodeError,
    PolicyClient,
    RequestRejected,
    ServerUnavailable,
    Unauthorized,
    base_url,
)
from pipeline.errors import SchemaError
from pipeline.format.codec import to_arrow_rows
from server.config import ServerConfig


def _read(data: Path, table: str = "steps") -> pd.DataFrame:
    return read_steps(data) if table == "steps" else pd.read_parquet(data / table)


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_cartpole_episodes_land_once_each_step(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode=mode, spool_dir=tmp_path / "spool")
        lengths = play_client(client, 3, seed=7)
        assert client.close()
    steps, episodes = _read(data), _read(data, "episodes")
    assert len(steps) == sum(lengths)
    assert steps.groupby("episode_id").size().sort_values().tolist() == sorted(lengths)
    assert steps["reward"].tolist() == [1.0] * sum(lengths)
    assert sorted(episodes["length"]) == sorted(lengths)
    assert sorted(episodes["seed"]) == [7, 8, 9]
    assert episodes["end_reason"].tolist() == ["terminated"] * 3
    for _, episode in steps.groupby("episode_id"):
        episode = episode.sort_values("t")
        assert episode["t"].tolist() == list(range(len(episode)))
        assert episode["terminated"].tolist() == [False] * (len(episode) - 1) + [True]
        observation = np.stack(episode["observation"].to_numpy())
        next_observation = np.stack(episode["next_observation"].to_numpy())
        np.testing.assert_array_equal(observation[1:], next_observation[:-1])


_ACTION_SPACES = {
    "tuple": gym.spaces.Tuple(
        (gym.spaces.MultiDiscrete([3, 5]), gym.spaces.Box(-2, 2, (2,), np.float64))
    ),
    "dict-of-tuple": gym.spaces.Dict(
        {"move": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.MultiBinary(2)))}
    ),
    "multi-discrete": gym.spaces.MultiDiscrete([2, 4]),
    "multi-binary": gym.spaces.MultiBinary(3),
    "box": gym.spaces.Box(-1, 1, (3,), np.float32),
}


@pytest.mark.parametrize("mode", ["remote", "local"])
@pytest.mark.parametrize("name", sorted(_ACTION_SPACES))
def test_a_random_action_comes_back_as_the_space_takes_it_and_is_stored(
    tmp_path: Path, mode: str, name: str
) -> None:
    """Without a policy the server acts at random. Its action must be one the space contains,
    in the form the env takes it in either mode, and the step it opens must complete: a Tuple's
    came back as an object keyed "0", "1", which the next call of the episode then refused."""
    space = _ACTION_SPACES[name]
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    config = ServerConfig(tmp_path / "ds", observation_space, space, None)
    with running_server(config) as server:
        client = PolicyClient(server.url, inference_mode=mode, spool_dir=tmp_path / "spool")
        episode_id = client.start_episode()
        observation = np.zeros(2, np.float32)
        actions = [client.get_action(episode_id, observation) for _ in range(2)]
        client.end_episode(episode_id, observation)
        assert client.close()
    sampled = space.sample()
    for action in actions:
        assert space.contains(action), action
        assert type(action) is type(sampled)
    stored = pq.read_table(tmp_path / "ds" / "steps", columns=["t", "action"]).sort_by("t")
    assert stored.column("action").to_pylist() == to_arrow_rows(space, actions).to_pylist()


def test_any_episode_id_travels_in_the_url_quoted(tmp_path: Path) -> None:
    """RLlib's ids travel in bodies, so any string works there; ours too, once quoted."""
    ids = ["run/1", "ep 1", "ep?x=1#y", "a/actions", "ü%2F", "x/../y", "/lead", "trail/"]
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode="remote")
        for episode_id in ids:
            assert client.start_episode(episode_id) == episode_id
            client.get_action(episode_id, np.zeros(4, np.float32))
            client.log_returns(episode_id, 1.0)
            client.end_episode(episode_id, np.ones(4, np.float32))
        for dots in (".", ".."):
            with pytest.raises(SchemaError, match=re.escape(
                "field 'episode_id': expected a non-empty string of at most 200 characters, not "
                f"'.' or '..', got '{dots}'")):  # fmt: skip
                client.start_episode(dots)
    steps = _read(data)
    assert sorted(steps["episode_id"]) == sorted(ids)
    assert steps["reward"].tolist() == [1.0] * len(ids)


@pytest.mark.parametrize("mode", ["remote", "local"])
@pytest.mark.parametrize(
    ("given", "field"),
    [({"episode_id": 123}, "episode_id"), ({"episode_id": ""}, "episode_id"),
     ({"episode_id": "x" * 201}, "episode_id"), ({"training_enabled": "yes"}, "training_enabled")],
)  # fmt: skip
def test_a_start_the_server_would_refuse_is_refused_at_the_call_in_both_modes(
    tmp_path: Path, mode: str, given: dict[str, Any], field: str
) -> None:
    """Local mode once took ``start_episode(123)`` and failed only when its rows were uploaded."""
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode=mode, spool_dir=tmp_path / "spool")
        with pytest.raises(SchemaError, match=f"field '{field}': expected"):
            client.start_episode(**given)
        play_client(client, 1, seed=0)
        assert client.close()
    assert len(_read(data, "episodes")) == 1  # the episode played after, and nothing else


def test_a_default_spool_is_removed_once_everything_is_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        client = PolicyClient(server.url)
        spool = client.spool_dir
        assert spool is not None and spool.is_dir()
        assert play_client(client, 1, seed=0)
        assert client.close() and not spool.exists()
        stranded = PolicyClient(server.url, timeout=0.5)
    episode_id = stranded.start_episode()
    stranded.get_action(episode_id, np.zeros(4, np.float32))
    stranded.end_episode(episode_id, np.zeros(4, np.float32))
    assert not stranded.close(timeout_s=0.5)  # the server is gone: the spool stays, named
    assert stranded.spool_dir is not None and any(stranded.spool_dir.iterdir())
    assert f"undelivered steps are kept in {stranded.spool_dir}" in caplog.text
    shutil.rmtree(stranded.spool_dir)


def test_address_forms() -> None:
    assert base_url("localhost:9900") == "http://localhost:9900"
    assert base_url("https://sim.example:443/") == "https://sim.example:443"


def test_import_pulls_in_neither_torch_nor_flask() -> None:
    code = "import sys, pipeline.client; print(sorted({'torch', 'flask'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class TwoWalkers:
    """A tiny multi-agent env: walkers 'a' and 'b' step left or right; 'b' stops after 3 steps,
    the episode after 5. Rewards 1.0 per step per walker."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self) -> dict[str, np.ndarray]:
        self.t = 0
        self.position = {"a": 0.0, "b": 0.0}
        return {k: self._observation(k) for k in self.position}

    def _observation(self, agent: str) -> np.ndarray:
        return np.array([self.position[agent], self.t], np.float32)

    def step(self, actions: dict[str, int]) -> tuple[dict[str, Any], dict[str, float],
                                                     dict[str, bool]]:  # fmt: skip
        self.t += 1
        for agent, action in actions.items():
            self.position[agent] += 1.0 if action else -1.0
        dones = {"b": self.t == 3} if "b" in actions else {}
        dones["a"] = self.t == 5
        dones["__all__"] = dones["a"]
        observations = {k: self._observation(k) for k in actions}
        return observations, {k: 1.0 for k in actions}, dones


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_multiagent_dicts_per_agent_rewards_and_done_dict(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "ds"
    env = TwoWalkers()
    config = ServerConfig(data=data, observation_space=env.observation_space,
                          action_space=env.action_space)  # fmt: skip
    with running_server(config) as server:
        client = PolicyClient(server.url, inference_mode=mode, spool_dir=tmp_path / "spool")
        episode_id = client.start_episode(episode_id="walk")
        observations = env.reset()
        while True:
            actions = client.get_action(episode_id, observations)
            assert set(actions) == {a for a in observations if a == "a" or env.t < 3}
            observations, rewards, dones = env.step(actions)
            client.log_returns(episode_id, rewards, multiagent_done_dict=dones)
            if dones["__all__"]:
                client.end_episode(episode_id, observations)
                break
        assert client.close()
    steps = read_steps(data).sort_values(["agent_id", "t"])
    by_agent = {agent: rows for agent, rows in steps.groupby("agent_id")}
    assert by_agent["a"]["t"].tolist() == [0, 1, 2, 3, 4]
    assert by_agent["b"]["t"].tolist() == [0, 1, 2]
    assert by_agent["a"]["terminated"].tolist() == [False] * 4 + [True]
    assert by_agent["b"]["terminated"].tolist() == [False, False, True]
    assert steps["reward"].tolist() == [1.0] * 8
    np.testing.assert_array_equal(np.stack(by_agent["b"]["next_observation"].to_numpy())[-1],
                                  [sum(by_agent["b"]["action"] * 2 - 1), 3])  # fmt: skip
    episodes = pd.read_parquet(data / "episodes").set_index("agent_id")
    assert episodes["length"].to_dict() == {"a": 5, "b": 3}
    assert episodes["return"].to_dict() == {"a": 5.0, "b": 3.0}


def test_server_down_client_spools_then_every_step_arrives_once(tmp_path: Path) -> None:
    data, port = tmp_path / "ds", free_port()
    process = start_serve_process(data, port)
    client = PolicyClient(f"127.0.0.1:{port}", spool_dir=tmp_path / "spool",
                          upload_interval_s=0.05, update_interval=None)  # fmt: skip
    try:
        lengths = play_client(client, 2, seed=1)
        assert client.flush(10)
        kill(process)
        started = time.monotonic()
        lengths += play_client(client, 3, seed=3)  # never blocks on the dead server
        assert time.monotonic() - started < 2
        time.sleep(0.2)
        assert list((tmp_path / "spool").glob("*.arrows"))  # waiting on disk
        assert not client.flush(0.3)
        process = start_serve_process(data, port)
        assert client.flush(15)
        assert client.close()
    finally:
        kill(process, 15)
    steps = read_steps(data)
    assert len(steps) == sum(lengths)
    assert not steps.duplicated(["episode_id", "agent_id", "t"]).any()
    assert sorted(pd.read_parquet(data / "episodes")["length"]) == sorted(lengths)
    assert not list((tmp_path / "spool").glob("*.arrows"))


def test_local_mode_pulls_weights_and_records_their_version(tmp_path: Path) -> None:
    from server_fixtures import cartpole_checkpoint

    data = tmp_path / "ds"
    cartpole_checkpoint(data / "checkpoints", 3)
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, spool_dir=tmp_path / "spool", update_interval=None)
        lengths = play_client(client, 1, seed=0)
        client.update_policy_weights()  # 304: unchanged
        assert client.close()
    steps = read_steps(data)
    assert len(steps) == lengths[0]
    assert set(steps["policy_version"]) == {3}
    assert (steps["action_logp"] < 0).all()


def test_failures_raise_typed_errors_with_status_and_message(tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds", token="t")) as server:
        with pytest.raises(Unauthorized) as denied:
            PolicyClient(server.url, inference_mode="remote").start_episode()
        assert denied.value.status == 401
        assert denied.value.message == "missing or wrong token: send 'Authorization: Bearer TOKEN'"
        client = PolicyClient(server.url, inference_mode="remote", token="t")
        episode_id = client.start_episode()
        with pytest.raises(RequestRejected, match=re.escape(
            "400: field 'observation': expected float32 of shape (4,) per row, got shape (2,)"
        )):  # fmt: skip
            client.get_action(episode_id, [0.0, 0.0])
        client.get_action(episode_id, np.zeros(4, np.float32))
        client.end_episode(episode_id, np.zeros(4, np.float32))
        with pytest.raises(EpisodeError) as ended:
            client.start_episode(episode_id)
        assert ended.value.status == 409
        assert ended.value.message == (
            f"episode '{episode_id}' has ended; call start_episode() for a new one"
        )
        local = PolicyClient(server.url, token="t", spool_dir=tmp_path / "spool")
        episode_id = local.start_episode()
        local.get_action(episode_id, np.zeros(4, np.float32))
        with pytest.raises(SchemaError, match=re.escape(
            "field 'reward': expected a finite number, got nan"
        )):  # fmt: skip
            local.log_returns(episode_id, float("nan"))
        with pytest.raises(EpisodeError, match="call start_episode"):
            local.get_action("nope", np.zeros(4, np.float32))
        local.close()
    with pytest.raises(ServerUnavailable) as down:
        PolicyClient(server.url, inference_mode="remote", timeout=0.3).start_episode()
    assert down.value.status is None


def test_client_honours_503_retry_after(tmp_path: Path) -> None:
    """A stand-in server (not rlpipe's) that is busy once, then answers."""
    import threading

    from flask import Flask, jsonify
    from werkzeug.serving import make_server

    stub = Flask("busy")
    calls: list[float] = []

    @stub.post("/v1/episodes")
    def start() -> Any:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return jsonify({"error": {"status": 503, "message": "busy"}}), 503, {
                "Retry-After": "0.3"}  # fmt: skip
        return jsonify({"episode_id": "x"}), 201

    server = make_server("127.0.0.1", 0, stub, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = PolicyClient(f"127.0.0.1:{server.server_port}", inference_mode="remote")
        assert client.start_episode(episode_id="x") == "x"
        assert len(calls) == 2 and calls[1] - calls[0] >= 0.3
        impatient = PolicyClient(f"127.0.0.1:{server.server_port}", inference_mode="remote",
                                 timeout=0.1)  # fmt: skip
        calls.clear()
        with pytest.raises(ServerUnavailable) as busy:
            impatient.start_episode()
        assert (busy.value.status, busy.value.message, busy.value.retry_after) == (503, "busy", 0.3)
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_seeds_up_to_2_64_are_stored_exactly_and_bad_ones_refused_at_the_start(
    tmp_path: Path, mode: str
) -> None:
    """A negative seed is refused when the episode starts (gymnasium's reset refuses it too),
    not when its summary is stored; a seed past 2**63 - 1 travels and is stored exactly."""
    from pipeline.format.seeds import from_storage

    data = tmp_path / "ds"
    env = gym.make("CartPole-v1")
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode=mode, spool_dir=tmp_path / "spool")
        with pytest.raises(SchemaError, match=re.escape("an integer seed in [0, 2**64) or null")):
            client.start_episode(seed=-1)
        episode_id = client.start_episode(seed=2**64 - 1)
        observation, _ = env.reset(seed=2**64 - 1)
        client.log_action(episode_id, observation, 0)
        observation, reward, *_ = env.step(0)
        client.log_returns(episode_id, float(reward))
        client.end_episode(episode_id, observation)
        assert client.close()
    (seed,) = _read(data, "episodes")["seed"].tolist()
    assert from_storage(int(seed)) == 2**64 - 1

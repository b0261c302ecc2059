"""The step rules of pipeline/recording/recorder.py (docs/protocol.md, "What a step row holds"),
each defect once found in one mode, checked in both against a real server."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests
from openapi_contract import check_answer
from server_fixtures import cartpole_config, running_server
from stored import read_steps

from pipeline.client import PolicyClient
from pipeline.errors import RequestRejected, SchemaError

MODES = ["remote", "local"]


def _obs(t: float, agent: float = 0.0) -> np.ndarray:
    return np.array([t, agent, 0.5, -0.5], np.float32)


def _read(data: Path, table: str) -> pd.DataFrame:
    return read_steps(data) if table == "steps" else pd.read_parquet(data / table)


@pytest.mark.parametrize("mode", MODES)
def test_integer_agent_ids_are_stored_as_text_and_answered_as_given(
    tmp_path: Path, mode: str
) -> None:
    """RLlib's RandomMultiAgentEnv keys agents 0, 1, ...: local mode once lost every step (and
    close() said True), remote mode answered the actions keyed "0", "1"."""
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, mode, spool_dir=tmp_path / "spool", seed=0)
        episode = client.start_episode("e")
        for t in range(3):
            actions = client.get_action(episode, {0: _obs(t, 0), 1: _obs(t, 1)})
            assert set(actions) == {0, 1}  # what env.step(actions) takes
            client.log_returns(episode, {0: 1.0, 1: 2.0})
        with pytest.raises(SchemaError, match=re.escape("0 and '0' are both stored as '0'")):
            client.get_action(episode, {"0": _obs(3, 0)})
        client.end_episode(episode, {0: _obs(3, 0), 1: _obs(3, 1)})
        assert client.close(10)
    steps = _read(data, "steps")
    assert sorted(steps["agent_id"].unique()) == ["0", "1"]
    assert steps.groupby("agent_id")["reward"].sum().to_dict() == {"0": 3.0, "1": 6.0}
    episodes = _read(data, "episodes").sort_values("agent_id")
    assert episodes["agent_id"].tolist() == ["0", "1"]
    assert episodes["end_reason"].tolist() == ["terminated", "terminated"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("agent_id", ["", 1.5, True, None])
def test_agent_ids_that_cannot_be_stored_are_refused_at_the_call(
    tmp_path: Path, mode: str, agent_id: object
) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        client = PolicyClient(server.url, mode, spool_dir=tmp_path / "spool", seed=0)
        episode = client.start_episode("e")
        with pytest.raises(SchemaError, match="field 'observations': expected agent ids that"):
            client.get_action(episode, {agent_id: _obs(0)})
        client.end_episode(episode, {"a": _obs(1)})
        assert client.close(10)


@pytest.mark.parametrize("mode", MODES)
def test_a_reward_before_the_first_action_belongs_to_no_transition(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, mode, spool_dir=tmp_path / "spool", seed=0)
        episode = client.start_episode("e")
        with caplog.at_level(logging.WARNING, "rlpipe.recorder"):
            client.log_returns(episode, 5.0)
            client.log_action(episode, _obs(0), 1)
        client.log_returns(episode, 1.0)
        client.end_episode(episode, _obs(1))
        assert client.close(10)
    assert _read(data, "steps")["reward"].tolist() == [1.0]
    assert _read(data, "episodes")["return"].tolist() == [1.0]
    assert "reward 5.0 was logged while the agent had no pending action" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_a_reward_sum_that_would_overflow_is_refused_at_its_call(tmp_path: Path, mode: str) -> None:
    """Two rewards of 1.7e308 once got 200 twice, then end got 400 and the episode was lost."""
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, mode, spool_dir=tmp_path / "spool", seed=0)
        episode = client.start_episode("e")
        client.log_action(episode, _obs(0), 1)
        client.log_returns(episode, 1.7e308)
        with pytest.raises(SchemaError, match="field 'reward'"):
            client.log_returns(episode, 1.7e308)
        client.end_episode(episode, _obs(1))
        assert client.close(10)
    assert _read(data, "steps")["reward"].tolist() == [1.7e308]
    assert _read(data, "episodes")["end_reason"].tolist() == ["terminated"]


def test_the_server_refuses_an_overflowing_reward_at_log_returns(tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        url = f"{server.url}/v1/episodes"
        requests.post(url, json={"episode_id": "e"}, timeout=5).raise_for_status()
        requests.post(f"{url}/e/actions", json={"observation": [0.0] * 4}, timeout=5)
        assert requests.post(f"{url}/e/returns", json={"reward": 1.7e308}, timeout=5).ok
        again = requests.post(f"{url}/e/returns", json={"reward": 1.7e308}, timeout=5)
        assert again.status_code == 400 and "field 'reward'" in again.json()["error"]["message"]
        end = requests.post(f"{url}/e/end", json={"observation": [0.0] * 4}, timeout=5)
        assert end.status_code == 200


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_the_end_does_not_observe_ends_truncated_in_rows_and_summary(
    tmp_path: Path, mode: str
) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, mode, spool_dir=tmp_path / "spool", seed=0)
        episode = client.start_episode("e")
        client.log_action(episode, {"a": _obs(0, 0), "b": _obs(0, 1)}, {"a": 0, "b": 1})
        client.log_action(episode, {"a": _obs(1, 0), "c": _obs(1, 2)}, {"a": 0, "c": 1})  # joins
        with pytest.raises((SchemaError, RequestRejected), match="'observations'"):
            client.end_episode(episode, _obs(2))  # single-agent end on a multi-agent episode
        client.end_episode(episode, {"a": _obs(2, 0)})  # b and c are cut off
        assert client.close(10)
    steps = _read(data, "steps").sort_values(["agent_id", "t"])
    last = steps.groupby("agent_id").tail(1).set_index("agent_id")
    assert last["terminated"].to_dict() == {"a": True, "b": False, "c": False}
    assert last["truncated"].to_dict() == {"a": False, "b": True, "c": True}
    assert steps.groupby("agent_id").size().to_dict() == {"a": 2, "b": 1, "c": 1}
    episodes = _read(data, "episodes").set_index("agent_id")["end_reason"].to_dict()
    assert episodes == {"a": "terminated", "b": "truncated", "c": "truncated"}


def test_multiagent_action_logp_is_an_object_as_the_document_says(tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        url = f"{server.url}/v1/episodes"
        requests.post(url, json={"episode_id": "e"}, timeout=5).raise_for_status()
        body = {"observations": {"a": [0.0] * 4, "b": [0.0] * 4}}
        answer = requests.post(f"{url}/e/actions", json=body, timeout=5)
        doc = requests.get(f"{server.url}/v1/openapi.json", timeout=5).json()
    check_answer(doc, "/v1/episodes/{episode_id}/actions", "post", answer)
    assert set(answer.json()["action_logp"]) == set(answer.json()["actions"]) == {"a", "b"}


def test_an_episode_closed_without_steps_starts_before_it_ends(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        requests.post(f"{server.url}/v1/episodes", json={"episode_id": "e"}, timeout=5)
    episodes = _read(data, "episodes")  # closed by the server's shutdown
    assert episodes["end_reason"].tolist() == ["closed"] and episodes["length"].tolist() == [0]
    assert (episodes["started_at"] <= episodes["ended_at"]).all()


@pytest.mark.parametrize("mode", MODES)
def test_episodes_left_open_are_closed_alike(tmp_path: Path, mode: str) -> None:
    """The server closes what a remote client leaves open at shutdown; a local client's close()
    does the same, instead of returning True with the pending steps never sent."""
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, mode, spool_dir=tmp_path / "spool", seed=0)
        episode = client.start_episode("e")
        for t in range(2):
            client.log_action(episode, _obs(t), 1)
            client.log_returns(episode, 1.0)
        assert client.close(10)
    steps = _read(data, "steps").sort_values("t")
    assert steps["truncated"].tolist() == [False, True] and steps["reward"].tolist() == [1.0, 1.0]
    assert [list(x) for x in steps["next_observation"]] == [list(_obs(1)), list(_obs(1))]
    assert _read(data, "episodes")["end_reason"].tolist() == ["closed"]


def test_a_request_observing_only_done_agents_gets_no_actions(tmp_path: Path) -> None:
    """It once got a 500 (an empty take on the observations); found by tests/test_modes.py."""
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        client = PolicyClient(server.url, "remote")
        episode = client.start_episode("e")
        assert set(client.get_action(episode, {"a": _obs(0)})) == {"a"}
        client.log_returns(episode, {}, multiagent_done_dict={"a": True})
        assert client.get_action(episode, {"a": _obs(1)}) == {}
        client.end_episode(episode, {"a": _obs(2)})
        client.close()
    steps = _read(tmp_path / "ds", "steps")
    assert steps["terminated"].tolist() == [True] and steps["t"].tolist() == [0]


@pytest.mark.parametrize("mode", MODES)
def test_an_end_that_observes_no_agent_ends_every_pending_step(tmp_path: Path, mode: str) -> None:
    """An end with ``{}`` for observations still ends the episode: each agent's pending step
    ends truncated at its own last observation (rows were once only made per observed agent)."""
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, mode, spool_dir=tmp_path / "spool", seed=0)
        episode = client.start_episode("e")
        client.get_action(episode, {"a": _obs(0, 0), "b": _obs(0, 1)})
        client.log_returns(episode, {"a": 1.0, "b": 2.0})
        client.end_episode(episode, {})
        assert client.close(10)
    steps = _read(data, "steps").sort_values("agent_id")
    assert steps["agent_id"].tolist() == ["a", "b"]
    assert steps["truncated"].tolist() == [True, True] and not steps["terminated"].any()
    assert steps["reward"].tolist() == [1.0, 2.0]
    episodes = _read(data, "episodes").sort_values("agent_id")
    assert episodes["end_reason"].tolist() == ["truncated", "truncated"]

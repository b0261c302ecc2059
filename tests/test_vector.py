"""VectorEpisodes and PolicyClient.step_many against a real server, with gymnasium vector envs."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import requests
from gymnasium.vector import AutoresetMode
from server_fixtures import cartpole_config, env_config, lossy_proxy, metric, running_server
from stored import read_steps

from pipeline.client import PolicyClient, RequestRejected
from pipeline.client.vector import VectorEpisodes
from pipeline.errors import ConfigError, SchemaError
from server.config import ServerConfig

ENVS = 4


def _vector_env(mode: AutoresetMode) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=ENVS, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode})  # fmt: skip


def _run(client: PolicyClient, mode: AutoresetMode, steps: int) -> dict[str, Any]:
    """Drive a vector env through VectorEpisodes; what the envs did, to check the log against."""
    envs = _vector_env(mode)
    vector = VectorEpisodes(client, ENVS, autoreset_mode=mode)
    observations, _ = envs.reset(seed=10)
    actions = vector.reset(observations, seeds=[10 + i for i in range(ENVS)])
    taken, finals, ended, closed = 0, [], np.zeros(ENVS, bool), 0
    for n in range(steps):
        observations, rewards, terminated, truncated, infos = envs.step(actions)
        taken += ENVS if mode is AutoresetMode.SAME_STEP else int(ENVS - ended.sum())
        done = terminated | truncated
        if mode is AutoresetMode.SAME_STEP:
            finals += [infos["final_obs"][i] for i in np.flatnonzero(done)]
        else:
            finals += [observations[i].copy() for i in np.flatnonzero(done)]
        if n == steps - 1:
            closed = int((~done & (~ended if mode is AutoresetMode.NEXT_STEP else True)).sum())
            vector.close(observations, rewards, terminated, truncated, infos)
        else:
            actions = vector.step(observations, rewards, terminated, truncated, infos)
        ended = done
    envs.close()
    return {"steps": taken, "finals": finals, "open": closed}


def _responses(url: str) -> int:
    metrics = requests.get(url + "/v1/metrics", timeout=10).text
    return int(metric(metrics, "rlpipe_responses_total", status="200") or 0)


def _check_log(data: Path, run: dict[str, Any]) -> pd.DataFrame:
    steps = read_steps(data)
    episodes = pd.read_parquet(data / "episodes")
    assert len(steps) == run["steps"]
    ended = steps[steps["terminated"]]
    assert len(ended) == len(run["finals"])
    stored = sorted(map(tuple, np.stack(ended["next_observation"].to_numpy()).tolist()))
    assert stored == sorted(tuple(map(float, final)) for final in run["finals"])
    assert len(episodes) == len(ended) + run["open"]
    assert steps["truncated"].sum() == run["open"]  # closed by close(), none by the envs
    for _, episode in steps.groupby("episode_id"):
        episode = episode.sort_values("t")
        assert episode["t"].tolist() == list(range(len(episode)))
        observation = np.stack(episode["observation"].to_numpy())
        next_observation = np.stack(episode["next_observation"].to_numpy())
        np.testing.assert_array_equal(observation[1:], next_observation[:-1])
    seeded = episodes.dropna(subset=["seed"])
    assert sorted(seeded["seed"]) == [10, 11, 12, 13]
    for _, row in seeded.iterrows():  # each sub-env's first episode replays from its seed
        first = steps[(steps["episode_id"] == row["episode_id"]) & (steps["t"] == 0)]
        reset, _ = gym.make("CartPole-v1").reset(seed=int(row["seed"]))
        np.testing.assert_array_equal(first["observation"].iloc[0], reset)
    return steps


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_a_vector_env_lands_as_episodes_one_request_per_step(
    tmp_path: Path, mode: AutoresetMode
) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode="remote")
        before = _responses(server.url)
        run = _run(client, mode, 60)
        # reset, 59 steps and close: a request each; and the spaces, read once, and a metrics read
        assert _responses(server.url) - before == 61 + 2
        client.close()
    assert run["finals"], "60 steps of 4 random CartPoles end some episodes"
    _check_log(data, run)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_batches_whose_answers_were_lost_are_sent_again_and_stored_once(
    tmp_path: Path, mode: AutoresetMode
) -> None:
    """The server does a batch's work and its answer is lost on the way (a proxy drops it): the
    client sends the batch again, and the server answers with what it answered the first time,
    storing nothing twice, for rows that start, step and end episodes alike."""
    data, answers = tmp_path / "ds", defaultdict(list)
    lost: list[dict[str, Any]] = []

    def drop(path: str, body: bytes) -> bool:
        if path != "/v1/actions":
            return False
        doc, n = json.loads(body), len(answers)
        answers[body].append(n)  # each try of each batch
        first_try = len(answers[body]) == 1
        ends = any(doc["terminated"]) or any(doc["truncated"])
        if first_try and (n in (0, 3) or (ends and sum(any(d["terminated"]) for d in lost) < 2)):
            lost.append(doc)
            return True
        return False

    with running_server(cartpole_config(data)) as server, lossy_proxy(server.url, drop) as url:
        client = PolicyClient(url, inference_mode="remote")
        run = _run(client, mode, 60)
        client.close()
    assert len(lost) == 4, "the reset, a plain step and two batches that ended episodes"
    assert [start["seed"] for start in lost[0]["starts"]] == [10, 11, 12, 13]
    assert sum(any(doc["terminated"]) for doc in lost) == 2, "two lost batches ended episodes"
    assert sorted(len(tries) for tries in answers.values()).count(2) == 4  # each lost one, again
    _check_log(data, run)  # every step once: the retries stored nothing


def test_a_retried_batch_is_recognised_whole_or_refused(tmp_path: Path) -> None:
    """Request numbers decide: a batch whose rows all repeat their episodes' last requests gets
    its first answer again (even for an episode it ended); one that repeats some rows and not
    others, or skips a number, gets a 409 and writes nothing."""
    data = tmp_path / "ds"
    observations = [[0.01, 0.02, 0.03, 0.04], [0.0, 0.1, 0.0, 0.1]]
    with running_server(cartpole_config(data)) as server:

        def send(requests_: list[int], **more: Any) -> requests.Response:
            body = {"episode_ids": ["a", "b"], "observations": observations,
                    "requests": requests_, **more}  # fmt: skip
            return requests.post(server.url + "/v1/actions", json=body, timeout=10)

        first = send([1, 1], starts=[{}, {}])
        assert send([1, 1], starts=[{}, {}]).json() == first.json()
        second = send([2, 2], rewards=[1.0, 1.0], terminated=[False, True])
        assert send([2, 2], rewards=[1.0, 1.0], terminated=[False, True]).json() == second.json()
        assert second.json()["actions"][1] is None
        refused = [send([2, 3]), send([4, 3])]
        assert [r.status_code for r in refused] == [409, 409]
        assert refused[0].json()["error"]["message"] == (
            "field 'requests': episodes ['a'] repeat their last request and episodes ['b'] do "
            "not; send a retried batch again whole, as it was first sent")  # fmt: skip
        ended = "episode 'b' has ended; call start_episode() for a new one"
        assert refused[1].json()["error"]["message"] == ended
        single = requests.post(server.url + "/v1/actions", timeout=10, json={
            "episode_ids": ["a"], "observations": observations[:1], "requests": [4]})  # fmt: skip
        assert single.status_code == 409 and single.json()["error"]["message"] == (
            "field 'requests': expected 3 (the next request of episode 'a'), got 4")  # fmt: skip
    steps = read_steps(data)
    assert sorted(zip(steps["episode_id"], steps["t"], strict=True)) == [
        ("a", 0), ("a", 1), ("b", 0)]  # fmt: skip  # a's t=1: closed at shutdown
    assert len(pd.read_parquet(data / "episodes")) == 2


@pytest.mark.parametrize(
    ("env_id", "observations"),
    [("CartPole-v1", [[0.01, 0.02, 0.03, 0.04], [0.0, 0.1, 0.0, 0.1]]), ("FrozenLake-v1", [0, 5])],
)
def test_copies_of_a_batch_sent_at_once_get_one_answer_and_store_once(
    tmp_path: Path, env_id: str, observations: list[Any]
) -> None:
    """Copies of one batch that arrive together (a retry sent while the first try still runs):
    every copy gets the first try's answer, the batch that starts two episodes and the one that
    ends them alike, and each row is stored once; on the columnar path (CartPole) and the row
    path (FrozenLake's integer observations)."""
    data, rounds, copies = tmp_path / "ds", 25, 4
    with running_server(env_config(data, env_id)) as server:

        def send(body: dict[str, Any]) -> list[Any]:
            def post(_: int) -> Any:
                answer = requests.post(server.url + "/v1/actions", json=body, timeout=30)
                return answer.status_code, answer.json()

            with ThreadPoolExecutor(copies) as pool:
                return list(pool.map(post, range(copies)))

        for r in range(rounds):
            ids = [f"{r}-a", f"{r}-b"]
            started = send({"episode_ids": ids, "observations": observations,
                            "starts": [{}, {}], "requests": [1, 1]})  # fmt: skip
            ended = send({"episode_ids": ids, "observations": observations,
                          "terminated": [True, True], "requests": [2, 2]})  # fmt: skip
            for answers in (started, ended):
                assert [status for status, _ in answers] == [200] * copies, answers
                assert all(answer == answers[0] for answer in answers)
    steps = read_steps(data)
    assert len(steps) == 2 * rounds and not steps.duplicated(["episode_id", "t"]).any()
    assert len(pd.read_parquet(data / "episodes")) == 2 * rounds


def test_a_vector_env_of_discrete_observations_takes_the_row_path(tmp_path: Path) -> None:
    """FrozenLake's observations are integers, which the server's columnar path does not take:
    the batch form goes row by row and still answers in columns, and retries still replay."""
    data, tries = tmp_path / "ds", defaultdict(int)

    def drop(path: str, body: bytes) -> bool:
        tries[body] += 1
        return path == "/v1/actions" and tries[body] == 1 and len(tries) % 4 == 0

    envs = gym.make_vec("FrozenLake-v1", num_envs=ENVS, vectorization_mode="sync")
    taken, ends = 0, 0
    with running_server(env_config(data, "FrozenLake-v1")) as server, lossy_proxy(
        server.url, drop
    ) as url:  # fmt: skip
        client = PolicyClient(url, inference_mode="remote")
        vector = VectorEpisodes(client, ENVS)
        observations, _ = envs.reset(seed=0)
        actions = vector.reset(observations, seeds=list(range(ENVS)))
        ended = np.zeros(ENVS, bool)
        for _ in range(30):
            assert envs.action_space.contains(actions)
            observations, rewards, terminated, truncated, infos = envs.step(actions)
            taken += int(ENVS - ended.sum())
            ended = terminated | truncated
            ends += int(ended.sum())
            actions = vector.step(observations, rewards, terminated, truncated, infos)
        vector.close(observations, rewards, terminated, truncated, infos)
        client.close()
    steps = read_steps(data)
    assert ends > 0 and sum(n == 2 for n in tries.values()) >= 5
    assert not steps.duplicated(["episode_id", "t"]).any()
    assert len(steps) == taken + ENVS - int(ended.sum()) and steps["terminated"].sum() == ends
    assert len(pd.read_parquet(data / "episodes")) == ends + ENVS - int(ended.sum())


def test_local_inference_logs_the_same_episodes(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode="local", spool_dir=tmp_path / "spool")
        run = _run(client, AutoresetMode.NEXT_STEP, 40)
        assert client.close()
    _check_log(data, run)


def test_step_many_starts_steps_and_ends_episodes_in_one_call(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    observation = np.array([[0.01, 0.02, 0.03, 0.04]] * 2, np.float32)
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode="remote")
        actions = client.step_many(["a", "b"], observation, starts=[{"seed": 1}, {}])
        assert all(action in (0, 1) for action in actions)
        client.log_returns("a", 0.5)  # rides on the next call, as with get_action
        ended = client.step_many(["a", "b"], observation, rewards=[1.0, 2.0],
                                 terminated=[True, False])  # fmt: skip
        assert ended[0] is None and ended[1] in (0, 1)
        with pytest.raises(Exception, match="'a' was not started by this client"):
            client.step_many(["a"], observation[:1])
        client.close()
    steps = read_steps(data).sort_values(["episode_id", "t"])
    a, b = (steps[steps["episode_id"] == name] for name in "ab")
    assert (a["reward"].tolist(), a["terminated"].tolist()) == ([1.5], [True])
    # b's second row: the server closed it as truncated at shutdown
    assert (b["reward"].tolist(), b["truncated"].tolist()) == ([2.0, 0.0], [False, True])


def test_bad_input_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, inference_mode="remote")
        good = np.zeros((2, 4), np.float32)
        client.step_many(["a", "b"], good, starts=[{}, {}])
        nan = good.copy()
        nan[1, 2] = np.nan
        with pytest.raises(
            RequestRejected,
            match=re.escape("field 'observations[1][2]': expected finite numbers, got NaN"),
        ):
            client.step_many(["a", "b"], nan)  # sent as NaN (not null), so the server names it
        with pytest.raises(
            SchemaError,
            match=re.escape(
                "field 'observations': expected 2 rows (one per episode id), got shape (1, 4)"
            ),
        ):
            client.step_many(["a", "b"], good[:1])
        with pytest.raises(SchemaError, match="field 'rewards': expected 2 numbers"):
            client.step_many(["a", "b"], good, rewards=[1.0])
        with pytest.raises(SchemaError, match="field 'terminated': expected 2 booleans"):
            client.step_many(["a", "b"], good, terminated=[1, 0])
        client.step_many(["a", "b"], good, truncated=[True, True])  # still serving, still open
        client.close()
    steps = read_steps(data)
    assert len(steps) == 2 and steps["truncated"].all()


def test_vector_episodes_config_is_checked() -> None:
    client = PolicyClient("127.0.0.1:1", inference_mode="remote", timeout=0.2)
    with pytest.raises(ConfigError, match="num_envs: expected an integer >= 1, got 0"):
        VectorEpisodes(client, 0)
    with pytest.raises(
        ConfigError, match=re.escape("autoreset_mode: expected AutoresetMode.NEXT_STEP")
    ):
        VectorEpisodes(client, 2, autoreset_mode=AutoresetMode.DISABLED)


def test_box_actions_come_back_as_the_vector_env_takes_them(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    env = gym.make("Pendulum-v1")
    config = ServerConfig(data=data, observation_space=env.observation_space,
                          action_space=env.action_space, env_id="Pendulum-v1")  # fmt: skip
    envs = gym.make_vec("Pendulum-v1", num_envs=3, vectorization_mode="sync")
    with running_server(config) as server:
        client = PolicyClient(server.url, inference_mode="remote")
        vector = VectorEpisodes(client, 3)
        observations, _ = envs.reset(seed=0)
        actions = vector.reset(list(observations))  # single observations, not one array
        for _ in range(5):
            assert actions.shape == (3, 1) and actions.dtype == np.float32
            assert envs.action_space.contains(actions)
            observations, rewards, terminated, truncated, infos = envs.step(actions)
            actions = vector.step(observations, rewards, terminated, truncated, infos)
        with pytest.raises(
            RequestRejected,
            match=re.escape("field 'rewards[1]': expected finite numbers, got Infinity"),
        ):
            vector.step(observations, [0.0, np.inf, 0.0], terminated, truncated)
        observations, rewards, terminated, truncated, infos = envs.step(actions)
        vector.close(observations, rewards, terminated, truncated, infos)
        client.close()
    steps = read_steps(data)
    assert len(steps) == 3 * 6 and steps["truncated"].sum() == 3
    logged = np.stack(steps.sort_values("t")["action"].to_numpy())
    assert logged.shape == (18, 1) and np.all(np.abs(logged) <= 2.0)


def test_local_inference_gives_box_actions_of_any_size_to_the_vector_env(tmp_path: Path) -> None:
    """Local inference returns each Box action as an array; filling in an ended sub-env's action
    once compared them with None, which numpy refuses for arrays of two or more values."""
    data = tmp_path / "ds"
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    config = ServerConfig(data=data, observation_space=observation_space, action_space=action_space)
    observations = np.zeros((2, 3), np.float32)
    no = np.zeros(2, bool)
    with running_server(config) as server:
        client = PolicyClient(server.url, inference_mode="local", spool_dir=tmp_path / "spool")
        vector = VectorEpisodes(client, 2)
        actions = vector.reset(observations)
        ended = np.array([True, False])
        for terminated in (no, ended, no):
            assert actions.shape == (2, 2) and action_space.contains(actions[0])
            actions = vector.step(observations, [1.0, 1.0], terminated, no)
        vector.close(observations, [0.0, 0.0], no, no)
        assert client.close()
    steps = read_steps(data)
    assert len(steps) == 7 and steps["terminated"].sum() == 1

"""The columnar step path (server/stepper.py) and flat combining (server/combiner.py), over real
HTTP on loopback: the columnar batch form, single steps, concurrent requests sharing passes."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import requests
from server_fixtures import cartpole_checkpoint, cartpole_config, running_server
from stored import read_steps

from pipeline.policy.checkpoint import load_checkpoint
from pipeline.policy.network import NumpyPolicy
from server.combiner import Combiner

OBS = [[0.01, -0.02, 0.03, 0.04], [0.1, 0.2, 0.3, 0.4], [-0.5, 0.5, -0.05, 0.05]]


def _policy(directory: Path) -> NumpyPolicy:
    return NumpyPolicy(load_checkpoint(cartpole_checkpoint(directory, 1, seed=3)))


def _actions(url: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(url + "/v1/actions", json=body, timeout=10)


def test_columnar_batch_form_rows_and_answers_are_the_known_ones(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    policy = _policy(data / "checkpoints")
    ids = ["c0", "c1", "c2"]
    with running_server(cartpole_config(data)) as server:
        first = _actions(server.url, {"episode_ids": ids, "observations": OBS,
                                      "starts": [{"seed": 7}, {}, {"seed": 9}]}).json()  # fmt: skip
        assert first["episode_ids"] == ids and first["policy_version"] == 1
        assert [a in (0, 1) for a in first["actions"]] == [True] * 3
        logits = policy.forward(np.asarray(OBS, np.float32))
        log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        expected = log_softmax[np.arange(3), first["actions"]]
        np.testing.assert_allclose(first["action_logp"], expected, rtol=1e-5)
        # an empty info is still an info: stored as {}
        second = _actions(server.url, {
            "episode_ids": ids, "observations": OBS[::-1], "rewards": [1.0, 2.0, 3.5],
            "terminated": [False, True, False], "truncated": [False, False, True],
            "infos": [{}, None, None]}).json()  # fmt: skip
        assert second["actions"][1:] == [None, None] and second["action_logp"][1:] == [None, None]
        assert second["actions"][0] in (0, 1)
    steps = read_steps(data).sort_values(["episode_id", "t"])
    firsts = steps[steps["t"] == 0].set_index("episode_id")
    assert firsts["action"].tolist() == first["actions"]
    assert firsts["reward"].tolist() == [1.0, 2.0, 3.5]
    assert firsts["terminated"].tolist() == [False, True, False]
    assert firsts["truncated"].tolist() == [False, False, True]
    assert firsts["info"].fillna("-").tolist() == ["{}", "-", "-"]
    np.testing.assert_allclose(np.stack(firsts["next_observation"]), np.float32(OBS[::-1]))
    np.testing.assert_allclose(np.stack(firsts["observation"]), np.float32(OBS))
    np.testing.assert_allclose(firsts["action_logp"], first["action_logp"])
    assert firsts["policy_version"].tolist() == [1, 1, 1]
    assert len(steps) == 4  # c0's second step is closed as truncated at shutdown
    episodes = pd.read_parquet(data / "episodes").set_index("episode_id").sort_index()
    assert episodes["end_reason"].tolist() == ["closed", "terminated", "truncated"]
    assert episodes["length"].tolist() == [2, 1, 1]
    assert episodes["seed"].tolist()[0] == 7 and pd.isna(episodes["seed"].tolist()[1])


def _bad_columns() -> list[tuple[dict[str, Any], int, str]]:
    return [
        ({"episode_ids": [], "observations": []}, 400,
         "field 'episode_ids': expected a non-empty list of episode ids, got list"),
        ({"episode_ids": ["a", "b"], "observations": [OBS[0]]}, 400,
         "field 'observations': expected a list of 2 entries (one per episode id), got 1 entries"),
        ({"episode_ids": ["a", "b"]}, 400,
         "field 'observations': expected a list of 2 entries (one per episode id), got NoneType"),
        ({"episode_ids": ["a", "b"], "observations": [OBS[0], [0, 0, 0]]}, 400,
         "row 1, field 'observations': expected float32 of shape (4,) per row, got shape (3,)"),
        ({"episode_ids": ["a", "b"], "observations": OBS[:2], "rewards": [1, "x"]}, 400,
         "field 'rewards[1]': expected a finite number, got 'x'"),
        ({"episode_ids": ["a", "b"], "observations": OBS[:2], "terminated": [False, 1]}, 400,
         "field 'terminated[1]': expected true or false, got 1"),
        ({"episode_ids": ["a", 5], "observations": OBS[:2]}, 400,
         "field 'episode_ids[1]': expected a non-empty string of at most 200 characters, not '.' "
         "or '..', got 5"),
        ({"episode_ids": ["a", "a"], "observations": OBS[:2]}, 400,
         "field 'episode_ids': expected each episode at most once per request, got 'a' twice"),
        ({"episode_ids": ["a", "nope"], "observations": OBS[:2]}, 404,
         "episode 'nope' is not open on this server; call start_episode() first"),
        ({"episode_ids": ["a"], "observations": OBS[:1], "starts": [5]}, 400,
         "field 'starts[0]': expected an object or null, got int"),
        ({"episode_ids": ["a"], "observations": OBS[:1], "infos": ["not json"]}, 400,
         "field 'infos[0]': expected an object or JSON text, got 'not json'"),
    ]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message"), _bad_columns())
def test_columnar_bad_input_gets_its_4xx_and_writes_nothing(
    tmp_path: Path, body: dict[str, Any], status: int, message: str
) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        assert _actions(server.url, {"episode_ids": ["a"], "observations": OBS[:1],
                                     "starts": [{}]}).ok  # fmt: skip
        answer = _actions(server.url, body)
        assert answer.status_code == status
        assert re.fullmatch(re.escape(message), answer.json()["error"]["message"])
        assert server.service.writer.rows_acknowledged == 0
        good = _actions(server.url, {"episode_ids": ["a"], "observations": OBS[1:2]})
        assert good.ok and server.service.writer.rows_acknowledged == 1


def test_concurrent_single_steps_each_land_once_in_order(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    clients, steps = 6, 25
    with running_server(cartpole_config(data)) as server:
        errors: list[BaseException] = []

        def play(k: int) -> None:
            try:
                with requests.Session() as session:
                    url = f"{server.url}/v1/episodes/p{k}"
                    session.post(server.url + "/v1/episodes", json={"episode_id": f"p{k}"},
                                 timeout=10).raise_for_status()  # fmt: skip
                    for n in range(steps):
                        body = {"observation": [k, n, 0.0, 0.0], "reward": float(n),
                                "request": n + 1}  # fmt: skip
                        session.post(url + "/actions", json=body, timeout=10).raise_for_status()
                    session.post(url + "/end", json={"observation": [k, steps, 0.0, 0.0],
                                 "reward": 1.0, "request": steps + 1},
                                 timeout=10).raise_for_status()  # fmt: skip
            except BaseException as error:  # surfaced below, in the test's thread
                errors.append(error)

        threads = [threading.Thread(target=play, args=(k,)) for k in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
    table = read_steps(data).sort_values(["episode_id", "t"])
    assert len(table) == clients * steps
    for k, rows in table.groupby("episode_id"):
        number = int(str(k)[1:])
        assert rows["t"].tolist() == list(range(steps))
        assert rows["reward"].tolist() == [float(n) for n in range(1, steps)] + [1.0]
        assert [o[1] for o in rows["next_observation"]] == list(range(1, steps + 1))
        assert {o[0] for o in rows["observation"]} == {number}
        assert rows["terminated"].tolist() == [False] * (steps - 1) + [True]


def test_combiner_runs_queued_items_in_one_pass_and_retries_a_bad_one_alone() -> None:
    started, release = threading.Event(), threading.Event()
    passes: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        passes.append(list(items))
        if items == [0]:
            started.set()
            release.wait(5)
        if 13 in items:
            raise ValueError("13 is bad")
        return [item * 10 for item in items]

    combiner: Combiner[int, int] = Combiner(run, retry_alone=lambda e: isinstance(e, ValueError))
    results: dict[int, Any] = {}

    def submit(item: int) -> None:
        try:
            results[item] = combiner.submit(item)
        except ValueError as error:
            results[item] = str(error)

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    started.wait(5)
    others = [threading.Thread(target=submit, args=(item,)) for item in (1, 2, 13)]
    for thread in others:
        thread.start()
    while len(combiner._queue) < 3:  # all three queued behind the running pass
        time.sleep(0.001)
    release.set()
    for thread in [first, *others]:
        thread.join()
    assert results == {0: 0, 1: 10, 2: 20, 13: "13 is bad"}
    assert passes[0] == [0] and sorted(passes[1]) == [1, 2, 13]
    assert sorted(map(tuple, passes[2:])) == [(1,), (2,), (13,)]  # the bad pass, retried alone

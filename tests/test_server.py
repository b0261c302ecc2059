"""The policy server over real HTTP on loopback: resources, bad input, durability, shutdown."""

from __future__ import annotations

import io
import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import requests
from conftest import cartpole_spaces
from server_fixtures import (
    cartpole_checkpoint,
    cartpole_config,
    free_port,
    kill,
    metric,
    running_server,
    start_serve_process,
    wait_for,
)

from pipeline.format import codec, spaces
from pipeline.policy.checkpoint import Checkpoint, ModelSpec, save_checkpoint
from server import openapi

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OBS = [0.01, -0.02, 0.03, 0.04]
ARROW = "application/vnd.apache.arrow.stream"


def _post(url: str, path: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(url + path, json=body, headers=AUTH, timeout=10, **kwargs)


def test_remote_inference_uses_newest_checkpoint_and_records_it(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data, token=TOKEN, policy_poll_s=0.05)) as server:
        assert requests.get(server.url + "/v1/health", timeout=5).json()["acting_at_random"]
        assert requests.get(server.url + "/v1/weights", headers=AUTH, timeout=5).status_code == 404
        cartpole_checkpoint(data / "checkpoints", 1)
        time.sleep(0.1)
        episode = _post(server.url, "/v1/episodes", {"episode_id": "e1", "seed": 5}).json()
        assert episode == {"episode_id": "e1"}
        first = _post(server.url, "/v1/episodes/e1/actions", {"observation": OBS}).json()
        assert first["policy_version"] == 1 and first["action"] in (0, 1)
        assert first["action_logp"] < 0
        cartpole_checkpoint(data / "checkpoints", 2, seed=1)
        time.sleep(0.1)
        second = _post(server.url, "/v1/episodes/e1/actions", {"observation": OBS, "reward": 1})
        assert second.json()["policy_version"] == 2
        _post(server.url, "/v1/episodes/e1/end", {"observation": OBS, "reward": 2.5})
        health = requests.get(server.url + "/v1/health", timeout=5).json()
        assert health["policy_version"] == 2 and not health["acting_at_random"]
        weights = requests.get(server.url + "/v1/weights", headers=AUTH, timeout=5)
        assert weights.headers["X-Rlpipe-Policy-Version"] == "2"
        assert weights.content == (data / "checkpoints" / "policy-00000002.npz").read_bytes()
        same = requests.get(server.url + "/v1/weights?version=2", headers=AUTH, timeout=5)
        assert same.status_code == 304 and same.content == b""
        _publish_for_other_spaces(data / "checkpoints", 3)
        time.sleep(0.1)
        health = requests.get(server.url + "/v1/health", timeout=5).json()
        assert health["policy_version"] == 2
        assert health["refused_checkpoint"] == (
            "policy-00000003.npz: checkpoint version 3: observation_space: expected 4 values "
            "per flattened observation, got 3"
        )
        assert requests.get(server.url + "/v1/weights?version=2", headers=AUTH,
                            timeout=5).status_code == 304  # fmt: skip
        _post(server.url, "/v1/episodes", {"episode_id": "after"})
        third = _post(server.url, "/v1/episodes/after/actions", {"observation": OBS})
        assert third.status_code == 200 and third.json()["policy_version"] == 2
    steps = pd.read_parquet(data / "steps", filters=[("episode_id", "=", "e1")]).sort_values("t")
    assert steps["policy_version"].tolist() == [1, 2]
    assert steps["action_logp"].tolist() == [first["action_logp"], second.json()["action_logp"]]
    assert steps["reward"].tolist() == [1.0, 2.5]
    assert steps["terminated"].tolist() == [False, True]


def _publish_for_other_spaces(directory: Path, version: int) -> None:
    """A checkpoint a trainer made for another env: the server must keep serving its last one."""
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    spec = ModelSpec(box, gym.spaces.Discrete(2), hidden=(4,))
    weights = {
        "pi.0.weight": np.zeros((4, 3), np.float32),
        "pi.0.bias": np.zeros(4, np.float32),
        "pi.1.weight": np.zeros((2, 4), np.float32),
        "pi.1.bias": np.zeros(2, np.float32),
    }
    save_checkpoint(directory, Checkpoint(version, spec, weights))


def test_batch_form_serves_many_episodes_in_one_request(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        start = [{"episode_id": f"v{i}", "start": {"seed": i}, "observation": OBS}
                 for i in range(16)]  # fmt: skip
        answer = requests.post(server.url + "/v1/actions", json={"episodes": start}, timeout=10)
        assert [e["action"] in (0, 1) for e in answer.json()["episodes"]] == [True] * 16
        step = [{"episode_id": f"v{i}", "observation": OBS, "reward": 1.0,
                 "terminated": i % 2 == 0} for i in range(16)]  # fmt: skip
        answer = requests.post(server.url + "/v1/actions", json={"episodes": step}, timeout=10)
        ended = [e.get("ended", False) for e in answer.json()["episodes"]]
        assert ended == [i % 2 == 0 for i in range(16)]
        assert server.service.runner.forward_passes == 2
    steps = pd.read_parquet(data / "steps")
    assert len(steps) == 16 + 8  # 16 first steps, then 8 episodes' second steps at close
    episodes = pd.read_parquet(data / "episodes").set_index("episode_id")
    assert episodes.loc["v0", "end_reason"] == "terminated"
    assert episodes.loc["v1", "end_reason"] == "closed"
    assert episodes.loc["v3", "seed"] == 3


def _bad_cases(url: str) -> list[tuple[str, dict[str, Any], int, str]]:
    json_type = {"Content-Type": "application/json", **AUTH}
    ep = "/v1/episodes/e1/actions"
    return [
        (ep, {"data": b"{", "headers": json_type}, 400,
         "body: expected a JSON object, got malformed JSON (Expecting property name enclosed in "
         "double quotes: line 1 column 2 (char 1))"),
        (ep, {"json": [1, 2]}, 400, "field 'body': expected a JSON object, got list"),
        (ep, {"json": {"observation": [0, 0, 0]}}, 400,
         "field 'observation': expected float32 of shape (4,) per row, got shape (3,)"),
        (ep, {"json": {"observation": ["a", "b", "c", "d"]}}, 400,
         "field 'observation': expected float32 of shape (4,) per row, got ['a', 'b', 'c', 'd']"),
        (ep, {"data": b'{"observation": [0, 0, NaN, 0]}', "headers": json_type}, 400,
         "field 'observation[2]': expected finite numbers, got NaN"),
        (ep, {"data": b'{"observation": [0, 0, 0, 0], "reward": 1e999}', "headers": json_type},
         400, "field 'reward': expected finite numbers, got Infinity"),
        ("/v1/actions", {"data": b'{"episodes": [{"episode_id": "e1", "observation": [0, 0, 0, '
                                 b'0], "info": {"x": [1, -Infinity]}}]}', "headers": json_type},
         400, "field 'episodes[0].info.x[1]': expected finite numbers, got -Infinity"),
        (ep, {"json": {"observation": OBS, "reward": "1"}}, 400,
         "field 'reward': expected a finite number, got '1'"),
        (ep, {"json": {"observation": OBS, "reward": 10**400}}, 400,
         "field 'reward': expected a finite number, got 1" + "0" * 39),
        ("/v1/actions", {"json": {"episode_ids": ["e1"], "observations": [OBS],
                                  "rewards": [10**400]}}, 400,
         "field 'rewards[0]': expected a finite number, got 1" + "0" * 39),
        (ep, {"json": {}}, 400,
         "field 'observation': expected an observation (or 'observations' keyed by agent id), "
         "got nothing"),
        ("/v1/episodes", {"json": {"episode_id": "s1", "seed": -1}}, 400,
         "field 'seed': expected an integer seed in [0, 2**64) or null, got -1"),
        ("/v1/episodes/e1/logged-actions", {"json": {"observation": OBS, "action": 5}}, 400,
         "field 'action': expected an integer in [0, 2), got 5"),
        (ep, {"data": b"x" * 5000, "headers": json_type}, 413,
         "request body of 5000 bytes is larger than the server's limit of 4096 bytes"),
        (ep, {"data": iter([b"x" * 2500] * 2), "headers": json_type}, 413,  # chunked
         "request body of more than 4096 bytes is larger than the server's limit of 4096 bytes"),
        (ep, {"json": {"observation": OBS}, "headers": {}}, 401,
         "missing or wrong token: send 'Authorization: Bearer TOKEN'"),
        (ep, {"json": {"observation": OBS}, "headers": {"Authorization": "Bearer nope"}}, 401,
         "missing or wrong token: send 'Authorization: Bearer TOKEN'"),
        ("/v1/episodes/nope/actions", {"json": {"observation": OBS}}, 404,
         "episode 'nope' is not open on this server; call start_episode() first"),
        ("/v1/episodes/old/actions", {"json": {"observation": OBS}}, 409,
         "episode 'old' has ended; call start_episode() for a new one"),
        (ep, {"data": b"observation=1", "headers": {"Content-Type": "text/plain", **AUTH}}, 415,
         "Content-Type: expected application/json, got text/plain"),
        (ep, {"json": {"observation": OBS, "request": 7}}, 409,
         "field 'request': expected 2 (the next request of episode 'e1'), got 7"),
        ("/v1/actions", {"json": {"episode_ids": ["new4", ".."], "observations": [OBS, OBS],
                                  "starts": [{}, {}]}}, 400,
         "field 'episode_ids[1]': expected a non-empty string of at most 200 characters, "
         "not '.' or '..', got '..'"),
        ("/v1/actions", {"json": {"episode_ids": ["new1", "nope"], "observations": [OBS, OBS],
                                  "starts": [{"seed": 1}, None]}}, 404,
         "episode 'nope' is not open on this server; call start_episode() first"),
        ("/v1/actions", {"json": {"episode_ids": ["new2", "old"], "observations": [OBS, OBS],
                                  "starts": [{}, None]}}, 409,
         "episode 'old' has ended; call start_episode() for a new one"),
        ("/v1/actions", {"json": {"episodes": [
            {"episode_id": "new3", "observation": OBS, "start": True},
            {"episode_id": "new3", "observation": OBS}]}}, 400,
         "field 'episodes': expected each episode at most once per request, got 'new3' twice"),
        ("/v1/uploads", {"data": b"not arrow", "headers": {
            "Content-Type": "application/vnd.apache.arrow.stream", "X-Rlpipe-Client": "c",
            "X-Rlpipe-Upload": "0", **AUTH}}, 400,
         "body: expected an Arrow IPC stream, got unreadable bytes"),
        ("/v1/uploads", {"json": {"steps": []}, "headers": {"X-Rlpipe-Client": "c", **AUTH}},
         400, "field 'X-Rlpipe-Upload': expected the upload's number, an integer >= 0, got None"),
        *_unstorable_cases(json_type),
        *_arrow_cases(),
    ]  # fmt: skip


def _arrow(**columns: Any) -> dict[str, Any]:
    """A binary body (one Arrow IPC stream) of ``columns`` (Arrow arrays), as requests sends it."""
    batch = pa.record_batch(list(columns.values()), names=list(columns))
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return {"data": sink.getvalue(), "headers": {"Content-Type": ARROW, **AUTH}}


def _arrow_cases() -> list[tuple[str, dict[str, Any], int, str]]:
    """Binary bodies are refused as JSON ones are: the field, what was expected, what came."""
    ep, space = "/v1/episodes/e1/actions", cartpole_spaces()[0]
    obs = codec.to_arrow(space, np.array([OBS], np.float32))
    nan = codec.to_arrow(space, np.array([OBS], np.float32)).flatten().to_numpy().copy()
    nan[2] = np.nan
    nan_obs = pa.FixedSizeListArray.from_arrays(pa.array(nan), 4)
    two = codec.to_arrow(space, np.array([OBS, OBS], np.float32))
    return [
        (ep, _arrow(observation=pa.array([[0.0, 0.0, 0.0, 0.0]])), 400,
         "field 'observation': expected Arrow type fixed_size_list<item: float>[4], "
         "got list<item: double>"),
        (ep, _arrow(observation=nan_obs), 400,
         "field 'observation': expected finite values, got nan"),
        (ep, _arrow(observation=two), 400,
         "field 'body': expected one row (one step of one episode), got 2 rows"),
        (ep, _arrow(observation=obs, reward=pa.array([1], pa.int32())), 400,
         "field 'reward': expected an Arrow column of type double, got int32"),
        (ep, _arrow(observation=obs, rewards=pa.array([1.0])), 400,
         "field 'rewards': expected one of the columns ['observation', 'reward', 'request', "
         "'info'], got an unknown column"),
        (ep, _arrow(reward=pa.array([1.0])), 400, "field 'observation': expected a column, got "
         "nothing"),
        ("/v1/episodes/e1/logged-actions", _arrow(observation=obs, action=pa.array([5])), 400,
         "field 'action': expected an integer in [0, 2), got 5"),
        (ep, {**_arrow(observation=obs), "data": b"not arrow"}, 400,
         "body: expected an Arrow IPC stream, got unreadable bytes"),
        ("/v1/actions", _arrow(episode_ids=pa.array(["e1"]), observations=pa.array(
            [None], obs.type)), 400,
         "row 0, field 'observations': expected a value in every row, got null"),
        ("/v1/actions", _arrow(episode_ids=pa.array(["new5"]), observations=obs,
                               starts=pa.array(["{nope"])), 400,
         "field 'starts[0]': expected JSON text of an object, or null, got '{nope'"),
        ("/v1/episodes", _arrow(observation=obs), 415,
         f"Content-Type: expected application/json, got {ARROW}"),
    ]  # fmt: skip


def _unstorable_cases(json_type: dict[str, str]) -> list[tuple[str, dict[str, Any], int, str]]:
    """Bodies that once got a 500, or were taken and stored wrong: refused whole at the call."""
    upload = {"X-Rlpipe-Client": "c", "X-Rlpipe-Upload": "1", **json_type}
    deep = b'{"observation": ' + b"[" * 1500 + b"]" * 1500 + b"}"  # deeper than json reads
    deep_enough = b'{"observation": ' + b"[" * 64 + b"]" * 64 + b"}"  # 65 levels: orjson reads it
    too_deep = (
        "field 'body': expected arrays and objects nested at most 64 deep, got deeper nesting"
    )
    not_utf8 = "expected text that is valid UTF-8 (no lone surrogates), got "
    not_text = "field 'client_id': expected a string of at most 200 characters or null, got "
    routes = ["/v1/episodes", "/v1/actions"] + [
        f"/v1/episodes/e1/{verb}" for verb in ("actions", "logged-actions", "returns", "end")
    ]
    return [
        *[(path, {"data": body, "headers": json_type}, 400, too_deep)
          for path in routes for body in (deep, deep_enough)],
        ("/v1/uploads", {"data": deep, "headers": upload}, 400, too_deep),
        ("/v1/episodes", {"json": {"client_id": {"a": [1, 2]}}}, 400, not_text + "{'a': [1, 2]}"),
        ("/v1/episodes", {"json": {"client_id": 1.5e300}}, 400, not_text + "1.5e+300"),
        ("/v1/episodes", {"json": {"options": "q"}}, 400,
         "field 'options': expected an object or JSON text, got 'q'"),
        ("/v1/episodes/e1/actions", {"json": {"observations": {"a": OBS}, "infos": {"a": "q"}}},
         400, "field 'infos.a': expected an object or JSON text, got 'q'"),
        ("/v1/episodes", {"data": b'{"client_id": "a\\udaa8"}', "headers": json_type}, 400,
         "field 'client_id': " + not_utf8 + "'a\\udaa8'"),
        ("/v1/episodes", {"data": b'{"episode_id": "a\\udaa8"}', "headers": json_type}, 400,
         "field 'episode_id': " + not_utf8 + "'a\\udaa8'"),
        ("/v1/actions", {"data": b'{"episodes": [{"episode_id": "b\\udaa8", "start": true, '
                                 b'"observation": [0, 0, 0, 0]}]}', "headers": json_type}, 400,
         "field 'episodes[0].episode_id': " + not_utf8 + "'b\\udaa8'"),
        ("/v1/actions", {"data": b'{"episode_ids": ["c\\udaa8"], "starts": [{}], '
                                 b'"observations": [[0, 0, 0, 0]]}', "headers": json_type}, 400,
         "field 'episode_ids[0]': " + not_utf8 + "'c\\udaa8'"),
        ("/v1/actions", {"data": b'{"episodes": [{"episode_id": "d", "start": {"client_id": 7}, '
                                 b'"observation": [0, 0, 0, 0]}]}', "headers": json_type}, 400,
         not_text + "7"),
    ]  # fmt: skip


def test_bad_input_gets_its_4xx_writes_nothing_and_the_server_keeps_serving(
    tmp_path: Path,
) -> None:
    data = tmp_path / "ds"
    config = cartpole_config(data, token=TOKEN, max_body_bytes=4096)
    with running_server(config) as server:
        metrics = _refuse_bad_input(server.url)
    _check_nothing_bad_written(data, metrics)


def test_rlpipe_serve_refuses_bad_input_alike(tmp_path: Path) -> None:
    """The same table against the production HTTP server (granian), not werkzeug's."""
    data, port = tmp_path / "ds", free_port()
    process = start_serve_process(data, port, "--token", TOKEN, "--max-body-bytes", "4096")
    try:
        metrics = _refuse_bad_input(f"http://127.0.0.1:{port}")
    finally:
        kill(process, signal.SIGTERM)
    _check_nothing_bad_written(data, metrics)


def _refuse_bad_input(url: str) -> str:
    """Every bad case gets its 4xx and a JSON error; the metrics afterwards."""
    for episode_id in ("e1", "old"):
        _post(url, "/v1/episodes", {"episode_id": episode_id})
    _post(url, "/v1/episodes/old/end", {"observation": OBS})
    _post(url, "/v1/episodes/e1/actions", {"observation": OBS, "request": 1})
    for path, kwargs, status, message in _bad_cases(url):
        kwargs.setdefault("headers", AUTH)
        response = requests.post(url + path, timeout=10, **kwargs)
        assert response.status_code == status, (path, response.text)
        got = response.json()["error"]
        assert got["status"] == status
        assert re.fullmatch(re.escape(message) + r"( \(.*\))?", got["message"]), got
        assert "Traceback" not in response.text
        assert _documented(path, "post", status), (path, status)
    for path in ("/index.html", "/v1", "/v1/../manifest.json", "/steps/"):  # "/": the page
        response = requests.get(url + path, headers=AUTH, timeout=5)
        assert response.status_code == 404 and response.json()["error"]["status"] == 404
    ok = _post(url, "/v1/episodes/e1/actions", {"observation": OBS, "request": 2})
    assert ok.status_code == 200
    _post(url, "/v1/episodes/e1/end", {"observation": OBS})
    return requests.get(url + "/v1/metrics", headers=AUTH, timeout=5).text


def _documented(path: str, method: str, status: int) -> bool:
    """The OpenAPI document lists this answer for this path (its template)."""
    for template, item in openapi.document(*cartpole_spaces())["paths"].items():
        if re.fullmatch(re.sub(r"\{[a-z_]+\}", "[^/]+", template), path):
            return str(status) in item[method]["responses"]
    return False


def _check_nothing_bad_written(data: Path, metrics: str) -> None:
    steps = pd.read_parquet(data / "steps")
    assert sorted(steps[steps["episode_id"] == "e1"]["t"]) == [0, 1]
    assert len(steps) == 2
    episodes = pd.read_parquet(data / "episodes")  # no empty episode from a refused batch
    assert sorted(episodes["episode_id"]) == ["e1", "old"]
    assert metric(metrics, "rlpipe_steps_accepted_total") == 2
    assert metric(metrics, "rlpipe_responses_total", status="401") == 2


def test_a_retried_request_is_answered_again_without_a_second_row(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        _post(server.url, "/v1/episodes", {"episode_id": "e"})
        _post(server.url, "/v1/episodes", {"episode_id": "e"})  # a retried start
        answers = [_post(server.url, "/v1/episodes/e/actions",
                         {"observation": OBS, "request": n}).json() for n in (1, 2, 2)]  # fmt: skip
        assert answers[1] == answers[2]
        ended = [_post(server.url, "/v1/episodes/e/end", {"observation": OBS, "request": 3})
                 for _ in range(2)]  # fmt: skip
        assert [r.json() for r in ended] == [{"episode_id": "e", "ended": True}] * 2
    assert len(pd.read_parquet(data / "steps")) == 2
    assert len(pd.read_parquet(data / "episodes")) == 1


def test_copies_of_an_end_sent_at_once_get_one_answer_and_store_once(tmp_path: Path) -> None:
    """Copies of a numbered request that arrive while the first still runs (a retry after a
    timeout) wait for it, then get its answer; for an end, too, which they find ended."""
    data, rounds, copies = tmp_path / "ds", 20, 4
    with running_server(cartpole_config(data)) as server:
        for r in range(rounds):
            _post(server.url, "/v1/episodes", {"episode_id": f"e{r}"})
            _post(server.url, f"/v1/episodes/e{r}/actions", {"observation": OBS, "request": 1})
            end = f"{server.url}/v1/episodes/e{r}/end"
            with ThreadPoolExecutor(copies) as pool:
                answers = list(pool.map(lambda url: requests.post(url, timeout=30, json={
                    "observation": OBS, "request": 2}), [end] * copies))  # fmt: skip
            assert [(a.status_code, a.json()) for a in answers] == [
                (200, {"episode_id": f"e{r}", "ended": True})] * copies  # fmt: skip
    assert len(pd.read_parquet(data / "steps")) == rounds
    assert len(pd.read_parquet(data / "episodes")) == rounds


def test_requests_without_a_length_get_the_same_answers_from_flask(tmp_path: Path) -> None:
    """A chunked body (no Content-Length) skips the WSGI fast path; Flask answers alike."""
    with running_server(cartpole_config(tmp_path / "ds", token=TOKEN)) as server:
        _post(server.url, "/v1/episodes", {"episode_id": "c"})

        def chunked(doc: Any) -> Any:
            yield json.dumps(doc).encode()

        def post(doc: Any, headers: dict[str, str]) -> requests.Response:
            return requests.post(server.url + "/v1/episodes/c/actions", data=chunked(doc),
                                 headers={"Content-Type": "application/json", **headers},
                                 timeout=10)  # fmt: skip

        assert post({"observation": OBS}, {}).json()["error"]["status"] == 401
        bad = post({"observation": [0, 0]}, AUTH)
        assert (bad.status_code, bad.json()["error"]["message"]) == (
            400, "field 'observation': expected float32 of shape (4,) per row, got shape (2,)"
        )  # fmt: skip
        assert post({"observation": OBS}, AUTH).json()["action"] in (0, 1)
        assert _post(server.url, "/v1/episodes/c/actions", {"observation": OBS}).status_code == 200
    assert len(pd.read_parquet(tmp_path / "ds" / "steps")) == 2


def test_idle_and_open_episodes_are_closed_as_truncated(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data, idle_timeout_s=0.3)) as server:
        _post(server.url, "/v1/episodes", {"episode_id": "idle", "seed": 1, "options": {"a": 1}})
        _post(server.url, "/v1/episodes/idle/actions", {"observation": OBS})
        wait_for(lambda: not len(server.service.episodes), 5, "the idle episode's close")
        answer = _post(server.url, "/v1/episodes/idle/actions", {"observation": OBS})
        assert answer.status_code == 409
        _post(server.url, "/v1/episodes", {"episode_id": "open"})
        _post(server.url, "/v1/episodes/open/actions", {"observation": OBS})
    steps = pd.read_parquet(data / "steps").set_index("episode_id")
    assert steps["truncated"].tolist() == [True, True]
    assert steps["terminated"].tolist() == [False, False]
    episodes = pd.read_parquet(data / "episodes").set_index("episode_id")
    assert episodes["end_reason"].tolist() == ["closed", "closed"]
    assert json.loads(episodes.loc["idle", "reset_options"]) == {"a": 1}


def test_a_multi_agent_step_whose_agents_are_all_done_is_taken(tmp_path: Path) -> None:
    """No agent left to act for: the answer has no actions (it was a 500, found by the fuzz
    test), and the episode goes on and ends."""
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        _post(server.url, "/v1/episodes", {"episode_id": "m"})
        url, both = server.url, {"observations": {"a": OBS, "b": OBS}}
        assert _post(url, "/v1/episodes/m/actions", both).status_code == 200
        done = {"observations": {"a": OBS}, "dones": {"a": True}}
        answer = _post(url, "/v1/episodes/m/actions", done)
        assert (answer.status_code, answer.json()["actions"]) == (200, {})
        assert _post(url, "/v1/episodes/m/end", {"observations": {"b": OBS}}).status_code == 200


def test_no_file_is_served_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flask serves ``./static`` of an app rooted in the working directory unless told not to."""
    monkeypatch.chdir(tmp_path)
    for name in ("static", "templates"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "secret.txt").write_text("do not serve")
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        for path in ("/static/secret.txt", "/templates/secret.txt", "/secret.txt", "/ds/"):
            response = requests.get(server.url + path, timeout=5)
            assert response.status_code == 404, path
            assert "do not serve" not in response.text


def test_serve_takes_spaces_from_a_file_and_a_token(tmp_path: Path) -> None:
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (3,), np.float32),
                                         "k": gym.spaces.Discrete(4)})  # fmt: skip
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    spaces_file = tmp_path / "spaces.json"
    spaces_file.write_text(json.dumps({
        "observation_space": spaces.space_to_json(observation_space),
        "action_space": spaces.space_to_json(action_space), "env_id": "MySim-v0",
    }))  # fmt: skip
    port = free_port()
    process = start_serve_process(tmp_path / "ds", port, "--spaces", str(spaces_file),
                                  "--token", TOKEN, "--sync", "always", env_id=None)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        served = requests.get(url + "/v1/spaces", headers=AUTH, timeout=5).json()
        assert spaces.space_from_json(served["observation_space"]) == observation_space
        assert served["env_id"] == "MySim-v0"
        assert requests.get(url + "/v1/spaces", timeout=5).status_code == 401
        _post(url, "/v1/episodes", {"episode_id": "d"})
        observation = {"x": [0.5, 0.0, -0.5], "k": 3}
        action = _post(url, "/v1/episodes/d/actions", {"observation": observation}).json()
        assert len(action["action"]) == 2
        _post(url, "/v1/episodes/d/end", {"observation": observation, "truncated": True})
    finally:
        kill(process, 15)
    steps = pd.read_parquet(tmp_path / "ds" / "steps")
    assert steps["truncated"].tolist() == [True]
    assert steps["observation"][0]["k"] == 3


@pytest.mark.parametrize("names", ["file", "checkpoints", "run"])
def test_policy_names_a_file_a_checkpoints_directory_or_a_run(tmp_path: Path, names: str) -> None:
    """``--policy``: what a trainer publishes elsewhere than the dataset's own checkpoints/."""
    run = tmp_path / "run"
    cartpole_checkpoint(run / "checkpoints", 3)
    newest = cartpole_checkpoint(run / "checkpoints", 4)
    policy = {"file": run / "checkpoints" / "policy-00000003.npz",
              "checkpoints": run / "checkpoints", "run": run}[names]  # fmt: skip
    cartpole_checkpoint(tmp_path / "ds" / "checkpoints", 9)  # the dataset's own: not served
    port = free_port()
    process = start_serve_process(tmp_path / "ds", port, "--policy", str(policy))
    url = f"http://127.0.0.1:{port}"
    try:
        served = 3 if names == "file" else 4
        assert requests.get(url + "/v1/health", timeout=5).json()["policy_version"] == served
        weights = requests.get(url + "/v1/weights", timeout=5)
        assert weights.content == (policy if names == "file" else newest).read_bytes()
        _post(url, "/v1/episodes", {"episode_id": "p"})
        answer = _post(url, "/v1/episodes/p/actions", {"observation": OBS}).json()
        assert answer["policy_version"] == served and answer["action_logp"] < 0
    finally:
        kill(process, 15)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data", "{tmp}/new"], "manifest"),
        (["--data", "{tmp}/new", "--spaces", "{tmp}/missing.json"], "--spaces: expected"),
    ],
)
def test_serve_refuses_what_it_cannot_serve(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.commands.cli import main

    assert main(["serve", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "variable", "message"),
    [
        (["--token", "a"], "b", "serve.token: expected the token from one of --token, "
                                "--token-file and RLPIPE_TOKEN, got '--token and RLPIPE_TOKEN'"),
        (["--token-file", "{tmp}/token"], "b",
         "serve.token: expected the token from one of --token, --token-file and RLPIPE_TOKEN, "
         "got '--token-file and RLPIPE_TOKEN'"),
        ([], " ", "serve.RLPIPE_TOKEN: expected a token, got 'an empty value'"),
        (["--token-file", "{tmp}/missing"], None,
         "serve.--token-file: expected a readable file with the token, got '{tmp}/missing (No "
         "such file or directory)'"),
        (["--token-file", "{tmp}/empty"], None,
         "serve.--token-file: expected a file whose first line is the token, got '{tmp}/empty "
         "(empty first line)'"),
        (["--token-file", "{tmp}"], None,
         "serve.--token-file: expected a readable file with the token, got '{tmp} (Is a "
         "directory)'"),
    ],
)  # fmt: skip
def test_serve_takes_its_token_from_one_source(
    tmp_path: Path,
    argv: list[str],
    variable: str | None,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--token, --token-file or RLPIPE_TOKEN; two at once, or a file without a token, is
    refused with the sources named, and never the token."""
    from pipeline.commands.cli import main

    (tmp_path / "token").write_text("a\n")
    (tmp_path / "empty").write_text("\nsecond\n")
    monkeypatch.delenv("RLPIPE_TOKEN", raising=False)
    if variable is not None:
        monkeypatch.setenv("RLPIPE_TOKEN", variable)
    given = [a.format(tmp=tmp_path) for a in argv]
    assert main(["serve", "--data", str(tmp_path / "ds"), "--env", "CartPole-v1", *given]) == 2
    assert capsys.readouterr().err == f"rlpipe serve: {message.format(tmp=tmp_path)}\n"
    assert not (tmp_path / "ds").exists()


def test_token_and_token_file_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.commands.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--data", "ds", "--token", "a", "--token-file", "t"])
    assert exit_info.value.code == 2
    assert "argument --token-file: not allowed with argument --token" in capsys.readouterr().err


def test_serve_help_says_why_the_token_belongs_in_a_file_or_the_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipeline.commands.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "in the process list: prefer RLPIPE_TOKEN or --token-file" in text
    assert "A command line is visible to every user of the machine (ps, /proc/PID/cmdline)" in text

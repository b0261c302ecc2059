"""Local-inference uploads on a real server: stored once across retries and restarts, refused
whole, a 503 with Retry-After when the writer falls behind, nothing acknowledged lost to a
``kill -9``."""

from __future__ import annotations

import io
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import pandas as pd
import pyarrow as pa
import requests
from server_fixtures import (
    cartpole_config,
    free_port,
    kill,
    metric,
    running_server,
    start_serve_process,
)

from pipeline.format import codec, samples


def _upload(url: str, client: str, seq: int, table: pa.Table, name: str = "steps") -> Any:
    response = _send_upload(url, client, seq, table, name)
    assert response.status_code == 200, response.text
    return response.json()


def _send_upload(url: str, client: str, seq: int, table: pa.Table,
                 name: str = "steps") -> requests.Response:  # fmt: skip
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    headers = {"Content-Type": "application/vnd.apache.arrow.stream", "X-Rlpipe-Client": client,
               "X-Rlpipe-Upload": str(seq), "X-Rlpipe-Table": name}  # fmt: skip
    return requests.post(url + "/v1/uploads", data=sink.getvalue(), headers=headers, timeout=10)


_JSON_ROW = {  # one CartPole step row as a JSON upload holds it
    "t": 0,
    "observation": [0.0] * 4,
    "action": 0,
    "reward": 1.0,
    "next_observation": [0.0] * 4,
    "terminated": True,
    "truncated": False,
}


def _steps_table(episode: str, n: int) -> pa.Table:
    env = gym.make("CartPole-v1")
    observations = samples.sample_batch(env.observation_space, n + 1, seed=0)
    return pa.table({
        "episode_id": [episode] * n, "t": list(range(n)),
        "observation": codec.to_arrow(env.observation_space, observations[:-1]),
        "action": [0] * n, "reward": [1.0] * n,
        "next_observation": codec.to_arrow(env.observation_space, observations[1:]),
        "terminated": [False] * (n - 1) + [True], "truncated": [False] * n,
    })  # fmt: skip


def test_uploads_are_stored_once_across_retries_and_restarts(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        assert _upload(server.url, "c1", 0, _steps_table("a", 10))["stored"] == {"steps": 10}
        again = _upload(server.url, "c1", 0, _steps_table("a", 10))
        assert again == {"duplicate": True, "stored": {"steps": 0}}
        json_rows = requests.post(server.url + "/v1/uploads", timeout=10, headers={
            "X-Rlpipe-Client": "c1", "X-Rlpipe-Upload": "1"}, json={"episodes": [{
                "episode_id": "a", "started_at": "2026-11-22T10:00:00+00:00",
                "ended_at": "2026-11-22T10:01:00+00:00", "length": 10, "return": 10.0,
                "end_reason": "terminated"}]})  # fmt: skip
        assert json_rows.json()["stored"] == {"episodes": 1}
    with running_server(cartpole_config(data)) as server:  # a new server forgot the numbers
        assert _upload(server.url, "c1", 0, _steps_table("a", 10))["stored"] == {"steps": 0}
        assert _upload(server.url, "c1", 2, _steps_table("b", 5))["stored"] == {"steps": 5}
    steps = pd.read_parquet(data / "steps")
    assert len(steps) == 15 and set(steps["client_id"]) == {"c1"}
    assert len(pd.read_parquet(data / "episodes")) == 1


def test_a_timed_upload_retried_after_a_restart_is_checked_within_its_times(
    tmp_path: Path,
) -> None:
    """Rows that carry their logged_at (PolicyClient's do) are looked up among stored rows of
    the same times only; a retry after a restart still stores nothing twice."""
    data = tmp_path / "ds"
    old = pa.array([datetime(2026, 11, 20, tzinfo=UTC)] * 10, pa.timestamp("us", tz="UTC"))
    with running_server(cartpole_config(data)) as server:
        stamped = _steps_table("a", 10).append_column("logged_at", old)
        assert _upload(server.url, "c1", 0, stamped)["stored"] == {"steps": 10}
    with running_server(cartpole_config(data)) as server:
        assert _upload(server.url, "c1", 0, stamped)["stored"] == {"steps": 0}
        assert _upload(server.url, "c1", 1, _steps_table("b", 5))["stored"] == {"steps": 5}
    assert len(pd.read_parquet(data / "steps")) == 15


def test_a_batch_stored_whole_and_retried_in_halves_after_a_restart_is_stored_once(
    tmp_path: Path,
) -> None:
    """The server that stored the batch died before answering, and its successor refuses bodies
    that large (413): the client sends it again in halves. Each half is checked against what is
    stored, not only the first upload after the restart, which let the second half in again."""
    data = tmp_path / "ds"
    when = pa.array([datetime(2026, 11, 20, tzinfo=UTC)] * 10, pa.timestamp("us", tz="UTC"))
    batch = _steps_table("a", 10).append_column("logged_at", when)
    with running_server(cartpole_config(data)) as server:
        assert _upload(server.url, "c1", 7, batch)["stored"] == {"steps": 10}
    left, right = 2**40 + 7 * 1024 + 2, 2**40 + 7 * 1024 + 3  # spool._halves(7)
    with running_server(cartpole_config(data)) as server:
        assert _upload(server.url, "c1", left, batch.slice(0, 5))["stored"] == {"steps": 0}
        assert _upload(server.url, "c1", right, batch.slice(5))["stored"] == {"steps": 0}
        assert _upload(server.url, "c1", 8, _steps_table("b", 4))["stored"] == {"steps": 4}
    steps = pd.read_parquet(data / "steps")
    assert len(steps) == 14 and not steps.duplicated(["episode_id", "t"]).any()


def test_a_server_behind_in_writing_answers_503_and_a_retry_stores_once(tmp_path: Path) -> None:
    """Every upload rolls a shard and one rolled shard waiting is the limit, with no wait for
    the writer: four clients uploading back to back soon meet a writer still writing a shard
    to Parquet."""
    from pipeline.dataset.writer_config import WriterConfig

    data = tmp_path / "ds"
    writer = WriterConfig(max_rows=1, sync="background")
    refused: list[tuple[str, int, requests.Response]] = []
    acknowledged: list[int] = []

    def upload_until_refused(client: str) -> None:
        for seq in range(300):
            if refused:
                return
            answer = _send_upload(server.url, client, seq, _steps_table(f"{client}-{seq}", 50))
            if answer.status_code == 503:
                refused.append((client, seq, answer))
                return
            acknowledged.append(answer.json()["stored"]["steps"])

    config = cartpole_config(data, max_backlog=1, backlog_wait_s=0, writer=writer)
    with running_server(config) as server:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(upload_until_refused, ["a", "b", "c", "d"]))
        assert refused, "1,200 uploads from four clients never found the writer behind"
        for *_, busy in refused:
            assert busy.headers["Retry-After"] == "1"
            assert re.fullmatch(r"the server is \d+ shards behind in writing; retry after 1 s",
                                busy.json()["error"]["message"])  # fmt: skip
        for client, seq, _ in refused:  # as a client does: again after Retry-After, until taken
            deadline = time.monotonic() + 30
            while True:
                retried = _send_upload(server.url, client, seq, _steps_table(f"{client}-{seq}", 50))
                if retried.status_code != 503 or time.monotonic() > deadline:
                    break
                time.sleep(float(retried.headers["Retry-After"]))
            assert retried.json()["stored"] == {"steps": 50}
        metrics = requests.get(server.url + "/v1/metrics", timeout=5).text
    assert (metric(metrics, "rlpipe_responses_total", status="503") or 0) >= 1
    steps = pd.read_parquet(data / "steps")
    assert len(steps) == sum(acknowledged) + 50 * len(refused)
    assert set(steps.groupby("episode_id").size()) == {50}


def test_a_writer_behind_for_a_moment_slows_answers_instead_of_refusing(
    tmp_path: Path,
) -> None:
    """The load above, with requests waiting for the writer to catch up (as by default, with a
    bound far above any commit here): no 503, and every upload stored. Refused instead, a
    client would sleep a whole Retry-After (1 s) for a queue that clears in milliseconds:
    online PPO's trainer, fed by clients committing every 50 ms, waited a second at every
    other update."""
    from pipeline.dataset.writer_config import WriterConfig

    data = tmp_path / "ds"
    writer = WriterConfig(max_rows=1, sync="background")
    config = cartpole_config(data, max_backlog=1, backlog_wait_s=30, writer=writer)
    with running_server(config) as server:

        def upload(client: str) -> list[int]:
            return [
                _send_upload(
                    server.url, client, seq, _steps_table(f"{client}-{seq}", 50)
                ).status_code
                for seq in range(50)
            ]

        with ThreadPoolExecutor(4) as pool:
            statuses = [code for codes in pool.map(upload, "abcd") for code in codes]
        metrics = requests.get(server.url + "/v1/metrics", timeout=5).text
    assert set(statuses) == {200}
    assert metric(metrics, "rlpipe_responses_total", status="503") is None
    assert len(pd.read_parquet(data / "steps")) == 4 * 50 * 50


def test_an_upload_with_a_nan_reward_is_refused_whole_on_the_fast_path(tmp_path: Path) -> None:
    """A batch with the exact step schema takes the writer's fast path; one NaN refuses it all,
    with the validating path's message naming the row."""
    from pipeline.format.schema import step_schema, steps_from_columns

    env = gym.make("CartPole-v1")
    table = _steps_table("n", 3)
    columns = {name: table.column(name) for name in table.column_names}
    columns["reward"] = pa.array([1.0, float("nan"), 1.0])
    batch = steps_from_columns(step_schema(env.observation_space, env.action_space),
                               {**columns, "reward": [1.0, 1.0, 1.0]},
                               env.observation_space, env.action_space)  # fmt: skip
    bad = batch.set_column(batch.schema.get_field_index("reward"),
                           batch.schema.field("reward"), columns["reward"])  # fmt: skip
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, bad.schema) as writer:
        writer.write_batch(bad)
    headers = {"Content-Type": "application/vnd.apache.arrow.stream", "X-Rlpipe-Client": "c",
               "X-Rlpipe-Upload": "0"}  # fmt: skip
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        refused = requests.post(server.url + "/v1/uploads", data=sink.getvalue(),
                                headers=headers, timeout=10)  # fmt: skip
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == (
            "row 1, field 'reward': expected finite values, got nan"
        )
        assert _upload(server.url, "c", 1, pa.Table.from_batches([batch]))["stored"] == {"steps": 3}
    assert len(pd.read_parquet(tmp_path / "ds" / "steps")) == 3


def test_sigkill_loses_nothing_acknowledged_and_a_restart_continues(tmp_path: Path) -> None:
    data, port = tmp_path / "ds", free_port()
    process = start_serve_process(data, port)
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[int] = []  # upload numbers the server answered 200 to
    in_flight: list[int] = []

    def upload_until_the_server_dies() -> None:
        for seq in range(10_000):
            try:
                _upload(url, "k", seq, _steps_table(f"k{seq}", 20))
            except requests.ConnectionError:
                in_flight.append(seq)
                return
            acknowledged.append(seq)

    try:
        requests.post(url + "/v1/episodes", json={"episode_id": "r"}, timeout=10)
        for n in range(1, 4):
            requests.post(
                url + "/v1/episodes/r/actions",
                timeout=10,
                json={"observation": [0.01, -0.02, 0.03, n], "request": n},
            )
        uploads = threading.Thread(target=upload_until_the_server_dies)
        uploads.start()
        while len(acknowledged) < 5 and uploads.is_alive():
            time.sleep(0.01)
    finally:
        kill(process)  # SIGKILL, mid-stream (and no server left behind if the test failed)
    uploads.join()
    process = start_serve_process(data, port)
    try:
        retried = _upload(url, "k", in_flight[0], _steps_table(f"k{in_flight[0]}", 20))
        _upload(url, "k", 10_001, _steps_table("after", 20))
    finally:
        kill(process, 15)  # SIGTERM: a clean shutdown
    steps = pd.read_parquet(data / "steps")
    stored = set(steps["episode_id"])
    assert {f"k{seq}" for seq in acknowledged} <= stored
    assert {"r", f"k{in_flight[0]}", "after"} <= stored
    # r: rows t=0, 1, and t=2, its pending step: carried across the kill, closed at the stop
    assert len(steps) == 20 * (len(acknowledged) + 2) + 3
    assert not steps.duplicated(["episode_id", "agent_id", "t"]).any()
    assert retried["stored"]["steps"] in (0, 20)  # 0 when the lost answer's rows were stored


def test_a_json_upload_with_a_float_in_an_integer_column_is_refused_not_truncated(
    tmp_path: Path,
) -> None:
    """pyarrow stores a Python float in an int64 column as its integer part (t 1.5 as 1); the
    server names the field instead, also when the upload's number was stored before, and
    writes nothing (Schemathesis found t 2.6e-42 stored as 0)."""
    row = {**_JSON_ROW, "episode_id": "f"}
    with running_server(cartpole_config(tmp_path / "ds")) as server:

        def send(seq: int, **changed: Any) -> requests.Response:
            headers = {"X-Rlpipe-Client": "c", "X-Rlpipe-Upload": str(seq)}
            body = {"steps": [{**row, **changed}]}
            return requests.post(server.url + "/v1/uploads", json=body, headers=headers, timeout=10)

        for seq in (0, 1):  # 1: a number stored just before
            if seq:
                assert send(seq).json() == {"stored": {"steps": 1}, "duplicate": False}
            for field, value in (("t", 1.5), ("policy_version", 2.0), ("reward", True)):
                refused = send(seq, **{field: value})
                assert refused.status_code == 400, (field, refused.text)
                message = refused.json()["error"]["message"]
                assert (
                    message.startswith(f"row 0, field '{field}': expected ")
                    and repr(value) in message
                )
    steps = pd.read_parquet(tmp_path / "ds" / "steps")
    assert steps[["episode_id", "t", "reward"]].values.tolist() == [["f", 0, 1.0]]


def test_an_upload_names_its_episodes_and_agents_as_the_step_verbs_do(tmp_path: Path) -> None:
    """An upload of episode '..' or of agent '' is refused whole (Schemathesis found both
    stored): such an episode could never be named in a URL, nor such an agent in a body."""
    row = {**_JSON_ROW, "episode_id": "ok"}
    bad = [("episode_id", ".."), ("episode_id", "x" * 201), ("episode_id", ""), ("agent_id", "")]
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        for seq, (field, value) in enumerate(bad):
            body = {"steps": [row, {**row, "t": 1, field: value}]}
            headers = {"X-Rlpipe-Client": "c", "X-Rlpipe-Upload": str(seq)}
            refused = requests.post(
                server.url + "/v1/uploads", json=body, headers=headers, timeout=10
            )
            assert refused.status_code == 400, (field, value, refused.text)
            assert refused.json()["error"]["message"].startswith(f"row 1, field '{field}'")
        refused = _send_upload(server.url, "c", 9, _steps_table(".", 2))  # as Arrow
        assert refused.status_code == 400
        assert refused.json()["error"]["message"].startswith("row 0, field 'episode_id'")
    assert (
        not (tmp_path / "ds" / "steps").exists() or pd.read_parquet(tmp_path / "ds" / "steps").empty
    )

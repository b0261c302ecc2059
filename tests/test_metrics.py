"""The server's metrics (server/metrics.py) as Prometheus reads them from ``GET /v1/metrics``:
counts per server, latency histograms by route and status, the gauges, the content type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import requests
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from server_fixtures import cartpole_config, metric, running_server

OBS = [0.0, 0.01, -0.02, 0.03]
ACTIONS = "/v1/episodes/{episode_id}/actions"


def _post(url: str, path: str, body: Any, chunked: bool = False) -> requests.Response:
    if chunked:  # no Content-Length: Flask's route answers, not the fast path
        data = iter([requests.models.complexjson.dumps(body).encode()])
        return requests.post(
            url + path, data=data, timeout=10, headers={"Content-Type": "application/json"}
        )
    return requests.post(url + path, json=body, timeout=10)


def test_each_server_counts_its_own_requests_steps_and_appends(tmp_path: Path) -> None:
    with (
        running_server(cartpole_config(tmp_path / "a")) as busy,
        running_server(cartpole_config(tmp_path / "b")) as idle,
    ):
        _post(busy.url, "/v1/episodes", {"episode_id": "e1"})
        _post(busy.url, "/v1/episodes/e1/actions", {"observation": OBS})
        _post(busy.url, "/v1/episodes/e1/actions", {"observation": OBS}, chunked=True)
        _post(busy.url, "/v1/episodes/e1/actions", {"observation": OBS, "reward": 1.0})
        refused = _post(busy.url, "/v1/episodes/e1/actions", {"observation": [1.0]})
        assert refused.status_code == 400
        _post(busy.url, "/v1/episodes/e1/end", {"observation": OBS})
        answer = requests.get(busy.url + "/v1/metrics", timeout=10)
        quiet = requests.get(idle.url + "/v1/metrics", timeout=10).text
    assert answer.headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4
    text = answer.text
    # three actions: rows t=0 and t=1 completed by the next action, t=2 by the end
    assert metric(text, "rlpipe_steps_accepted_total") == 3
    assert metric(text, "rlpipe_steps_rejected_total") == 1
    assert metric(text, "rlpipe_responses_total", status="200") == 4
    assert metric(text, "rlpipe_responses_total", status="201") == 1
    assert metric(text, "rlpipe_request_seconds_count", route=ACTIONS, status="200") == 3
    assert metric(text, "rlpipe_request_seconds_count", route=ACTIONS, status="400") == 1
    ended = {"route": "/v1/episodes/{episode_id}/end", "status": "200"}
    assert metric(text, "rlpipe_request_seconds_bucket", le="+Inf", **ended) == 1
    assert 0 < (metric(text, "rlpipe_request_seconds_sum", **ended) or 0) < 10
    appends = metric(text, "rlpipe_append_seconds_count") or 0
    assert appends >= 1
    assert metric(text, "rlpipe_append_seconds_bucket", le="+Inf") == appends
    assert metric(text, "rlpipe_open_episodes") == 0
    assert metric(text, "rlpipe_policy_version") == -1  # acting at random
    assert metric(text, "rlpipe_queue_depth") == 0
    assert metric(quiet, "rlpipe_steps_accepted_total") == 0
    assert metric(quiet, "rlpipe_responses_total", status="200") is None
    assert metric(quiet, "rlpipe_append_seconds_count") == 0


def test_openmetrics_is_answered_to_a_scraper_that_asks_for_it(tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        asked = {"Accept": "application/openmetrics-text; version=1.0.0"}
        answer = requests.get(server.url + "/v1/metrics", headers=asked, timeout=10)
    assert answer.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert answer.text.endswith("# EOF\n")
    assert "rlpipe_steps_accepted_total 0.0" in answer.text


def test_requests_outside_the_routes_are_counted_without_their_path(tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        for path in ("/nowhere", "/v1/episodes/secret-id/nowhere"):
            assert requests.get(server.url + path, timeout=10).status_code == 404
        requests.post(server.url + "/v1/episodes", json={"episode_id": "e1"}, timeout=10)
        text = requests.get(server.url + "/v1/metrics", timeout=10).text
    assert metric(text, "rlpipe_request_seconds_count", route="unrouted", status="404") == 2
    assert metric(text, "rlpipe_request_seconds_count", route="/v1/episodes", status="201") == 1
    assert "secret-id" not in text and "e1" not in text

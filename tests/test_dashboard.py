"""server/dashboard.py and server/stats.py: the live page and the JSON it reads, against a real
server with real CartPole clients in both inference modes (the page in a real browser:
tests/test_dashboard_browser.py)."""

from __future__ import annotations

import re
from pathlib import Path

import requests
from conftest import play_client
from openapi_contract import check_answer
from server_fixtures import cartpole_checkpoint, cartpole_config, running_server

from pipeline.client import PolicyClient


def test_stats_count_both_inference_modes_and_match_the_document(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    cartpole_checkpoint(data / "checkpoints", 3)
    with running_server(cartpole_config(data, policy_poll_s=0.05)) as server:
        remote = PolicyClient(server.url, "remote")
        local = PolicyClient(server.url, "local", spool_dir=tmp_path / "spool")
        play_client(remote, 3, seed=0)
        before = requests.get(server.url + "/v1/stats", timeout=5).json()
        assert [v["episodes"] for v in before["by_version"]] == [3]
        play_client(local, 2, seed=10)  # the figures kept for version 3 are worked out again
        local.flush()
        missing = requests.post(
            server.url + "/v1/episodes/nope/end", json={"observation": [0.0] * 4}, timeout=5
        )
        assert missing.status_code == 404
        answer = requests.get(server.url + "/v1/stats", timeout=5)
        document = requests.get(server.url + "/v1/openapi.json", timeout=5).json()
        check_answer(document, "/v1/stats", "get", answer)
        stats = answer.json()
        local.close()
        remote.close()
    assert stats["totals"]["episodes_ended"] == 5
    assert stats["totals"]["responses"]["404"] == 1
    assert stats["modes"]["remote"] == {"open_episodes": 0, "clients": 1}
    assert stats["modes"]["local"] == {"open_episodes": 0, "clients": 1}
    assert stats["policy"]["version"] == 3
    assert stats["policy"]["checkpoint"] == "policy-00000003.npz"
    assert stats["policy"]["lag"] == {"remote": 0, "local": 0}
    modes = sorted(e["mode"] for e in stats["recent_episodes"])
    assert modes == ["local"] * 2 + ["remote"] * 3
    assert [v["policy_version"] for v in stats["by_version"]] == [3]
    assert stats["by_version"][0]["episodes"] == 5
    assert sum(b["episodes"] for b in stats["over_time"]) == 5
    refused = stats["refused"][0]
    assert (refused["status"], refused["route"]) == (404, "/v1/episodes/{episode_id}/end")
    assert "not open on this server" in refused["message"]


def test_the_page_is_one_file_that_fetches_nothing_from_elsewhere(tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds", token="s3cret")) as server:
        page = requests.get(server.url + "/", timeout=5)
        assert page.status_code == 200  # public, as health: it holds no data
        assert page.headers["Content-Type"].startswith("text/html")
        assert "connect-src 'self'" in page.headers["Content-Security-Policy"]
        assert "const TOKEN_REQUIRED = true;" in page.text
        assert "s3cret" not in page.text
        assert not re.search(r"(src|href)=\"(?!data:)", page.text)  # no file, script or style
        assert "RlCharts" in page.text  # the chart script is inline
        bearer = {"Authorization": "Bearer s3cret"}
        for path in ("/index.html", "/dashboard.html", "/charts.js", "/static/x", "/../x"):
            other = requests.get(server.url + path, headers=bearer, timeout=5)
            assert (other.status_code, other.headers["Content-Type"]) == (404, "application/json")
        assert requests.get(server.url + "/v1/stats", timeout=5).status_code == 401
        assert requests.get(server.url + "/v1/stats", headers=bearer, timeout=5).ok


def test_uploads_that_never_end_their_episodes_cost_bounded_memory() -> None:
    import pyarrow as pa

    from server.stats import MAX_TRACKED, Stats

    stats = Stats()  # as in a server whose page nobody opens: nothing prunes by age
    for upload in range(3):
        ids = [f"u{upload}-{i}" for i in range(MAX_TRACKED // 2 + 1)]
        stats.uploaded("ingest", {"steps": pa.table({"episode_id": ids})})
    assert len(stats.local_open) <= MAX_TRACKED
    last = f"u2-{MAX_TRACKED // 2}"
    assert last in stats.local_open and "u0-0" not in stats.local_open  # the oldest went

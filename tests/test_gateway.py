"""A proxy's 502 and 504, for real: haproxy in front of one ``rlpipe serve`` answers one request
in four with 502 before the server sees it, and replaces one answer in four with a 504 after the
server acted on it. ``PolicyClient`` takes both as it takes no answer (the server behind may be
restarting): a remote call sends the same request again within its ``timeout``, and a local
client's upload goes to its spool and is sent again. Its calls are numbered, so a repeat of one
the server acted on writes nothing twice: every acknowledged step is stored once."""

from __future__ import annotations

import collections
from pathlib import Path

import requests
from test_deploy import (  # noqa: F401 (haproxy: the fixture)
    Follower,
    balancer,
    check_exactly_once,
    fleet,
    haproxy,
    play_local,
    play_remote,
    together,
)

from pipeline.client import PolicyClient

FAULTY = """
global
    maxconn 256

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s

frontend rlpipe
    bind "${RLPIPE_BIND}"
    http-request return status 502 content-type text/html string "<html><body><h1>502 Bad Gateway</h1></body></html>" if { rand(4) eq 0 }
    default_backend servers

backend servers
    http-response return status 504 content-type text/html string "<html><body><h1>504 Gateway Time-out</h1></body></html>" if { rand(4) eq 0 }
    server s1 "${RLPIPE_SERVER_1}"
"""  # noqa: E501 (haproxy's lines)


def test_clients_ride_out_a_proxys_502_and_504(haproxy: str, tmp_path: Path) -> None:  # noqa: F811
    data = tmp_path / "ds"
    with (
        fleet(data, count=1) as servers,
        balancer(haproxy, tmp_path, servers.addresses, FAULTY) as url,
    ):
        statuses = collections.Counter(
            requests.get(url + "/v1/health", timeout=10).status_code for _ in range(60)
        )
        assert statuses[502] and statuses[504] and statuses[200], statuses  # the faults happen
        follower = Follower(data)
        follower.start()
        remote = PolicyClient(url, "remote", timeout=30.0)
        local = PolicyClient(  # an upload and a weight pull every 50 ms
            url, "local", update_interval=0.05, upload_interval_s=0.05, spool_dir=tmp_path / "sp"
        )
        acked = together(
            lambda mine: play_remote(remote, [f"remote-{n}" for n in range(6)], mine),
            lambda mine: play_local(local, 20, mine, pace_s=0.002),
        )
        assert remote.close()
        check_exactly_once(follower, acked, data)

"""pipeline/client/servers.py: the addresses a client takes, and the server of each route key."""

from __future__ import annotations

import collections
import re
from typing import Any

import pytest

from pipeline.client import PolicyClient
from pipeline.client.servers import Servers, addresses_of, route_headers
from pipeline.errors import ConfigError

THREE = ["127.0.0.1:9901", "127.0.0.1:9902", "127.0.0.1:9903"]
KEYS = [f"episode-{n}" for n in range(3000)]


def _servers(addresses: Any) -> Servers:
    return Servers(addresses, None, 1.0, "", True)


def _homes(servers: Servers) -> dict[str, str]:
    return {key: servers.pick(key).url for key in KEYS}


@pytest.mark.parametrize(
    ("address", "got"),
    [
        ("", "''"),
        ("127.0.0.1:1,,127.0.0.1:2", "'127.0.0.1:1,,127.0.0.1:2'"),
        ([], "[]"),
        (["127.0.0.1:1", 2], "['127.0.0.1:1', 2]"),
        (9900, "9900"),
        (b"127.0.0.1:1", "b'127.0.0.1:1'"),
        ("127.0.0.1:1,http://127.0.0.1:1/", "'127.0.0.1:1,http://127.0.0.1:1/'"),
    ],
)
def test_addresses_are_checked_at_construction(address: Any, got: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"got {got}")) as raised:
        PolicyClient(address, "remote")
    assert raised.value.field == "address"


def test_addresses_come_as_one_a_list_or_a_comma_separated_string() -> None:
    urls = [f"http://{address}" for address in THREE]
    assert addresses_of(THREE) == addresses_of(",".join(THREE)) == urls
    assert addresses_of(" 127.0.0.1:9901 ") == ["http://127.0.0.1:9901"]


def test_keys_spread_evenly_and_the_order_of_the_addresses_does_not_matter() -> None:
    homes = _homes(_servers(THREE))
    assert homes == _homes(_servers(list(reversed(THREE))))
    shares = collections.Counter(homes.values())
    assert len(shares) == 3 and min(shares.values()) > 0.9 * len(KEYS) / 3, shares


def test_removing_a_server_moves_only_its_keys() -> None:
    before = _homes(_servers(THREE))
    after = _homes(_servers(THREE[:2]))
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == "http://127.0.0.1:9903"}


def test_the_route_key_travels_percent_encoded_as_an_id_in_a_path() -> None:
    assert route_headers("run/1 é") == {"X-Rlpipe-Route": "run%2F1%20%C3%A9"}

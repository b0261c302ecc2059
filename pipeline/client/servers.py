"""Several servers on one dataset: which one a request goes to, and the key a balancer hashes.

Every request that belongs to an episode carries the episode's route key in the header
``X-Rlpipe-Route`` (``docs/deploy.md``), percent-encoded as an episode id is in a path, so an
HTTP load balancer that hashes it keeps the episode on the one server that holds its state. A
client given several addresses makes the same choice itself: the server of a key is the one
that ranks first for it by rendezvous hashing (Thaler and Ravishankar, 1998), so removing or
adding one address moves only the keys of that address, and the order of the list does not
matter.

The keys (``docs/protocol.md``, "Many servers"): an episode started on its own is routed by its
episode id; the episodes a vector client starts in its batches, and the batches themselves, by
its client id; an upload by its client id, the key under which its server recognises a retry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import requests

from pipeline.client.transport import Http, Reply, Verify, base_url
from pipeline.errors import ConfigError, ServerUnavailable

ROUTE_HEADER = "X-Rlpipe-Route"
_ADDRESSES = "a 'host:port' or URL, or several as a list or a comma-separated string"


def route_headers(key: str) -> dict[str, str]:
    """The header that carries ``key`` (any text: quoted whole, as an id in a path is)."""
    return {ROUTE_HEADER: quote(key, safe="")}


def addresses_of(address: object) -> list[str]:
    """The server addresses in ``address``: one, a list of them, or a comma-separated string.

    Raises:
        ConfigError: naming ``address``, for another type, an empty entry, or a server named
            twice.
    """
    if isinstance(address, str):
        entries: list[Any] = address.split(",")
    elif isinstance(address, Sequence):
        entries = list(address)
    else:
        raise ConfigError("PolicyClient", "address", _ADDRESSES, address)
    if not entries or not all(isinstance(entry, str) and entry.strip() for entry in entries):
        raise ConfigError("PolicyClient", "address", _ADDRESSES, address)
    urls = [base_url(entry) for entry in entries]
    twice = sorted({url for url in urls if urls.count(url) > 1})
    if twice:
        raise ConfigError("PolicyClient", "address", f"each server once ({twice} twice)", address)
    return urls


class Servers:
    """One :class:`Http` per address, and the server of each route key."""

    def __init__(
        self,
        address: object,
        session: requests.Session | None,
        timeout: float,
        token: str | None,
        verify: Verify,
    ) -> None:
        self.all = [Http(url, session, timeout, token, verify) for url in addresses_of(address)]
        self._salts = [url.encode() + b"\n" for url in (http.url for http in self.all)]

    def pick(self, key: str) -> Http:
        """The server of route key ``key``: the address that ranks first for it."""
        if len(self.all) == 1:
            return self.all[0]
        data = key.encode("utf-8", "surrogatepass")
        scores = [hashlib.blake2b(salt + data, digest_size=8).digest() for salt in self._salts]
        return self.all[scores.index(max(scores))]

    def first(self, key: str, path: str, params: dict[str, Any] | None = None) -> Reply:
        """``GET path`` from any server that answers, the server of ``key`` first (the spaces
        and the weights are the same on every server of a dataset): one quick try each, then
        the usual patience with the server of ``key``."""
        home = self.pick(key)
        others = [http for http in self.all if http is not home]
        for http in [home, *others] if others else []:
            try:
                return http.call("GET", path, patience_s=0, params=params)
            except ServerUnavailable:
                continue
        return home.call("GET", path, params=params)

    def close(self) -> None:
        for http in self.all:
            http.close()

"""A real S3 endpoint for the tests: moto in server mode on 127.0.0.1, and a bucket per test.

moto (``moto[server]``) answers the S3 API over HTTP on a port the OS picks; deltalake, pyarrow
and Polars reach it as they reach AWS, through an endpoint URL and keys. Nothing of rlpipe's is
mocked: the tests talk to it over the network, as to any S3-compatible store.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

KEY_ID = "rlpipe-test-key-id"
SECRET = "rlpipe-test-secret-never-printed"


@dataclass(frozen=True)
class Bucket:
    """An empty bucket on the moto endpoint, with the options that reach it."""

    endpoint: str
    name: str
    state_dir: Path

    @property
    def options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
        }

    def uri(self, prefix: str = "ds") -> str:
        return f"s3://{self.name}/{prefix}"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(moto_endpoint: str, tmp_path: Path) -> Bucket:
    import boto3

    name = f"rlpipe-{secrets.token_hex(4)}"
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
    return Bucket(moto_endpoint, name, tmp_path / "state")

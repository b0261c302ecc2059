"""``rlpipe serve`` over HTTPS and PolicyClient's certificate check, with a CA made by the test.

trustme makes a throwaway CA and a certificate for 127.0.0.1 signed by it; a second CA stands
for "some other CA" (the certificate of an attacker in the middle, or a server the client was
not told about). The server is a real ``rlpipe serve`` (granian) on an OS-picked port.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import requests
import trustme
from conftest import play_client
from server_fixtures import cartpole_config, process_tree, running_server

from pipeline.client import PolicyClient, Unauthorized
from pipeline.commands.cli import main
from pipeline.errors import ConfigError, ServerError
from server import process

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "tls-test-token-3f9a"


@dataclass
class Pki:
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that did not
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    paths = Pki(*(directory / name for name in ("ca.pem", "other.pem", "cert.pem", "key.pem")))
    ca.cert_pem.write_to_path(paths.ca)
    other.cert_pem.write_to_path(paths.other_ca)
    for n, pem in enumerate(issued.cert_chain_pems):
        pem.write_to_path(paths.cert, append=n > 0)
    issued.private_key_pem.write_to_path(paths.key)
    return paths


@dataclass
class Served:
    url: str
    server: subprocess.Popen[str]
    data: Path


def _serve(pki: Pki, data: Path, *token: str, env: dict[str, str] | None = None) -> Served:
    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
    environment = {k: v for k, v in os.environ.items() if k != "RLPIPE_TOKEN"}
    environment |= {"PYTHONPATH": str(ROOT), **(env or {})}
    arguments = ["--data", str(data), "--env", "CartPole-v1", *tls, *token]
    server, url = process.start(arguments, env=environment, cwd=ROOT)
    return Served(url, server, data)


def _stop(served: Served) -> None:
    served.server.send_signal(signal.SIGTERM)
    assert served.server.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server over HTTPS whose token is read from a file."""
    directory = tmp_path_factory.mktemp("served")
    token_file = directory / "token"
    token_file.write_text(f"  {TOKEN}  \nthe first line is the token; the rest is ignored\n")
    served = _serve(pki, directory / "ds", "--token-file", str(token_file))
    yield served
    _stop(served)


def test_remote_and_local_clients_play_over_https(pki: Pki, tmp_path: Path) -> None:
    """A client that trusts the server's CA plays in both modes; local mode's uploads and
    weight pulls take the same verified connection."""
    served = _serve(pki, tmp_path / "ds", env={"RLPIPE_TOKEN": TOKEN})
    try:
        assert served.url.startswith("https://127.0.0.1:")
        remote = PolicyClient(served.url, "remote", token=TOKEN, verify=pki.ca)
        remote_steps = sum(play_client(remote, 2, seed=0))
        assert remote.close()
        local = PolicyClient(
            served.url,
            "local",
            token=TOKEN,
            verify=str(pki.ca),
            spool_dir=tmp_path / "spool",
            upload_interval_s=0.05,
        )
        local_steps = sum(play_client(local, 2, seed=10))
        assert local.close()
    finally:
        _stop(served)
    steps = pd.read_parquet(tmp_path / "ds" / "steps")
    assert len(steps) == remote_steps + local_steps
    assert steps["episode_id"].nunique() == 4
    assert not list((tmp_path / "spool").glob("*.arrows"))


def test_a_context_of_ones_own_verifies_too(pki: Pki, tls_server: Served) -> None:
    context = ssl.create_default_context(cafile=pki.ca)
    client = PolicyClient(tls_server.url, "remote", token=TOKEN, verify=context)
    episode_id = client.start_episode()
    client.end_episode(episode_id, [0.0, 0.0, 0.0, 0.0])
    assert client.close()


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_a_certificate_from_another_ca_is_refused_at_once(
    pki: Pki, tls_server: Served, mode: str, tmp_path: Path
) -> None:
    """Not retried as a server that is down (that would spool forever in local mode), and
    nothing is sent: the token never reaches a server the client cannot trust."""
    refused = (
        re.escape(f"no answer: {tls_server.url}: the server's TLS certificate was refused ")
        + r"\(unable to get local issuer certificate\); if a CA of your own signed it, pass "
        r"that CA: PolicyClient\(\.\.\., verify=PATH\)"
    )
    started = time.monotonic()
    with pytest.raises(ServerError, match=refused):
        client = PolicyClient(
            tls_server.url,
            mode,
            token=TOKEN,
            verify=pki.other_ca,
            spool_dir=tmp_path / "spool",
            timeout=30,
        )
        client.start_episode()
    assert time.monotonic() - started < 5  # well inside the 30 s timeout: not retried


def test_a_requests_session_verifies_against_the_ca_given(pki: Pki, tls_server: Served) -> None:
    with requests.Session() as session:
        client = PolicyClient(tls_server.url, "remote", session=session, token=TOKEN, verify=pki.ca)
        client.end_episode(client.start_episode(), [0.0, 0.0, 0.0, 0.0])
        assert client.close()
        client = PolicyClient(
            tls_server.url, "remote", session=session, token=TOKEN, verify=pki.other_ca, timeout=30
        )
        started = time.monotonic()
        with pytest.raises(ServerError, match="certificate was refused"):
            client.start_episode()
        assert time.monotonic() - started < 5


def test_the_systems_cas_refuse_a_private_ca(tls_server: Served) -> None:
    client = PolicyClient(tls_server.url, "remote", token=TOKEN, timeout=30)
    with pytest.raises(ServerError, match="certificate was refused"):
        client.start_episode()


def test_plain_http_to_an_https_server_says_so(tls_server: Served) -> None:
    address = tls_server.url.replace("https://", "http://")
    client = PolicyClient(address, "remote", token=TOKEN, timeout=30)
    started = time.monotonic()
    with pytest.raises(ServerError, match=re.escape("the server speaks TLS only; use https://")):
        client.start_episode()
    assert time.monotonic() - started < 5


def test_https_to_a_plain_http_server_says_so(pki: Pki, tmp_path: Path) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        address = server.url.replace("http://", "https://")
        client = PolicyClient(address, "remote", verify=pki.ca, timeout=30)
        with pytest.raises(ServerError, match="the server does not speak TLS; use http://"):
            client.start_episode()


def test_the_token_file_is_the_servers_token(pki: Pki, tls_server: Served) -> None:
    """The first line of --token-file, stripped; a wrong token is refused."""
    client = PolicyClient(tls_server.url, "remote", token="wrong", verify=pki.ca)
    with pytest.raises(Unauthorized):
        client.start_episode()
    client = PolicyClient(tls_server.url, "remote", token=TOKEN, verify=pki.ca)
    client.start_episode()
    assert client.close()


def test_the_token_is_in_no_process_list(pki: Pki, tls_server: Served, tmp_path: Path) -> None:
    """Given by --token-file or RLPIPE_TOKEN, the token is not in any command line of the
    server's processes (the supervisor and its worker), which every user can read."""
    from_variable = _serve(pki, tmp_path / "ds", env={"RLPIPE_TOKEN": TOKEN})
    try:
        for served in (tls_server, from_variable):
            pids = process_tree(served.server.pid)
            assert len(pids) == 2  # granian's supervisor and its one worker
            for pid in pids:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                assert b"serve" in cmdline and TOKEN.encode() not in cmdline
    finally:
        _stop(from_variable)


def test_the_client_takes_rlpipe_token_from_the_environment(
    pki: Pki, tls_server: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLPIPE_TOKEN", TOKEN)
    client = PolicyClient(tls_server.url, "remote", verify=pki.ca)
    client.start_episode()
    assert client.close()
    client = PolicyClient(tls_server.url, "remote", verify=pki.ca, token="")  # "": none
    with pytest.raises(Unauthorized):
        client.start_episode()


# --- refused before anything listens -----------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (("cert", None), "serve.--tls-cert/--tls-key: expected --tls-cert and --tls-key "
                         "together, got '--tls-cert alone'"),
        ((None, "key"), "serve.--tls-cert/--tls-key: expected --tls-cert and --tls-key "
                        "together, got '--tls-key alone'"),
        (("{tmp}/missing.pem", "key"),
         "serve.--tls-cert: expected a readable PEM file, got '{tmp}/missing.pem (No such file "
         "or directory)'"),
        (("key", "key"), "serve.--tls-cert: expected a PEM file with a certificate, got "
                         "'{key} (no PEM certificate in it)'"),
        (("cert", "cert"), "serve.--tls-key: expected a PEM file with a private key, got "
                           "'{cert} (no PEM private key in it)'"),
        (("cert", "other_key"), "serve.--tls-cert/--tls-key: expected a PEM certificate chain "
                                "and the private key that belongs to it, got '{cert}, "
                                "{other_key} (KEY_VALUES_MISMATCH)'"),
        (("cert", "encrypted_key"), "serve.--tls-key: expected an unencrypted private key, got "
                                    "'{encrypted_key} (encrypted)'"),
    ],
)  # fmt: skip
def test_serve_refuses_tls_files_it_cannot_use(
    pki: Pki,
    tmp_path: Path,
    files: tuple[str | None, str | None],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Named with the file and what is wrong, before the dataset is made or a port bound."""
    from cryptography.hazmat.primitives import serialization

    other = trustme.CA().issue_cert("127.0.0.1")
    other.private_key_pem.write_to_path(tmp_path / "other_key.pem")
    key = serialization.load_pem_private_key(pki.key.read_bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"password"),
    )
    (tmp_path / "encrypted_key.pem").write_bytes(encrypted)
    names = {
        "cert": str(pki.cert),
        "key": str(pki.key),
        "tmp": str(tmp_path),
        "other_key": str(tmp_path / "other_key.pem"),
        "encrypted_key": str(tmp_path / "encrypted_key.pem"),
    }
    argv = ["serve", "--data", str(tmp_path / "ds"), "--env", "CartPole-v1"]
    for flag, name in zip(("--tls-cert", "--tls-key"), files, strict=True):
        if name is not None:
            argv += [flag, names.get(name, name.format(**names))]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"rlpipe serve: {message.format(**names)}\n"
    assert not (tmp_path / "ds").exists()


# --- the client's verify ------------------------------------------------------------------


def test_verify_false_is_refused_with_the_way_to_do_it_on_purpose() -> None:
    with pytest.raises(ConfigError, match=r"PolicyClient\.verify: .*ssl\.CERT_NONE"):
        PolicyClient("https://127.0.0.1:1", "remote", verify=False)


def test_a_ca_for_a_plain_http_address_is_refused(pki: Pki) -> None:
    """The user meant TLS; plain HTTP would carry the token in clear."""
    expected = re.escape(
        "PolicyClient.address: expected an https:// address, as verify names how to check its "
        "certificate, got 'http://127.0.0.1:1'"
    )
    with pytest.raises(ConfigError, match=expected):
        PolicyClient("127.0.0.1:1", "remote", verify=pki.ca)


def test_a_missing_ca_bundle_is_named(tmp_path: Path) -> None:
    expected = re.escape(
        f"PolicyClient.verify: expected a readable PEM file of CAs, got "
        f"'{tmp_path}/none.pem (No such file or directory)'"
    )
    with pytest.raises(ConfigError, match=expected):
        PolicyClient("https://127.0.0.1:1", "remote", verify=tmp_path / "none.pem")

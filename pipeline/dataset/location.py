"""Where a dataset lives: a local path or a URI (``s3://bucket/prefix``, ``gs://...``, ``az://...``).

One :class:`Location` says how to reach a dataset three ways: the Delta table URIs and storage
options that ``deltalake`` takes, a ``pyarrow.fs`` filesystem for rlpipe's own Parquet and
manifest I/O, and a local state directory for what needs ``fsync`` and file locks (the
write-ahead log, a server's journal), which object stores lack. Endpoint and credentials come
from the standard environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), and
``storage_options`` given in Python (or ``--storage-option KEY=VALUE``) override them.

Errors name the URI and what failed (:func:`storage_failure`); secrets are never printed.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from pipeline.errors import DatasetError

# Environment variables read for an S3 location, and the storage option each becomes.
_S3_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
)
_DEFAULT_REGION = "us-east-1"
# Words in an option's name that mark its value as a secret, never printed.
_SECRET_WORDS = ("SECRET", "TOKEN", "KEY", "PASSWORD", "SAS", "CREDENTIAL")
_PUBLIC_KEYS = ("AWS_ACCESS_KEY_ID",)  # an access key id names the key; it is no secret


@dataclass(frozen=True)
class Location:
    """A dataset's address.

    Attributes:
        uri: an absolute local path, or ``scheme://bucket/prefix`` without a trailing slash.
        storage_options: options for ``deltalake`` (endpoint, credentials), env defaults included.
        state_dir: the local directory of the write-ahead log and the server's journal: the
            dataset itself when local, else ``$XDG_STATE_HOME/rlpipe/<hash of the URI>``.
    """

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets
    state_dir: Path = Path()

    def __str__(self) -> str:  # what messages that name the dataset print: never its options
        return self.uri

    @property
    def local(self) -> bool:
        return "://" not in self.uri

    @property
    def scheme(self) -> str:
        return "" if self.local else self.uri.split("://", 1)[0]

    @cached_property
    def filesystem(self) -> pafs.FileSystem:
        """A pyarrow filesystem that reaches the dataset with the same options as deltalake."""
        if self.local:
            return pafs.LocalFileSystem()
        if self.scheme in ("s3", "s3a"):
            return _s3_filesystem(self.storage_options)
        filesystem, _ = pafs.FileSystem.from_uri(self.uri)
        return filesystem

    @property
    def root(self) -> str:
        """The dataset's path inside :attr:`filesystem`."""
        if self.local:
            return self.uri
        parsed = urlparse(self.uri)
        return f"{parsed.netloc}{parsed.path}".rstrip("/")

    def path(self, *parts: str) -> str:
        """A filesystem path under the dataset (``path("steps", "date=...")``)."""
        return "/".join([self.root, *parts])

    def table_uri(self, table: str) -> str:
        """The URI deltalake opens for ``table`` (``steps`` or ``episodes``)."""
        return f"{self.uri}/{table}"

    def hide_secrets(self, text: str) -> str:
        """``text`` with every secret option's value blotted out."""
        for key, value in self.storage_options.items():
            if value and len(value) >= 4 and _is_secret(key):
                text = text.replace(value, "***")
        return text


def locate(
    path: str | Path | Location,
    storage_options: Mapping[str, str] | None = None,
    state_dir: str | Path | None = None,
) -> Location:
    """The :class:`Location` of a local path or URI (``s3://bucket/prefix``): its
    ``storage_options`` override the environment's, and ``state_dir`` is where a remote
    dataset's write-ahead log and journal live."""
    if isinstance(path, Location):
        return path
    text = str(path)
    given = {str(k): str(v) for k, v in (storage_options or {}).items()}
    if "://" not in text:
        root = os.path.abspath(text)  # links kept: errors name what was given
        return Location(root, given, Path(state_dir) if state_dir else Path(root))
    uri = text.rstrip("/")
    if uri.startswith("file://"):
        return locate(uri[len("file://") :], given, state_dir)
    scheme = uri.split("://", 1)[0]
    options = {**_env_options(scheme), **given}
    if scheme in ("s3", "s3a"):
        options = _s3_defaults(options)
    state = Path(state_dir) if state_dir else default_state_dir(uri)
    return Location(uri, options, state)


def default_state_dir(uri: str) -> Path:
    """``$XDG_STATE_HOME/rlpipe/<hash of the URI>`` (``~/.local/state`` when unset)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(base) / "rlpipe" / digest


def _env_options(scheme: str) -> dict[str, str]:
    if scheme not in ("s3", "s3a"):
        return {}
    return {name: os.environ[name] for name in _S3_ENV if os.environ.get(name)}


def _option(options: Mapping[str, str], *names: str) -> str | None:
    """An option's value under any of ``names``, case-insensitively."""
    wanted = {name.lower() for name in names}
    for key, value in options.items():
        if key.lower() in wanted:
            return value
    return None


def _s3_defaults(options: dict[str, str]) -> dict[str, str]:
    """S3 options as deltalake wants them: a region, plain HTTP allowed for an ``http://``
    endpoint, and commits by conditional put (``If-None-Match``), which makes concurrent
    writers safe without a DynamoDB lock (delta-rs 1.x; measured with 4 writers on moto)."""
    region = _option(options, "AWS_REGION", "region", "aws_default_region")
    options.setdefault("AWS_REGION", region or _DEFAULT_REGION)
    options.pop("AWS_DEFAULT_REGION", None)
    endpoint = _option(options, "AWS_ENDPOINT_URL", "aws_endpoint", "endpoint_url", "endpoint")
    if endpoint and endpoint.startswith("http://") and not _option(options, "AWS_ALLOW_HTTP"):
        options["AWS_ALLOW_HTTP"] = "true"
    if not _option(options, "conditional_put", "aws_conditional_put"):
        options["conditional_put"] = "etag"
    return options


def _s3_filesystem(options: Mapping[str, str]) -> pafs.S3FileSystem:
    endpoint = _option(options, "AWS_ENDPOINT_URL", "aws_endpoint", "endpoint_url", "endpoint")
    access = _option(options, "AWS_ACCESS_KEY_ID", "access_key_id")
    secret = _option(options, "AWS_SECRET_ACCESS_KEY", "secret_access_key")
    kwargs: dict[str, object] = {
        "region": _option(options, "AWS_REGION", "region") or _DEFAULT_REGION,
        "connect_timeout": 5.0,
        "request_timeout": 30.0,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
        # a shard smaller than a multipart part goes up in one PutObject on close, not three
        # requests (create, part, complete)
        "allow_delayed_open": True,
    }
    if access and secret:  # else pyarrow's own chain (profile, instance role) finds them
        kwargs.update(
            access_key=access,
            secret_key=secret,
            session_token=_option(options, "AWS_SESSION_TOKEN", "session_token", "token"),
        )
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = f"{parsed.netloc}{parsed.path}".rstrip("/")
        kwargs["scheme"] = parsed.scheme
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})


def _is_secret(key: str) -> bool:
    upper = key.upper()
    return upper not in _PUBLIC_KEYS and any(word in upper for word in _SECRET_WORDS)


# What a storage error's text says, and what that means to the user, first match wins.
_CAUSES = (
    (r"NoSuchBucket|bucket does not exist|bucket .* not found", "no such bucket"),
    (
        r"InvalidAccessKeyId|SignatureDoesNotMatch|Access.?Denied|Forbidden|\b403\b|"
        r"invalid.*credential|Unauthorized|\b401\b",
        "no permission (a wrong key or secret, or one without access to it)",
    ),
    (
        r"onnect|unreachable|timed out|Timeout|error sending request|dns error|resolve host|"
        r"Could not resolve|Network",
        "the endpoint cannot be reached",
    ),
)


def storage_failure(location: Location, doing: str, error: BaseException) -> DatasetError:
    """A :class:`DatasetError` naming the URI, what rlpipe was doing, and why it failed (no
    bucket, no permission, an unreachable endpoint) in plain words; secrets blotted out."""
    text = " ".join(str(error).split())
    text = text.split(" 0: <unknown>")[0][:500]  # delta-rs appends a backtrace
    cause = next((words for pattern, words in _CAUSES if re.search(pattern, text, re.I)), None)
    endpoint = _option(location.storage_options, "AWS_ENDPOINT_URL", "endpoint_url", "endpoint")
    where = location.uri + (f" (endpoint {endpoint})" if endpoint else "")
    message = f"{where}: {doing} failed: {cause + ': ' if cause else ''}{text}"
    return DatasetError(location.hide_secrets(message))

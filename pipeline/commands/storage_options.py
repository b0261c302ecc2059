"""``--storage-option KEY=VALUE``: endpoint and credentials of a dataset URI on the command line.

Every command that names a dataset takes the flag, repeatable, as ``storage_options=`` in Python
(``pipeline.dataset.location``): the options given override the standard environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). A value is never printed: errors about an
option name its key and the flag, and show a secret's value as ``***``.
"""

from __future__ import annotations

import argparse
import re
from urllib.parse import urlparse

from pipeline.errors import ConfigError

FLAG = "--storage-option"
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_BOOLEAN_KEYS = ("AWS_ALLOW_HTTP", "AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_SKIP_SIGNATURE")
_URL_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "ENDPOINT_URL", "ENDPOINT")
HELP = (
    "an option for a dataset URI, as deltalake names them (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
    "AWS_SECRET_ACCESS_KEY, AWS_REGION, ...); repeatable; overrides the environment variable of "
    "the same name; values are never printed. Give secrets in the environment instead: a "
    "command line is visible to every user of the machine"
)


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable ``--storage-option KEY=VALUE`` flag to a command's parser."""
    parser.add_argument(
        FLAG, action="append", default=[], metavar="KEY=VALUE", dest="storage_option", help=HELP
    )


def storage_options(command: str, given: list[str] | None) -> dict[str, str]:
    """The ``--storage-option`` flags of ``command`` as a dict.

    Raises:
        ConfigError: naming the flag, for a word without ``=``, a malformed key, a key given
            twice, or a value a known key cannot take (a boolean, an endpoint URL); the value
            itself is left out.
    """
    options: dict[str, str] = {}
    for word in given or []:
        key, equals, value = word.partition("=")
        key = key.strip()
        if not equals or not _KEY.fullmatch(key):  # the word may be a secret: never shown
            shown = "a word without '='" if not equals else "a malformed key before '='"
            raise ConfigError(command, "storage_option", f"{FLAG} KEY=VALUE", shown)
        if key.upper() in (k.upper() for k in options):
            raise ConfigError(command, "storage_option", f"each key once in {FLAG}", key)
        _check_value(command, key, value)
        options[key] = value
    return options


def _check_value(command: str, key: str, value: str) -> None:
    upper = key.upper()
    if upper in _BOOLEAN_KEYS and value.lower() not in ("true", "false"):
        raise ConfigError(
            command, "storage_option", f"{FLAG} {key}=true or {key}=false", f"{key}={value}"
        )
    if upper in _URL_KEYS:
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(
                command,
                "storage_option",
                f"{FLAG} {key}=http(s)://HOST[:PORT], an endpoint URL",
                f"{key}={value!r}",
            )

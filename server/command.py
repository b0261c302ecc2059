"""``rlpipe serve``: the policy server on granian (see :mod:`server.host` for why).

Flask and granian are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.commands.storage_options import add_storage_options, storage_options
from pipeline.errors import ConfigError
from server import affinity

COMPACT_EVERY_S = 600.0  # rlpipe serve --compact-every's default

if TYPE_CHECKING:
    from server.config import ServerConfig
    from server.host import Tls

TOKEN_VARIABLE = "RLPIPE_TOKEN"
_SECRETS = f"""\
the token: give it in the environment variable {TOKEN_VARIABLE} or in --token-file FILE
rather than with --token. A command line is visible to every user of the machine
(ps, /proc/PID/cmdline); a process's environment is readable by its owner alone.
Across a network, serve HTTPS too (--tls-cert, --tls-key): a bearer token sent over
plain HTTP can be read by anyone on the way."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the policy server: simulators connect, steps land in DIR",
        epilog=_SECRETS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data",
        required=True,
        help="the dataset: a directory, or a URI (s3://bucket/prefix: see --policy)",
    )
    add_storage_options(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--env", help="a gymnasium id whose spaces the dataset takes")
    source.add_argument(
        "--spaces",
        type=Path,
        help="a JSON file with observation_space and action_space (an external simulator's spaces)",
    )
    parser.add_argument(
        "--policy",
        type=Path,
        help="a checkpoint, or a directory of them (default: DIR/checkpoints; a dataset on object "
        "storage has none: without --policy its server acts at random, as before a first one)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9900)
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        help="require 'Authorization: Bearer TOKEN' on requests (every user of the machine can "
        f"read it in the process list: prefer {TOKEN_VARIABLE} or --token-file)",
    )
    token.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="the token is the first line of FILE (keep it readable by you alone: chmod 600)",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve HTTPS (TLS 1.3) with this PEM certificate chain, the server's own first",
    )
    parser.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="the PEM private key of --tls-cert"
    )
    parser.add_argument("--threads", type=int, default=8, help="request threads")
    parser.add_argument(
        "--cpu",
        type=_cpu,
        default=affinity.AUTO,
        metavar="{auto,off,N}",
        help="the one CPU the request threads run on (default auto: the highest-numbered one "
        "no other rlpipe server on the machine holds). The GIL runs their Python one thread at "
        "a time anyway, and on one CPU they run it from warm caches: 20-35%% more steps/s "
        "with simulators on the same machine (docs/deploy.md, 'CPUs'). off: wherever the OS "
        "puts them",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=64 * 2**20, help="larger request bodies get 413"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="seconds before an idle episode is closed as truncated",
    )
    parser.add_argument(
        "--sync",
        choices=("background", "always"),
        default="background",
        help="when a step is acknowledged. background (default): a 2xx means its rows are "
        "written to the log file, so they survive a crash or kill -9 of the server; the log is "
        "fsynced every 50 ms, so a power cut or kernel crash can lose the last 50 ms of "
        "acknowledged steps. always: a 2xx means the rows are fsynced, so they survive a power "
        "cut too, at 1.5-4 ms more per request",
    )
    parser.add_argument(
        "--commit-age",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="commit a shard at least this often (default 1 s): a trainer following the dataset "
        "sees steps this late at most; longer ages make fewer, larger files (episode summaries "
        "commit at most once a second)",
    )
    parser.add_argument(
        "--policy-poll",
        type=float,
        default=0.2,
        metavar="SECONDS",
        help="look for a newer checkpoint at most this often (default 0.2 s): how long a "
        "published policy may wait before remote inference and weight pulls see it",
    )
    parser.add_argument(
        "--compact-every",
        type=float,
        default=COMPACT_EVERY_S,
        metavar="SECONDS",
        help=f"compact the dataset this often (default {COMPACT_EVERY_S:g} s; 0: never), each "
        "pass in a process of its own (rlpipe compact, with the tables' own retention). Every "
        "commit adds a small file, and a commit costs more the more files the table holds "
        "(measured in the committing thread: 2.5 ms of CPU at 200, 12.7 ms at 2,200): a server "
        "left without it slows down by the hour. Safe with other servers writing and trainers "
        "following; of several servers, one compacts at a time and the others skip",
    )
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    from server.host import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tls = _tls(args)
    config = _config(args)  # a bad --env or --spaces is refused before anything listens

    def announce(url: str) -> None:
        print(f"rlpipe serve: {url}/v1 -> {args.data}", file=sys.stderr, flush=True)

    compactor = _Compactor(args)
    try:
        serve(config, args.host, args.port, args.threads, announce, tls, args.cpu)
    finally:
        compactor.stop()
    return 0


class _Compactor:
    """``--compact-every``: a thread that runs an upkeep pass every so often, each in a process
    spawned for it, not forked (deltalake refuses to run in a process forked after it started
    its runtime, and the server's worker is forked from this one, ``server.host``). This process
    imports and opens nothing for it: the spawned pass does, so a server that stops before its
    first pass has paid nothing. A pass under way when the server is killed finishes, and its
    process exits."""

    def __init__(self, args: argparse.Namespace) -> None:
        every = args.compact_every  # a float: argparse parsed it
        if not every >= 0:  # negative, or NaN
            raise ConfigError("serve", "compact_every", "seconds >= 0 (0: never)", every)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._child: Any = None
        if every > 0:
            dataset = (str(args.data), storage_options("serve", args.storage_option))
            threading.Thread(target=self._run, args=(every, dataset), daemon=True).start()

    def _run(self, every: float, dataset: tuple[str, dict[str, str]]) -> None:
        while not self._stop.wait(every):
            with self._lock:
                if self._stop.is_set():
                    return
                context = multiprocessing.get_context("spawn")
                self._child = context.Process(
                    target=compact_pass, args=dataset, name="rlpipe-compactor", daemon=True
                )
                self._child.start()
            self._child.join()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._child is not None and self._child.is_alive():
                self._child.terminate()
                self._child.join()


def compact_pass(data: str, options: dict[str, str]) -> None:
    """One pass of ``--compact-every``, in the process spawned for it: reported on stderr; a
    failure or a pass skipped for another server's is reported, and the next pass tries again."""
    from pipeline.dataset.location import locate
    from pipeline.dataset.upkeep import compact_once

    compact_once(locate(data, options))


def _cpu(text: str) -> affinity.Choice:
    try:
        return affinity.choice(text)
    except ConfigError as error:  # argparse's own form: "argument --cpu: expected ..."
        raise argparse.ArgumentTypeError(f"expected {error.expected}, got {text!r}") from None


def _token(args: argparse.Namespace) -> str | None:
    """The token from --token, --token-file or RLPIPE_TOKEN: one of them, or none.

    The messages name where a token came from, never the token.
    """
    variable = os.environ.get(TOKEN_VARIABLE)
    sources = (
        ("--token", args.token),
        ("--token-file", args.token_file),
        (TOKEN_VARIABLE, variable),
    )
    given = [name for name, value in sources if value is not None]
    if len(given) > 1:
        wanted = f"the token from one of --token, --token-file and {TOKEN_VARIABLE}"
        raise ConfigError("serve", "token", wanted, " and ".join(given))
    if variable is not None:
        if not variable.strip():
            raise ConfigError("serve", TOKEN_VARIABLE, "a token", "an empty value")
        return variable.strip()
    if args.token_file is not None:
        return _read_token(args.token_file)
    token: str | None = args.token
    return token


def _read_token(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        got = f"{path} ({why})"
        raise ConfigError("serve", "--token-file", "a readable file with the token", got) from None
    token = lines[0].strip() if lines else ""
    if not token:
        wanted = "a file whose first line is the token"
        raise ConfigError("serve", "--token-file", wanted, f"{path} (empty first line)")
    return token


def _tls(args: argparse.Namespace) -> Tls | None:
    """The certificate and key to serve HTTPS with: both, or neither (plain HTTP)."""
    from server.host import Tls

    if args.tls_cert is None and args.tls_key is None:
        return None
    if args.tls_cert is None or args.tls_key is None:
        given = "--tls-cert" if args.tls_key is None else "--tls-key"
        wanted = "--tls-cert and --tls-key together"
        raise ConfigError("serve", "--tls-cert/--tls-key", wanted, f"{given} alone")
    return Tls(args.tls_cert, args.tls_key)  # serve() checks the files before anything listens


def _config(args: argparse.Namespace) -> ServerConfig:
    from pipeline.dataset.writer_config import WriterConfig
    from server.config import ServerConfig

    observation_space = action_space = None
    env_id = args.env
    if args.env is not None:
        import gymnasium as gym

        try:
            env = gym.make(args.env)
        except gym.error.Error as error:  # an unknown id, version or namespace
            raise ConfigError(
                "serve", "--env", "a registered gymnasium id", f"{args.env} ({error})"
            ) from None
        observation_space, action_space = env.observation_space, env.action_space
        env.close()
    elif args.spaces is not None:
        from pipeline.format import spaces

        try:
            doc = json.loads(args.spaces.read_text())
            observation_space = spaces.space_from_json(doc["observation_space"])
            action_space = spaces.space_from_json(doc["action_space"])
        except (OSError, ValueError, KeyError) as error:
            raise ConfigError(
                "serve",
                "--spaces",
                "a JSON file with observation_space and action_space",
                f"{args.spaces} ({error!r})",
            ) from None
        env_id = doc.get("env_id")
    remote = "://" in args.data
    return ServerConfig(
        data=args.data if remote else Path(args.data),
        storage_options=storage_options("serve", args.storage_option),
        observation_space=observation_space,
        action_space=action_space,
        env_id=env_id,
        policy=args.policy,
        token=_token(args),
        idle_timeout_s=args.idle_timeout,
        max_body_bytes=args.max_body_bytes,
        policy_poll_s=args.policy_poll,
        writer=WriterConfig(sync=args.sync, max_age_s=args.commit_age),
    )

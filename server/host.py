"""The app on granian: HTTP parsed and answered in Rust, the app in one worker process.

Why granian: a step of remote inference is one small request, so the HTTP server's own cost per
request bounds the steps per second. With 8 clients on 2 cores waitress (pure Python) cost about
350 us of CPU per request, granian about 70 us; and its WSGI interface runs Flask unchanged.

One worker, never more: open episodes and the dataset writer's log live in the app's memory, so
a second worker would split episodes between two writers. Granian's supervisor is this process:
it binds the socket and forks the worker, which builds the app (so the writer's threads start
after the fork), serves it from ``threads`` Python threads (on one CPU: :mod:`server.affinity`),
and closes it (open episodes ended as truncated, shards committed) when the supervisor is told
to stop (SIGINT, SIGTERM). On Linux the worker dies with the supervisor (``PR_SET_PDEATHSIG``),
so ``kill -9`` of ``rlpipe serve`` stops serving at once; a killed server's log is recovered by
the next writer on the directory. With ``tls``, granian serves HTTPS (rustls) from the same
worker.

Two things about granian's worker the code below is built around. It listens only after the app's
loader has returned, so the loader cannot announce the address: a client connecting at once would
be refused. And its main thread waits for the stop in ``threading.Event.wait()`` with SIGINT and
SIGTERM open in every thread, while Python runs a signal's handler only on the main thread: a
stop the kernel hands to another thread trips the handler but never wakes the main thread, and
the worker serves on while the supervisor waits for it for ever. So the worker blocks the two
signals in all its threads and one thread takes them (``_relay_stops``), and another announces
once a connection is accepted.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import ConfigError, RlpipeError
from server import affinity

if TYPE_CHECKING:
    from flask import Flask

    from server.config import ServerConfig

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Any]
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_SERVICE: list[Any] = []  # the worker's service, closed when the worker stops
_STOPS = {signal.SIGINT, signal.SIGTERM}


@dataclass(frozen=True)
class Tls:
    """A certificate chain and its private key, PEM files both, to serve HTTPS with."""

    cert: Path
    key: Path

    def check(self) -> None:
        """Refuse files TLS cannot be served with, here, before anything binds: a missing or
        unreadable file, not PEM, an encrypted key, or a key not of the certificate (ConfigError).
        """
        for flag, path, marker, kind in (
            ("--tls-cert", self.cert, b"-----BEGIN CERTIFICATE-----", "certificate"),
            ("--tls-key", self.key, b"PRIVATE KEY-----", "private key"),
        ):
            try:
                pem = path.read_bytes()
            except OSError as error:
                got = f"{path} ({error.strerror})"
                raise ConfigError("serve", flag, "a readable PEM file", got) from None
            if marker not in pem:
                got = f"{path} (no PEM {kind} in it)"
                raise ConfigError("serve", flag, f"a PEM file with a {kind}", got)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:  # as granian loads them (its constructor does the same, after binding)
            context.load_cert_chain(self.cert, self.key, password=_no_password)
        except _EncryptedKey:
            got = f"{self.key} (encrypted)"
            raise ConfigError("serve", "--tls-key", "an unencrypted private key", got) from None
        except ssl.SSLError as error:
            raise ConfigError(
                "serve",
                "--tls-cert/--tls-key",
                "a PEM certificate chain and the private key that belongs to it",
                f"{self.cert}, {self.key} ({error.reason or error})",
            ) from None


class _EncryptedKey(Exception):
    pass


def _no_password() -> bytes:
    """OpenSSL would prompt on the terminal for an encrypted key's password: refuse instead."""
    raise _EncryptedKey


def serve(
    config: ServerConfig,
    host: str,
    port: int,
    threads: int,
    announce: Callable[[str], None],
    tls: Tls | None = None,
    cpu: affinity.Choice = affinity.AUTO,
) -> None:
    """Serve ``config``'s app on ``host:port`` (0: a free port) until SIGINT or SIGTERM, over
    HTTPS with ``tls``, its request threads on one CPU as ``cpu`` says (:mod:`server.affinity`).

    ``announce(url)`` runs in the worker once the app is built and the port listens, with the
    port the OS picked when ``port`` is 0.

    Raises:
        ConfigError: granian is missing, the TLS files cannot be used, the port is taken, or
            ``cpu`` names a CPU this process may not run on.
        DatasetError: the dataset cannot be served (checked before anything listens).
        SystemExit: with status 1, when the worker failed (it printed why).
    """
    if tls is not None:
        tls.check()
    pinned, holder = affinity.claim(cpu)  # held until this process and its worker end
    try:
        _check_dataset(config)
        run_wsgi(partial(_build, config), host, port, threads, announce, tls, pinned)
    finally:
        if holder is not None:
            holder.close()


def run_wsgi(
    load: Callable[[], WsgiApp],
    host: str,
    port: int,
    threads: int,
    announce: Callable[[str], None] = lambda url: None,
    tls: Tls | None = None,
    cpu: int | None = None,
) -> None:
    """Serve the WSGI app that ``load()`` builds in the worker, until SIGINT or SIGTERM, over
    HTTPS with ``tls``, each request thread on ``cpu`` while it serves a step (None: where the
    OS puts it); ``announce(url)`` runs in the worker once a connection is accepted."""
    try:
        from granian import Granian
        from granian.constants import Interfaces
        from granian.log import LogLevels
    except ModuleNotFoundError:
        wanted = "the granian HTTP server to be installed (pip install 'granian>=2.8')"
        raise ConfigError("serve", "granian", wanted, "no module 'granian'") from None
    _fork_workers()
    holder = _reserve(host, port)
    scheme = "http" if tls is None else "https"
    url = f"{scheme}://{host}:{holder.getsockname()[1]}"
    # log_level "error": granian warns at start when threads exceed 2 per core, which the
    # combining of concurrent steps wants (see server.combiner)
    server = Granian(
        "rlpipe",
        address=host,
        port=holder.getsockname()[1],
        interface=Interfaces.WSGI,
        workers=1,
        blocking_threads=threads,
        log_level=LogLevels.error,
        websockets=False,
        ssl_cert=None if tls is None else tls.cert,
        ssl_key=None if tls is None else tls.key,
    )
    server.on_startup(holder.close)  # granian has bound the port by then
    worker = partial(_worker, Granian._spawn_wsgi_worker)
    served = (host, holder.getsockname()[1])
    loader = partial(_load, load, announce, url, served, os.getpid(), cpu)
    server.serve(spawn_target=worker, target_loader=loader)


def _fork_workers() -> None:
    """Granian starts its worker the way multiprocessing starts processes; by fork, the app's
    loader and config reach the worker as they are, while "spawn" would pickle them."""
    if multiprocessing.get_start_method(allow_none=True) == "fork":
        return
    if "fork" not in multiprocessing.get_all_start_methods():
        raise ConfigError(
            "serve", "platform", "one that can fork processes (Linux, macOS)", sys.platform
        )
    multiprocessing.set_start_method("fork", force=True)


def _check_dataset(config: ServerConfig) -> None:
    """Refuse a dataset the worker could not open, here, where the error reaches the caller:
    a worker that fails can only print why and exit. (The writer's own rule, run early.)"""
    from pipeline.dataset.location import locate
    from pipeline.format.manifest import open_manifest

    open_manifest(
        locate(config.data, config.storage_options),
        config.observation_space,
        config.action_space,
        config.env_id,
    )


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound to the port granian will bind, held until it has.

    A first bind without ``SO_REUSEPORT`` refuses a port another server listens on (granian's
    own bind shares ports, so two servers on one port would split the traffic between them)
    and picks a free port for 0; the second shares the port with granian's bind, keeping it
    from others meanwhile.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
            port = probe.getsockname()[1]
        holder = socket.socket(family)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((host, port))
    except OSError as error:
        wanted = "an address of this machine and a port nothing listens on"
        got = f"{host}:{port} ({error.strerror})"
        raise ConfigError("serve", "--host/--port", wanted, got) from None
    return holder


def _load(
    load: Callable[[], WsgiApp],
    announce: Callable[[str], None],
    url: str,
    served: tuple[str, int],
    supervisor: int,
    cpu: int | None,
    _target: str,
) -> WsgiApp:
    """The app, in the worker, which takes SIGINT and SIGTERM on one thread from here on.

    The worker has no other thread yet, and a thread starts with its creator's signal mask, so
    blocking the two here blocks them in every thread granian and the app start later.
    """
    _die_with(supervisor)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    app = load()
    if cpu is not None:
        from server.routes import UPLOADS  # in the worker, which imported the app's modules

        app = affinity.OneCpu(app, cpu, free=[UPLOADS])
        logging.getLogger("rlpipe.server").info("request threads on CPU %d", cpu)
    listening = threading.Event()
    threading.Thread(
        target=_relay_stops, args=(listening,), name="rlpipe-stops", daemon=True
    ).start()
    threading.Thread(
        target=_announce_when_listening,
        args=(announce, url, served, listening),
        name="rlpipe-announce",
        daemon=True,
    ).start()
    return app


def _announce_when_listening(
    announce: Callable[[str], None], url: str, served: tuple[str, int], listening: threading.Event
) -> None:
    """Announce ``url`` once a connection to it is accepted: granian's worker starts listening
    only after the loader returned, at a moment it does not report."""
    pause = 0.001
    while True:
        try:
            socket.create_connection(served, timeout=5).close()
            break
        except OSError:  # refused: not listening yet
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
    listening.set()
    announce(url)


def _relay_stops(listening: threading.Event) -> None:
    """Hand each SIGINT or SIGTERM to the handler granian installed, from this thread.

    Called here, the handler wakes granian's main thread however that thread waits. A stop sent
    while the worker starts stays pending until it listens (granian's handler is installed by
    then), and then stops it.
    """
    listening.wait()
    while True:
        signum = signal.sigwait(_STOPS)
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)


def _build(config: ServerConfig) -> Flask:
    """The app, in the worker; on a user error, say why in one line and exit 2."""
    from server.app import create_app

    try:
        app = create_app(config)
    except RlpipeError as error:
        print(f"rlpipe serve: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    _SERVICE.append(app.extensions["rlpipe"])
    return app


def _worker(spawn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Granian's WSGI worker, then the service closed: its episodes end, its shards commit."""
    try:
        spawn(*args, **kwargs)
    finally:
        while _SERVICE:
            _SERVICE.pop().close()


def _die_with(supervisor: int) -> None:
    """The worker is killed when ``supervisor`` (its parent, whose pid was taken before the
    fork) dies, and at once if it has died already."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:  # it died before the call took effect
        os.kill(os.getpid(), signal.SIGKILL)

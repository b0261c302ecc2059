"""The server's request threads on one CPU (``rlpipe serve --cpu``).

Under the GIL one thread runs Python at a time, so a server's request threads together use at
most one CPU's worth of Python, however many CPUs they run on. Spread over several, each hand-off
of the GIL to a thread on another CPU moves the step's working set (the episodes, the policy, the
interpreter's own state) from one CPU's caches to another's, and the simulators sharing the
machine push the server's threads from CPU to CPU. Kept on one CPU, the same threads run from
warm caches. Measured with ``bench/serve.py``'s clients on this project's 2-core machine,
alternated: 8 vector clients of 16 envs made 15,100-18,700 steps/s with the request threads on
one CPU against 12,900-17,600 without (four pairs), the server's CPU per step falling from 73 to
60 us; 8 remote clients of one env made 1,905-2,560 against 1,615-2,015 (five pairs). One
remote client, 8 local-inference clients and batch ingest ran within the machine's noise of
each other.

Only the request threads are pinned, and only while they serve steps. An upload (a local
client's Arrow batch) is mostly work that releases the GIL, decoding and writing, which runs
beside the steps on the other CPUs: its thread runs on every CPU while it serves one. Pinned for
uploads too, 8 local clients of 84x84x3 frames (``bench/pixels.py``) made 4,920 steps/s against
5,180-5,450 unpinned, twice; with uploads free, 5,710-5,980 against 4,440-5,390. The writer's
committer (which writes Parquet with the GIL released), the journal's syncer and granian's I/O
threads stay where the OS puts them, and so does everything else on the machine: the OS moves
other work off the CPU the server holds.

Which CPU, with ``auto`` (the default): the highest-numbered CPU this process may run on that no
other server on the machine holds. A server holds its CPU by binding the abstract Unix socket
``rlpipe-cpu-N`` (Linux), which the kernel releases when the process ends however it ends, so
servers started side by side (``docs/deploy.md``) take different CPUs. With every CPU held, or
only one allowed, or on a platform without thread affinity, the threads are left unpinned.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pipeline.errors import ConfigError

AUTO, OFF = "auto", "off"
Choice = int | str  # a CPU number, AUTO or OFF
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_log = logging.getLogger("rlpipe.server")
# a claim is the abstract Unix socket NAMESPACE-N: no file, and gone with its process
NAMESPACE = "rlpipe-cpu"


def choice(text: str) -> Choice:
    """``--cpu``'s value: ``auto``, ``off`` or a CPU number (argparse's ``type``)."""
    if text in (AUTO, OFF):
        return text
    if text.isdigit():
        return int(text)
    raise ConfigError("serve", "--cpu", "auto, off or a CPU number", text)


def claim(wanted: Choice, namespace: str = NAMESPACE) -> tuple[int | None, socket.socket | None]:
    """The CPU the request threads are to run on (None: leave them unpinned), and the socket
    that holds it for this process and its children (None when ``wanted`` named the CPU);
    ``namespace`` names the claims (tests give their own).

    Raises:
        ConfigError: a CPU this process may not run on, or a CPU asked for where threads
            cannot be pinned.
    """
    if wanted == OFF:
        return None, None
    allowed_cpus = allowed()
    if isinstance(wanted, int):
        if wanted not in allowed_cpus:
            where = ", ".join(map(str, sorted(allowed_cpus))) or "none: no thread affinity here"
            expected = f"one of the CPUs this process may run on ({where})"
            raise ConfigError("serve", "--cpu", expected, str(wanted))
        return wanted, None
    if len(allowed_cpus) < 2:
        return None, None
    for cpu in sorted(allowed_cpus, reverse=True):
        holder = _hold(f"\0{namespace}-{cpu}")
        if holder is not None:
            return cpu, holder
    return None, None  # every CPU held (said nothing: this runs before the port is checked)


def allowed() -> set[int]:
    """The CPUs this process may run on (none where threads cannot be pinned)."""
    if not hasattr(os, "sched_setaffinity"):
        return set()
    return set(os.sched_getaffinity(0))


def _hold(name: str) -> socket.socket | None:
    """The abstract socket ``name``, bound; None when another process has bound it."""
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        holder.bind(name)
    except OSError:  # in use, or no abstract namespace here
        holder.close()
        return None
    return holder


class OneCpu:
    """WSGI middleware: a thread serving a request runs on ``cpu``, but on every CPU this
    process may use while it serves a path of ``free`` (uploads: large Arrow bodies whose
    decoding and writing release the GIL, and run beside the steps on the other CPUs)."""

    def __init__(self, app: WsgiApp, cpu: int, free: Iterable[str] = ()) -> None:
        self.app = app
        self.one, self.every = {cpu}, allowed()
        self.free = frozenset(free)
        self._thread = threading.local()  # a thread's own: a new thread starts on every CPU

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        wanted = self.every if environ.get("PATH_INFO") in self.free else self.one
        if getattr(self._thread, "cpus", self.every) is not wanted:
            try:
                os.sched_setaffinity(0, wanted)  # 0: the calling thread (Linux)
            except OSError as error:  # the CPU was taken from this process since (a cpuset)
                _log.warning("request thread left where it was: CPUs %s: %s", wanted, error)
            self._thread.cpus = wanted
        return self.app(environ, start_response)

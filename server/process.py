"""``rlpipe serve`` as a child process, for scripts that run a server beside their own work.

The server is asked for any free port (``--port 0``) and prints its address once it listens, so
there is no race for a port picked in advance and no polling for health.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

_ADDRESS = re.compile(r"https?://[\d.]+:\d+")


def start(
    arguments: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start ``rlpipe serve ARGUMENTS --port 0``; return the process and its base address.

    The server's log is read on a daemon thread from then on, so a pipe nobody drains never
    blocks it.

    Raises:
        RuntimeError: when the server exits before it listens (its log says why).
    """
    command = [sys.executable, "-m", "pipeline", "serve", *arguments, "--port", "0"]
    server = subprocess.Popen(
        command, text=True, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if server.stdout is None:  # not with stdout=PIPE; this narrows the type
        raise RuntimeError("rlpipe serve started without an output pipe")
    lines = []
    for line in server.stdout:
        found = _ADDRESS.search(line)
        if found:
            threading.Thread(target=_drain, args=(server.stdout,), daemon=True).start()
            return server, found.group(0)
        lines.append(line)
    server.stdout.close()
    raise RuntimeError(f"rlpipe serve exited ({server.wait()}) before listening: {''.join(lines)}")


def _drain(stream: IO[str]) -> None:
    with stream:
        for _ in stream:
            pass

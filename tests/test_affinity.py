"""``rlpipe serve --cpu``: request threads on one CPU, claimed machine-wide (server.affinity)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from pipeline.errors import ConfigError
from server import affinity
from server.process import start

CPUS = affinity.allowed()
pytestmark = pytest.mark.skipif(
    len(CPUS) < 2, reason=f"needs 2 CPUs this process may run on and thread affinity; has {CPUS}"
)

_CLAIMER = """
import sys
from server import affinity
cpu, holder = affinity.claim(affinity.AUTO, namespace=sys.argv[1])
print(cpu, flush=True)
sys.stdin.read()
"""


def _claimer(namespace: str) -> tuple[subprocess.Popen[str], int | None]:
    process = subprocess.Popen(
        [sys.executable, "-c", _CLAIMER, namespace],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    return process, None if line == "None" else int(line)


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)  # however it ends, the kernel releases its claim
    process.communicate()


def test_servers_on_one_machine_claim_different_cpus_until_one_dies() -> None:
    namespace = f"rlpipe-test-{uuid.uuid4().hex}"
    claims = [_claimer(namespace) for _ in range(len(CPUS) + 1)]
    try:
        cpus = [cpu for _, cpu in claims]
        assert cpus == [*sorted(CPUS, reverse=True), None]  # the highest free first; then none
        _kill(claims[0][0])
        again, cpu = _claimer(namespace)
        claims.append((again, cpu))
        assert cpu == max(CPUS)
    finally:
        for process, _ in claims:
            _kill(process)


def test_a_cpu_this_process_may_not_run_on_is_refused_by_name() -> None:
    wanted = max(CPUS) + 1000
    with pytest.raises(ConfigError) as refused:
        affinity.claim(wanted)
    message = str(refused.value)
    assert "--cpu" in message and f"got '{wanted}'" in message
    assert ", ".join(map(str, sorted(CPUS))) in message
    assert affinity.claim(affinity.OFF) == (None, None)
    with pytest.raises(ValueError, match="auto, off or a CPU number"):
        affinity.choice("fast")


def _masks(pid: int) -> dict[int, set[int]]:
    """Each thread of ``pid`` and of its children, with the CPUs it may run on."""
    found = {}
    for process in [pid, *_children(pid)]:
        for task in Path(f"/proc/{process}/task").iterdir():
            found[int(task.name)] = os.sched_getaffinity(int(task.name))
    return found


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [int(c) for task in tasks for c in (task / "children").read_text().split()]


@pytest.mark.parametrize("cpu", ["0", "off"])
def test_the_request_threads_run_on_the_cpu_asked_for_and_nothing_else_is_pinned(
    tmp_path: Path, cpu: str
) -> None:
    server, url = start(["--data", str(tmp_path / "ds"), "--env", "CartPole-v1", "--cpu", cpu])
    try:
        with requests.Session() as session:
            for _ in range(20):
                episode = session.post(f"{url}/v1/episodes", json={}, timeout=10).json()
                observation = {"observation": [0.0, 0.0, 0.0, 0.0]}
                path = f"{url}/v1/episodes/{episode['episode_id']}/actions"
                assert session.post(path, json=observation, timeout=10).status_code == 200
        masks = _masks(server.pid)
        pinned = [tid for tid, mask in masks.items() if mask == {0}]
        if cpu == "off":
            assert not pinned and all(mask == CPUS for mask in masks.values())
        else:  # the threads that served are on CPU 0; the processes' main threads are not
            assert pinned
            assert masks[server.pid] == CPUS
            assert all(masks[child] == CPUS for child in _children(server.pid))
    finally:
        server.terminate()
        assert server.wait(60) == 0


def test_a_request_thread_runs_on_the_one_cpu_and_on_every_cpu_for_an_upload() -> None:
    """Steps are GIL-bound: on one CPU. An upload's Arrow decoding and writing release the GIL,
    and run beside the steps: on every CPU, and back on the one for the next step."""
    seen: list[set[int]] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(os.sched_getaffinity(0))
        return [b""]

    pinned = affinity.OneCpu(app, min(CPUS), free=["/v1/uploads"])

    def serve() -> None:
        for path in ("/v1/actions", "/v1/actions", "/v1/uploads", "/v1/episodes/e/actions"):
            pinned({"PATH_INFO": path}, lambda *args: None)

    thread = threading.Thread(target=serve)  # a request thread of its own, as granian's are
    thread.start()
    thread.join()
    assert seen == [{min(CPUS)}, {min(CPUS)}, CPUS, {min(CPUS)}]
    assert os.sched_getaffinity(0) == CPUS  # this thread never served: left alone

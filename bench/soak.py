"""Soak: minutes of mixed load on one ``rlpipe serve``, with ``kill -9`` of the server and the
trainer, then a check that nothing acknowledged was lost or stored twice (issue 20, point 5).

Running together, each its own process:

- ``rlpipe serve --sync always`` (granian) on CartPole-v1, its log in ``logs/server.log``,
  compacting the dataset (``--compact-every``, on by default) every half of the shortest time
  between kills, so that passes run in every lifetime of the server and kills land in them;
- ``rlpipe train ppo --follow`` publishing policies into the dataset;
- clients (``bench/soak_clients.py``): remote inference (2), local inference, a vector env of
  8 CartPoles through ``VectorEpisodes``, and a multi-agent client (two CartPole agents per
  episode: the server's spaces are per agent, so one server takes every kind). Each writes
  down the keys of the steps the server acknowledged, and carries on through the kills.

Every 20-60 s (times M/10 for runs shorter than 10 minutes, never below a quarter, so a short
run still kills several times) the server or the trainer, picked at random, gets ``kill -9`` and
is started again at once on the same port and dataset. The M minutes are of load: the time
those restarts take is added, so a loaded machine still gets its kills. At the end the clients
stop cleanly, the server gets SIGTERM, and ``bench/soak_check.py`` reads every file of the
dataset.

The server's memory is the RSS of its process tree (granian's supervisor and worker, not the
processes that compaction passes come and go in), from ``/proc``, sampled every second. Kills
split the run into server lifetimes, so growth is measured within each (``bench/soak_check.py``
says how), and ``server_rss_growth`` is the largest.

Run: ``python bench/soak.py [--minutes M] [--seed S] [--kill-every LOW,HIGH] [--keep DIR]``;
the last line is JSON. With ``--keep`` the dataset, the logs of every process, the clients'
acknowledged keys and the server's RSS samples stay in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import answers, report
from soak_check import Run, Samples, check, summarize

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = {"remote": 2, "local": 1, "vector": 1, "agents": 1}  # kind: processes
PACE_S = {"remote": 0.001, "local": 0.0005, "vector": 0.002, "agents": 0.001}  # between steps
KILL_EVERY_S = (20.0, 60.0)


def process_tree(pid: int) -> list[int]:
    """A process and its descendants, from Linux ``/proc`` (empty once it is gone; a child that
    ends meanwhile is left out). The tests' ``server_fixtures`` use it too."""
    try:
        children = [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
    except OSError:
        return []
    return [pid] + [p for child in children for p in process_tree(child)]


def _compaction(pid: int) -> bool:
    """A process a compaction pass runs in: spawned by multiprocessing, as is its tracker."""
    try:
        return b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class Child:
    """A process the soak starts, kills with SIGKILL and starts again: the server or trainer."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> bool:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(self.log, "ab") as log:  # a file, never an unread pipe that fills
            log.write(f"--- start {self.starts + 1} at {time.strftime('%T')}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1
        return True

    def exited(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def kill(self) -> None:
        """``kill -9``, and wait until every process of its tree is gone."""
        assert self.process is not None
        tree = process_tree(self.process.pid)
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, timeout_s: float) -> tuple[int | None, float]:
        """SIGTERM; the exit status (None: it did not stop in time, and was killed) and the
        seconds it took."""
        assert self.process is not None
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        return code, time.monotonic() - began


class Server(Child):
    """``rlpipe serve``: started when it answers health; its RSS sampled per lifetime."""

    def __init__(self, data: Path, port: int, log: Path, compact_every_s: float) -> None:
        argv = [
            sys.executable,
            "-m",
            "pipeline",
            "serve",
            "--data",
            str(data),
            "--env",
            "CartPole-v1",
            "--port",
            str(port),
            "--sync",
            "always",
            "--compact-every",
            f"{compact_every_s:g}",
        ]
        super().__init__("server", argv, log)
        self.url = f"http://127.0.0.1:{port}"
        self.zero = time.monotonic()  # the run's clock: Soak sets it when the run begins
        self.lifetimes: list[tuple[float, Samples]] = []  # (start, samples) on the run's clock

    def start(self) -> bool:
        super().start()
        assert self.process is not None
        if answers(self.url + "/v1/health", self.process, 60.0):
            self.lifetimes.append((time.monotonic() - self.zero, []))
            return True
        if self.process.poll() is None:
            self.kill()
        return False

    def sample(self) -> None:
        if self.lifetimes and not self.exited():
            assert self.process is not None
            kb = _rss_kb([pid for pid in process_tree(self.process.pid) if not _compaction(pid)])
            self.lifetimes[-1][1].append((time.monotonic() - self.zero, kb))


class Clients:
    """The client processes; one that dies is counted and replaced (its keys stay on file)."""

    def __init__(self, url: str, work: Path) -> None:
        self.url, self.acks, self.logs = url, work / "acks", work / "logs"
        self.acks.mkdir(parents=True, exist_ok=True)
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.numbers = Counter[str]()
        for kind, count in CLIENTS.items():
            for _ in range(count):
                self._start(kind)

    def _start(self, kind: str) -> None:
        n = self.numbers[kind]
        self.numbers[kind] += 1
        name = f"{kind}-{n}"
        seed = 1000 * list(CLIENTS).index(kind) + n
        argv = [
            sys.executable,
            str(Path(__file__).parent / "soak_clients.py"),
            kind,
            "--url",
            self.url,
            "--acks",
            str(self.acks / f"{name}.txt"),
            "--seed",
            str(seed),
            "--pace",
            str(PACE_S[kind]),
        ]
        with open(self.logs / f"{name}.log", "ab") as log:
            self.running[name] = subprocess.Popen(
                argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log
            )

    def replace_dead(self) -> int:
        """Replace the clients that exited on their own; how many did."""
        dead = [name for name, p in self.running.items() if p.poll() is not None]
        for name in dead:
            self.results[name] = self._result(self.running.pop(name), name)
            self._start(name.rsplit("-", 1)[0])
        return len(dead)

    def stop(self) -> None:
        for process in self.running.values():
            process.send_signal(signal.SIGTERM)
        for name, process in self.running.items():
            self.results[name] = self._result(process, name)

    def kill(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def _result(self, process: subprocess.Popen[bytes], name: str) -> dict[str, Any]:
        try:
            out, _ = process.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            return {"hung": True}
        lines = out.decode().strip().splitlines()
        if process.returncode != 0 or not lines:
            return {"exit": process.returncode, "errors": {f"exit {process.returncode}": 1}}
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    @property
    def ack_files(self) -> list[Path]:
        return sorted(self.acks.glob("*.txt"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Soak:
    """The run: processes, the kill schedule, and what happened."""

    def __init__(
        self,
        work: Path,
        minutes: float,
        seed: int,
        kill_every: tuple[float, float],
        targets: tuple[str, ...] = ("server", "trainer"),
    ) -> None:
        self.work, self.minutes, self.kill_every = work, minutes, kill_every
        self.targets = targets
        self.rng = random.Random(seed)
        self.data = work / "ds"
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.server = Server(self.data, _free_port(), logs / "server.log", kill_every[0] / 2)
        trainer = [
            sys.executable,
            "-m",
            "pipeline",
            "train",
            "ppo",
            "--data",
            str(self.data),
            "--follow",
            "--run-dir",
            str(work / "run"),
            "--timeout",
            "1000000",
        ]
        self.trainer = Child("trainer", trainer, logs / "trainer.log")
        self.counts = Counter[str]()
        self.server_restart_s: list[float] = []

    def run(self) -> Clients:
        self.server.zero = time.monotonic()
        if not self.server.start():
            raise SystemExit(f"rlpipe serve did not start; see {self.server.log}")
        self.trainer.start()
        clients = Clients(self.server.url, self.work)
        try:
            self._load(clients)
            self._revive()  # the clients' last deliveries need a server
            clients.stop()
            self.server.sample()
            self.trainer.stop(60)
            self.server_stop = self.server.stop(120)
        finally:  # a run that failed leaves no process behind
            clients.kill()
            for child in (self.server, self.trainer):
                if not child.exited():
                    child.kill()
        return clients

    def _load(self, clients: Clients) -> None:
        """The soak proper: kills on schedule, revivals, and the server's RSS every second.
        Time spent starting a killed process again is not load time: on a loaded machine a
        restart takes seconds, and a short run would end with fewer kills than it drew."""
        began = time.monotonic()
        end = began + self.minutes * 60
        next_kill = began + self._interval()
        sampled = 0.0
        while time.monotonic() < end:
            paused = time.monotonic()
            if paused >= next_kill:
                victim = self.rng.choice(self.targets)
                self._kill(self.server if victim == "server" else self.trainer)  # and restart
            self._revive()
            end += time.monotonic() - paused  # the restarts', if any (the rest is microseconds)
            if paused >= next_kill:
                next_kill = time.monotonic() + self._interval()
            self.counts["client_exits"] += clients.replace_dead()
            if time.monotonic() - sampled >= 1.0:
                sampled = time.monotonic()
                self.server.sample()
            time.sleep(0.2)

    def _interval(self) -> float:
        return self.rng.uniform(*self.kill_every)

    def _kill(self, child: Child) -> None:
        if child.exited():
            return
        child.kill()
        self.counts[f"{child.name}_kills"] += 1
        print(f"{time.strftime('%T')} kill -9 {child.name}", flush=True)
        self._restart(child)

    def _restart(self, child: Child) -> None:
        began = time.monotonic()
        for _ in range(5):
            if child.start():
                self.counts[f"{child.name}_restarts"] += 1
                if child is self.server:  # until it answers health again
                    self.server_restart_s.append(time.monotonic() - began)
                return
            self.counts[f"{child.name}_failed_starts"] += 1
        raise SystemExit(f"{child.name} did not start 5 times; see {child.log}")

    def _revive(self) -> None:
        """A server or trainer that exited without being killed is counted and started again."""
        for child in (self.server, self.trainer):
            if child.exited():
                self.counts[f"{child.name}_exits"] += 1
                print(f"{time.strftime('%T')} {child.name} exited by itself; see {child.log}")
                self._restart(child)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load time (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill schedule")
    parser.add_argument("--keep", type=Path, help="work here (dataset, logs, keys) and keep it")
    parser.add_argument(
        "--kill-every",
        metavar="LOW,HIGH",
        help="seconds between kills, drawn uniformly (default: 20,60, times M/10 below 10 "
        "minutes, never below a quarter)",
    )
    parser.add_argument(
        "--targets",
        default="server,trainer",
        help="what the kills pick from (default: server,trainer; 'trainer' alone keeps one "
        "server lifetime for the whole run, to measure its memory over all of it)",
    )
    args = parser.parse_args()
    targets = tuple(args.targets.split(","))
    if not targets or set(targets) - {"server", "trainer"}:
        parser.error(f"--targets: expected server and/or trainer, got {args.targets!r}")
    if args.kill_every:
        low, high = (float(x) for x in args.kill_every.split(","))
    else:
        scale = min(1.0, max(0.25, args.minutes / 10))
        low, high = KILL_EVERY_S[0] * scale, KILL_EVERY_S[1] * scale
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        figures = run(Soak(args.keep, args.minutes, args.seed, (low, high), targets))
    else:
        with tempfile.TemporaryDirectory(prefix="rlpipe-soak-") as tmp:
            figures = run(Soak(Path(tmp), args.minutes, args.seed, (low, high), targets))
    report(figures)


def run(soak: Soak) -> dict[str, Any]:
    print(f"soak in {soak.work}: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    clients = soak.run()
    found = check(soak.data, clients.ack_files)
    lifetimes = soak.server.lifetimes
    with open(soak.work / "logs" / "server-rss.tsv", "w") as out:  # lifetime, run's s, kB
        for n, (_, samples) in enumerate(lifetimes):
            out.writelines(f"{n}\t{s:.1f}\t{kb}\n" for s, kb in samples)
    facts = Run(
        soak.minutes,
        soak.kill_every,
        soak.counts,
        clients.results,
        lifetimes,
        soak.server_stop,
        soak.server_restart_s,
    )
    return summarize(facts, found)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

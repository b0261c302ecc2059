"""Storage benchmark: the same work on a local path and on an S3 endpoint.

The S3 endpoint is moto in server mode (``python -m moto.server``), started by the bench on
127.0.0.1 in a process of its own: every S3 figure includes a Python S3 server on this machine,
so it says what rlpipe asks of a store, not how fast a real one answers. Figures, each beside a
baseline measured in the same run:

- ingest: steps/s acknowledged and committed through ``rlpipe serve`` with 1 and 3 servers on one
  dataset (each with its own state directory), 3 upload clients (bench/serve.py's ``ingest``
  workers: Arrow uploads of 100 000 CartPole rows), each given one server's address; the time
  runs until the table holds every acknowledged row. Baseline: the same on local disk.
- reader: InputReader (one sequential pass into torch batches of 1024, every page's CRC checked)
  against a raw ``pyarrow.dataset`` scan of the same files on the same store, each timed after
  its opening as in bench/reader.py: ``local_reader_vs_raw``, ``s3_reader_vs_raw``. The opening
  (the reader's: manifest and Delta snapshot; the raw scan's: listing the files) is timed too.
- follow lag: a remote CartPole client steps against one server at its defaults (commits every
  ``--commit-age`` 1 s); a following InputReader (polls every 0.2 s) in this process. The lag of a
  step is from its acknowledgment (the call that completes its row returns) to the follower
  yielding it: p50 and p99, local and s3.
- requests per commit: one writer commits shards of 1 000 rows; the requests moto logs for its
  dataset, over the commits after the first (which creates the table). Then three writers commit
  back to back on one dataset, racing: a commit that loses reads the winner's and tries again.

Run: ``python bench/storage.py [--steps N] [--seconds S] [--only ingest,reader,lag,requests]``.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import answers, cartpole_columns, cartpole_spaces, machine, report

from pipeline import DatasetWriter, InputReader, WriterConfig
from pipeline.dataset.location import Location, locate

ROOT = Path(__file__).resolve().parents[1]
SERVE = Path(__file__).with_name("serve.py")
BARS = {
    "local_reader_vs_raw": (">=", 0.7),
    "s3_reader_vs_raw": (">=", 0.7),
    "follow_lag_p50_s": ("<=", 1.0),
    "requests_per_commit": ("<=", 10.0),
}
ROUNDS = 5  # reader rounds, interleaved, best of each (as bench/reader.py)
COMMITS = 30  # for requests per commit


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Moto:
    """moto's S3 server in a process of its own; its request log (one line a request) in a
    file, from which :meth:`requests` counts a dataset's."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log: Any
    bucket: str = field(default_factory=lambda: f"bench-{secrets.token_hex(4)}")

    @property
    def options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
        }

    def location(self, prefix: str, state: Path) -> Location:
        return locate(f"s3://{self.bucket}/{prefix}", self.options, state)

    def requests(self, prefix: str) -> list[str]:
        """The method and path of every request moto logged for ``prefix`` of the bucket."""
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        under = rf"/{prefix}/|\?[^ ]*prefix={prefix}(?:/|%2F)"  # an object, or a listing
        color = r"(?:\x1b\[[0-9;]*m)*"  # werkzeug colours the line of a status other than 200
        pattern = rf'"{color}([A-Z]+) (/{self.bucket}(?:{under})[^ ]*)'
        return [f"{m[1]} {m[2]}" for m in re.finditer(pattern, text)]


@contextmanager
def moto_server(directory: Path) -> Iterator[Moto]:
    import boto3

    port = _free_port()
    log = open(directory / "moto.log", "w+b")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=log,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        if not answers(endpoint + "/moto-api/", process, 30.0, healthy=False):
            raise RuntimeError("moto did not start")
        moto = Moto(endpoint, process, log)
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench-secret",
        ).create_bucket(Bucket=moto.bucket)
        yield moto
    finally:
        process.terminate()
        process.wait(30)
        log.close()


@dataclass(frozen=True)
class Store:
    """Where a phase's dataset lives: a local directory, or a prefix of the moto bucket."""

    name: str  # "local" or "s3"
    tmp: Path
    moto: Moto | None = None

    def location(self, prefix: str) -> Location:
        if self.moto is None:
            return locate(self.tmp / prefix)
        return self.moto.location(prefix, self.tmp / "state" / prefix)

    def server_env(self, prefix: str, index: int) -> dict[str, str]:
        if self.moto is None:
            return {}
        state = self.tmp / "state" / f"{prefix}-server-{index}"
        return {**self.moto.options, "XDG_STATE_HOME": str(state)}

    def reader(self, location: Location, **options: Any) -> InputReader:
        return InputReader(location.uri, storage_options=dict(location.storage_options), **options)


# --- ingest through rlpipe serve ---------------------------------------------------------------


def _serve(store: Store, prefix: str, index: int, port: int) -> subprocess.Popen[bytes]:
    location = store.location(prefix)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "serve",
            "--data",
            location.uri,
            "--env",
            "CartPole-v1",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **store.server_env(prefix, index)},
    )
    if answers(f"http://127.0.0.1:{port}/v1/health", process, 60.0):
        return process
    raise RuntimeError(f"rlpipe serve on {location.uri} did not start")


def _committed_rows(location: Location) -> int:
    from pipeline.dataset.delta import Table
    from pipeline.format import layout

    return sum(entry.rows or 0 for entry in Table(location, layout.STEPS).files())


def ingest(store: Store, servers: int, seconds: float) -> float:
    """Steps/s from the clients' start until the table holds every acknowledged step."""
    import json

    prefix = f"ingest-{servers}"
    ports = [_free_port() for _ in range(servers)]
    processes = [_serve(store, prefix, n, port) for n, port in enumerate(ports)]
    try:
        start_at = time.time() + 2.5
        clients = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(SERVE),
                    "--worker",
                    "ingest",
                    "--url",
                    f"http://127.0.0.1:{ports[n % servers]}",
                    "--seconds",
                    str(seconds),
                    "--start-at",
                    str(start_at),
                    "--seed",
                    str(n),
                ],
                stdout=subprocess.PIPE,
                cwd=ROOT,
            )
            for n in range(3)
        ]
        acked = sum(
            json.loads(c.communicate()[0].decode().splitlines()[-1])["steps"] for c in clients
        )
        location = store.location(prefix)
        while (rows := _committed_rows(location)) < acked:
            time.sleep(0.05)
        elapsed = time.time() - start_at
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)
    if rows != acked:
        raise SystemExit(f"ingest: {acked} steps acknowledged, {rows} committed")
    return acked / elapsed


# --- the reader against a raw scan -------------------------------------------------------------


def write_steps(location: Location, total: int) -> None:
    columns = cartpole_columns(100_000)
    config = WriterConfig(max_rows=250_000)
    with DatasetWriter(
        location.uri,
        *cartpole_spaces(),
        env_id="CartPole-v1",
        config=config,
        storage_options=dict(location.storage_options),
        state_dir=location.state_dir,
    ) as writer:
        for _ in range(total // 100_000):
            writer.append(columns)


def raw_scan(location: Location) -> tuple[float, float, int]:
    """Seconds for pyarrow.dataset to discover the step files, then to scan the reader's
    columns once; and the rows."""
    import pyarrow.dataset as ds

    from pipeline.dataset.reader import DEFAULT_COLUMNS

    started = time.perf_counter()
    dataset = ds.dataset(
        location.path("steps"),
        filesystem=location.filesystem,
        format="parquet",
        partitioning="hive",
    )
    found = time.perf_counter()
    rows = sum(b.num_rows for b in dataset.to_batches(columns=list(DEFAULT_COLUMNS)))
    return found - started, time.perf_counter() - found, rows


def reader_pass(store: Store, location: Location) -> tuple[float, float, int]:
    """Seconds to open an InputReader (manifest, Delta snapshot), then to read one sequential
    epoch of torch batches; and the rows."""
    started = time.perf_counter()
    reader = store.reader(location, batch_size=1024, device="cpu")
    opened = time.perf_counter()
    rows = sum(len(batch.observations) for batch in reader)
    return opened - started, time.perf_counter() - opened, rows


def reader_vs_raw(store: Store, total: int) -> dict[str, float]:
    """Rows/s of a pass and of a scan (as bench/reader.py: after the open and the discovery,
    which are timed on their own); best of ROUNDS interleaved rounds each."""
    location = store.location("reader")
    write_steps(location, total)
    rounds = [(raw_scan(location), reader_pass(store, location)) for _ in range(ROUNDS)]
    rows = {r[0][2] for r in rounds} | {r[1][2] for r in rounds}
    if rows != {total // 100_000 * 100_000}:
        raise SystemExit(f"{store.name} reader: rows read {sorted(rows)}, written {total}")
    return {
        "reader_rows_per_s": rows.pop() / min(r[1][1] for r in rounds),
        "raw_rows_per_s": total // 100_000 * 100_000 / min(r[0][1] for r in rounds),
        "reader_open_s": min(r[1][0] for r in rounds),
        "raw_discover_s": min(r[0][0] for r in rounds),
    }


# --- the follower's lag ------------------------------------------------------------------------


def follow_lag(store: Store, seconds: float) -> tuple[float, float, int]:
    """p50 and p99 of acknowledged-to-seen seconds, and the steps measured."""
    from pipeline.client import PolicyClient

    port = _free_port()
    server = _serve(store, "lag", 0, port)
    acked: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, int], float] = {}
    try:
        location = store.location("lag")
        follower = store.reader(location, batch_size=256, follow=True, timeout_s=4.0)

        def follow() -> None:
            for batch in follower:
                now = time.time()
                for key in zip(batch.episode_ids.tolist(), batch.ts.tolist(), strict=True):
                    seen.setdefault((str(key[0]), int(key[1])), now)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        _play(PolicyClient(f"127.0.0.1:{port}", "remote"), seconds, acked)
        thread.join(timeout=60)
    finally:
        server.terminate()
        server.wait(60)
    missing = set(acked) - set(seen)
    if missing:
        raise SystemExit(f"{store.name} follower: {len(missing)} acknowledged steps never seen")
    lags = np.array([seen[key] - at for key, at in acked.items()])
    p50, p99 = np.percentile(lags, [50, 99]).tolist()
    return p50, p99, len(lags)


def _play(client: Any, seconds: float, acked: dict[tuple[str, int], float]) -> None:
    """CartPole episodes, a step every ~2 ms, for ``seconds``; each step's acknowledgment time."""
    import gymnasium as gym

    env = gym.make("CartPole-v1", disable_env_checker=True)
    deadline, episode = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        episode_id = client.start_episode(seed=episode)
        observation, _ = env.reset(seed=episode)
        t = 0
        while True:
            time.sleep(0.002)
            action = client.get_action(episode_id, observation)
            if t:
                acked[(episode_id, t - 1)] = time.time()
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            t += 1
            if terminated or truncated or time.monotonic() >= deadline:
                client.end_episode(episode_id, observation, truncated=not terminated)
                acked[(episode_id, t - 1)] = time.time()
                break
        episode += 1
    client.close()
    env.close()


# --- requests per commit -----------------------------------------------------------------------


def requests_per_commit(moto: Moto, tmp: Path, writers: int) -> tuple[float, dict[str, float]]:
    """Requests moto logged per commit of ``writers`` writers committing back to back on one
    dataset, over COMMITS commits each after a first; and per kind of request."""
    from collections import Counter

    prefix = f"commits-{writers}"
    location = moto.location(prefix, tmp / "state" / prefix)
    columns = cartpole_columns(1_000)
    opened = [
        DatasetWriter(
            location.uri,
            *cartpole_spaces(),
            config=WriterConfig(max_age_s=600.0),
            storage_options=dict(location.storage_options),
            state_dir=location.state_dir / str(n),
        )
        for n in range(writers)
    ]

    def commit(writer: DatasetWriter, times: int) -> None:
        for _ in range(times):
            writer.append(columns)
            writer.flush()

    for writer in opened:
        commit(writer, 1)
    time.sleep(0.2)  # moto logs a request after answering it
    before = len(moto.requests(prefix))
    threads = [threading.Thread(target=commit, args=(w, COMMITS)) for w in opened]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.2)
    made = moto.requests(prefix)[before:]
    for writer in opened:
        writer.close()
    commits = COMMITS * writers
    kinds = Counter(_kind(request) for request in made)
    return len(made) / commits, {kind: count / commits for kind, count in kinds.most_common()}


def _kind(request: str) -> str:
    method, path = request.split(" ", 1)
    if "list-type=2" in path:
        return "LIST _delta_log"
    if "_delta_log/" in path:
        return f"{method} _delta_log/{path.rsplit('/', 1)[-1].split('.')[-1].split('?')[0]}"
    return f"{method} {path.rsplit('.', 1)[-1].split('?')[0]} file"


# --- the run -----------------------------------------------------------------------------------


PHASES = ("ingest", "reader", "lag", "requests")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1_000_000, help="rows the reader reads")
    parser.add_argument("--seconds", type=float, default=3.0, help="per ingest and lag phase")
    parser.add_argument("--only", default=",".join(PHASES), help=f"of {','.join(PHASES)}")
    args = parser.parse_args()
    phases = args.only.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"--only: unknown phases {unknown}; choose from {list(PHASES)}")
    print(f"{machine()}; S3 is moto in server mode on 127.0.0.1")
    figures: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as name, moto_server(Path(name)) as moto:
        tmp = Path(name)
        stores = [Store("local", tmp / "local"), Store("s3", tmp / "s3", moto)]
        for store in stores:
            if "ingest" in phases:
                figures.update(_ingest(store, args.seconds))
            if "reader" in phases:
                figures.update(_reader(store, args.steps))
            if "lag" in phases:
                figures.update(_lag(store, args.seconds * 2))
        if "requests" in phases:
            figures.update(_requests(moto, tmp))
    _bars(figures)
    report(figures)


def _ingest(store: Store, seconds: float) -> dict[str, float]:
    one, three = ingest(store, 1, seconds), ingest(store, 3, seconds)
    print(
        f"{store.name} ingest, 3 upload clients: 1 server {one:,.0f} steps/s, 3 servers "
        f"{three:,.0f} steps/s ({three / one:.2f}x one)"
    )
    return {f"{store.name}_ingest_steps_per_s_1": one, f"{store.name}_ingest_steps_per_s_3": three}


def _reader(store: Store, total: int) -> dict[str, float]:
    found = reader_vs_raw(store, total)
    mine, raw = found["reader_rows_per_s"], found["raw_rows_per_s"]
    print(
        f"{store.name} reader: InputReader {mine:,.0f} rows/s, raw pyarrow.dataset scan "
        f"{raw:,.0f} rows/s ({mine / raw:.2f}x raw); opening it {found['reader_open_s']:.3f} s, "
        f"the raw discovery {found['raw_discover_s']:.3f} s"
    )
    figures = {f"{store.name}_{key}": value for key, value in found.items()}
    return figures | {f"{store.name}_reader_vs_raw": mine / raw}


def _lag(store: Store, seconds: float) -> dict[str, float]:
    p50, p99, count = follow_lag(store, seconds)
    print(
        f"{store.name} follow lag over {count} steps: p50 {p50:.3f} s, p99 {p99:.3f} s "
        f"(the server commits every 1 s, the follower polls every 0.2 s)"
    )
    key = "follow_lag" if store.name == "local" else "s3_follow_lag"
    return {f"{key}_p50_s": p50, f"{key}_p99_s": p99}


def _requests(moto: Moto, tmp: Path) -> dict[str, float]:
    figures = {}
    for writers, key in ((1, "requests_per_commit"), (3, "requests_per_commit_3_writers")):
        per_commit, kinds = requests_per_commit(moto, tmp, writers)
        print(
            f"requests per commit, {writers} writer(s) committing back to back: "
            f"{per_commit:.2f}: "
            + ", ".join(f"{kind} {count:.2f}" for kind, count in kinds.items())
        )
        figures[key] = per_commit
    return figures


def _bars(figures: dict[str, float | None]) -> None:
    for key, (sign, bar) in BARS.items():
        value = figures.get(key)
        if value is None:
            continue
        held = value >= bar if sign == ">=" else value <= bar
        print(f"bar {key} {sign} {bar}: {value:.3f} {'holds' if held else 'FAILS'}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

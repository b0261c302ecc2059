"""Policy-server benchmark: remote and local inference with CartPole clients, and batch ingest.

Every client is its own process (as simulators are), all starting together and running for the
same number of seconds against one ``rlpipe serve`` (granian) process. Baselines, measured in the
same run: a bare Flask route answering empty JSON on the same WSGI server, hit by as many client
processes (the ceiling for one round trip per step; ratios are to it), and a bare WSGI function
(the ceiling without a framework); and, for reference, RLlib's figures on this machine quoted by
the issue (193 remote steps/s with 8 clients, 4.7 ms p50 get_action).

Clients make their envs with ``gym.make("CartPole-v1", disable_env_checker=True)``: the checker
is a wrapper that type-checks every step's output (the simulator's cost, not the pipeline's);
every step is still a real CartPole step, and only steps the server acknowledged are counted.
Run: ``python bench/serve.py [--seconds S] [--only remote,vector,local,ingest] [--poll-stats]``;
``--poll-stats`` reads ``GET /v1/stats`` every second throughout, as the live page (``GET /``)
open in a browser does, to show the page costs the step path nothing measurable.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
RLLIB = {"remote_steps_per_s_8": 193.0, "remote_p50_ms_1": 4.7}
BARS = {"remote_steps_per_s_8": 1000.0, "remote_p50_ms_1": 2.0,
        "remote_vector_steps_per_s_8x16": 20000.0, "local_steps_per_s_8": 30000.0,
        "ingest_steps_per_s": 1_000_000.0}  # fmt: skip


# --- workers (one process each) ---------------------------------------------------------------


def _wait(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def worker_remote(url: str, seconds: float, start_at: float, seed: int) -> dict[str, Any]:
    import gymnasium as gym

    from pipeline.client import PolicyClient

    client = PolicyClient(url, inference_mode="remote")
    env = gym.make("CartPole-v1", disable_env_checker=True)
    latencies: list[float] = []
    _wait(start_at)
    cpu = time.process_time()
    deadline = time.perf_counter() + seconds
    episode = 0
    while time.perf_counter() < deadline:
        episode_id = client.start_episode(seed=seed * 1000 + episode)
        observation, _ = env.reset(seed=seed * 1000 + episode)
        while True:
            began = time.perf_counter()
            action = client.get_action(episode_id, observation)
            latencies.append(time.perf_counter() - began)
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, reward)
            if terminated or truncated or time.perf_counter() >= deadline:
                client.end_episode(episode_id, observation, truncated=not terminated)
                break
        episode += 1
    elapsed = seconds + max(0.0, time.perf_counter() - deadline)
    return {"steps": len(latencies), "seconds": elapsed, "latencies": latencies,
            "cpu": time.process_time() - cpu}  # fmt: skip


def worker_vector(
    url: str, seconds: float, start_at: float, seed: int, envs: int
) -> dict[str, Any]:
    """A vectorized simulator: gymnasium's numpy CartPole steps all its envs at once, and
    :class:`~pipeline.client.vector.VectorEpisodes` sends each vector step as one request in the
    columnar batch form.

    The vector env resets an env on the step after its episode ended (gymnasium's next-step
    autoreset): that step's observation starts the env's next episode and is not counted.
    """
    import gymnasium as gym

    from pipeline.client import PolicyClient
    from pipeline.client.vector import VectorEpisodes

    client = PolicyClient(url, inference_mode="remote", timeout=30.0)
    sims = gym.make_vec("CartPole-v1", num_envs=envs, vectorization_mode="vector_entry_point")
    vector = VectorEpisodes(client, envs)
    observations, _ = sims.reset(seed=seed)
    steps, ended = 0, np.zeros(envs, bool)  # ended: the env's episode ended last step
    _wait(start_at)
    cpu = time.process_time()
    began = time.perf_counter()
    actions = vector.reset(observations)
    while True:
        observations, rewards, terminated, truncated, _ = sims.step(actions)
        steps += int(envs - ended.sum())
        ended = terminated | truncated
        if time.perf_counter() - began >= seconds:
            vector.close(observations, rewards, terminated, truncated)
            break
        actions = vector.step(observations, rewards, terminated, truncated)
    sims.close()
    client.close()
    return {"steps": steps, "seconds": time.perf_counter() - began,
            "cpu": time.process_time() - cpu}  # fmt: skip


def worker_local(url: str, seconds: float, start_at: float, seed: int) -> dict[str, Any]:
    import gymnasium as gym

    from pipeline.client import PolicyClient

    with tempfile.TemporaryDirectory() as spool:
        client = PolicyClient(url, inference_mode="local", spool_dir=spool, seed=seed)
        env = gym.make("CartPole-v1", disable_env_checker=True)
        steps = 0
        _wait(start_at)
        cpu = time.process_time()
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            episode_id = client.start_episode(seed=seed * 1000 + steps)
            observation, _ = env.reset(seed=seed * 1000 + steps)
            while True:
                action = client.get_action(episode_id, observation)
                observation, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(episode_id, reward)
                steps += 1
                if terminated or truncated:
                    client.end_episode(episode_id, observation, truncated=truncated)
                    break
        delivered = client.close(60)
        return {"steps": steps, "seconds": time.perf_counter() - began, "ok": delivered,
                "cpu": time.process_time() - cpu}  # fmt: skip


def worker_ingest(url: str, seconds: float, start_at: float, seed: int) -> dict[str, Any]:
    import pyarrow as pa
    from common import cartpole_columns, cartpole_spaces

    from pipeline.client.transport import Http
    from pipeline.format.schema import step_schema, steps_from_columns

    observation_space, action_space = cartpole_spaces()
    columns = cartpole_columns(100_000, seed=seed)
    batch = steps_from_columns(step_schema(observation_space, action_space), columns,
                               observation_space, action_space)  # fmt: skip
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    body = sink.getvalue()
    http = Http(url, None, 60.0, None)
    steps, seq = 0, 0
    _wait(start_at)
    cpu = time.process_time()
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        headers = {"Content-Type": "application/vnd.apache.arrow.stream",
                   "X-Rlpipe-Client": f"ingest-{seed}", "X-Rlpipe-Upload": str(seq)}  # fmt: skip
        http.call("POST", "/v1/uploads", data=body, headers=headers)
        steps, seq = steps + batch.num_rows, seq + 1
    return {"steps": steps, "seconds": time.perf_counter() - began,
            "cpu": time.process_time() - cpu}  # fmt: skip


def worker_bare(url: str, seconds: float, start_at: float, seed: int) -> dict[str, Any]:
    from pipeline.client.transport import Http

    http = Http(url, None, 10.0, None)  # the client transport PolicyClient uses
    latencies = []
    _wait(start_at)
    cpu = time.process_time()
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        sent = time.perf_counter()
        http.call("POST", "/step", json={"observation": [0.0, 0.0, 0.0, 0.0]}).json()
        latencies.append(time.perf_counter() - sent)
    return {"steps": len(latencies), "seconds": time.perf_counter() - began,
            "latencies": latencies, "cpu": time.process_time() - cpu}  # fmt: skip


def bare_server(port: int, kind: str) -> None:
    """A route answering empty JSON on granian with ``rlpipe serve``'s settings (its request
    threads on one CPU among them): through Flask (``kind="flask"``), or a plain WSGI function
    reading the body as the fast path does."""
    from flask import Flask, jsonify

    from server import affinity
    from server.host import run_wsgi

    app = Flask("bare")
    app.add_url_rule("/step", "step", lambda: jsonify({}), methods=["POST"])

    def plain(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)) or b"{}")
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")])
        return [b"{}"]

    # the CPU rlpipe serve's --cpu auto takes on a machine of its own (claims of its own: the
    # server it is compared with holds that CPU meanwhile)
    cpu, _holder = affinity.claim(affinity.AUTO, namespace=f"rlpipe-bench-{os.getpid()}")
    run_wsgi(lambda: app if kind == "flask" else plain, "127.0.0.1", port, threads=8, cpu=cpu)


WORKERS = {"remote": worker_remote, "vector": worker_vector, "local": worker_local,
           "ingest": worker_ingest, "bare": worker_bare}  # fmt: skip


# --- orchestration ----------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_up(url: str, process: subprocess.Popen[bytes]) -> None:
    from common import answers

    if not answers(url, process, 60.0, healthy=False):
        raise RuntimeError(f"server at {url} did not start")


SERVER: dict[str, int] = {"pid": 0}  # the rlpipe serve process, for its CPU time


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process and its children (granian's worker), from Linux
    ``/proc``, 0.0 where unavailable: CPU per step says what a step costs even on a machine
    that other work keeps busy."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        children = [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                    for child in (task / "children").read_text().split()]  # fmt: skip
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(_cpu_seconds(child) for child in children)


def _phase(kind: str, url: str, clients: int, seconds: float, **extra: Any) -> dict[str, Any]:
    """Run ``clients`` worker processes together; total steps/s and pooled latencies."""
    start_at = time.time() + 1.0 + 0.4 * clients  # every worker imported and connected by then
    args = [f"--{k}={v}" for k, v in extra.items()]
    processes = [
        subprocess.Popen([sys.executable, __file__, "--worker", kind, "--url", url,
                          "--seconds", str(seconds), "--start-at", str(start_at),
                          "--seed", str(i), *args], stdout=subprocess.PIPE, cwd=ROOT)
        for i in range(clients)
    ]  # fmt: skip
    server_cpu = _cpu_seconds(SERVER["pid"])
    results = [json.loads(p.communicate()[0].decode().strip().splitlines()[-1]) for p in processes]
    server_cpu = _cpu_seconds(SERVER["pid"]) - server_cpu
    steps = sum(r["steps"] for r in results)
    elapsed = max(r["seconds"] for r in results)
    latencies = np.array([x for r in results for x in r.get("latencies", [])]) * 1e3
    out = {"steps_per_s": steps / elapsed, "steps": steps,
           "ok": all(r.get("ok", True) for r in results)}  # fmt: skip
    if kind != "bare" and steps:
        out["cpu"] = (f"CPU per step: server {server_cpu / steps * 1e6:.0f} us, clients "
                      f"{sum(r['cpu'] for r in results) / steps * 1e6:.0f} us")  # fmt: skip
    if len(latencies):
        out["p50_ms"], out["p99_ms"] = np.percentile(latencies, [50, 99]).tolist()
    return out


def _checkpoint(data: Path) -> None:
    from common import cartpole_spaces

    from pipeline.policy.checkpoint import Checkpoint, ModelSpec, save_checkpoint

    observation_space, action_space = cartpole_spaces()
    rng = np.random.default_rng(0)
    sizes = [4, 64, 64, 2]
    weights = {}
    for i in range(3):
        weights[f"pi.{i}.weight"] = (rng.standard_normal((sizes[i + 1], sizes[i])) * 0.3).astype(
            np.float32
        )
        weights[f"pi.{i}.bias"] = np.zeros(sizes[i + 1], np.float32)
    spec = ModelSpec(observation_space, action_space, hidden=(64, 64))
    save_checkpoint(data / "checkpoints", Checkpoint(1, spec, weights))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.5, help="per measurement")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bare-kind", default="flask", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--envs", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated phases to run, of {','.join(PHASES)}",
    )
    parser.add_argument("--threads", type=int, default=None, help="server request threads "
                        "(default: rlpipe serve's)")  # fmt: skip
    parser.add_argument(
        "--poll-stats",
        action="store_true",
        help="read /v1/stats every second throughout, as the live page does",
    )
    args = parser.parse_args()
    if args.bare_server:
        bare_server(args.bare_server, args.bare_kind)
        return
    if args.worker:
        extra = {"envs": args.envs} if args.worker == "vector" else {}
        work = WORKERS[args.worker]
        print(json.dumps(work(args.url, args.seconds, args.start_at, args.seed, **extra)))
        return
    run(args.seconds, args.only.split(","), args.threads, args.poll_stats)


def run(seconds: float, phases: list[str], threads: int | None, poll_stats: bool = False) -> None:
    from common import machine, report

    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"--only: unknown phases {unknown}; choose from {list(PHASES)}")
    figures: dict[str, float] = {}
    print(
        "clients: CartPole-v1 with disable_env_checker=True (real steps, no per-step type "
        f"checks); {machine()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        data, port = Path(tmp) / "ds", _free_port()
        _checkpoint(data)
        url = f"http://127.0.0.1:{port}"
        server, bare_ports, bares = _servers(data, port, threads)
        SERVER["pid"] = server.pid
        try:
            _wait_up(url + "/v1/health", server)
            for bare_port, bare in zip(bare_ports.values(), bares, strict=True):
                _wait_up(f"http://127.0.0.1:{bare_port}/", bare)
            baseline, bare_p50 = _baselines(bare_ports, seconds)
            poller = _StatsPoller(url) if poll_stats else None
            for phase in phases:
                figures.update(PHASES[phase](url, seconds, baseline, bare_p50))
            if poller is not None:
                print(poller.stop())
        finally:
            for process in (server, *bares):
                process.terminate()
                process.wait(30)
    for key, value in figures.items():
        bar = BARS[key]
        ratio = bar / value if key.endswith("_ms_1") else value / bar
        rllib = RLLIB.get(key)
        versus = (
            ""
            if rllib is None
            else (f", {rllib / value if key.endswith('_ms_1') else value / rllib:.1f}x RLlib")
        )
        print(f"{key}: {value:,.2f} ({ratio:.2f}x the issue's bar{versus})")  # fmt: skip
    report(figures)


class _StatsPoller:
    """``GET /v1/stats`` once a second in a thread, as the live page does while it is open."""

    def __init__(self, url: str) -> None:
        import threading

        self._url, self._stop = url + "/v1/stats", threading.Event()
        self.answers, self.seconds = 0, 0.0
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        import requests

        with requests.Session() as session:
            while not self._stop.wait(1.0):
                started = time.perf_counter()
                session.get(self._url, timeout=10).raise_for_status()
                self.seconds += time.perf_counter() - started
                self.answers += 1

    def stop(self) -> str:
        self._stop.set()
        self._thread.join()
        mean = self.seconds / max(1, self.answers) * 1e3
        return f"stats poller: {self.answers} answers of /v1/stats, {mean:.1f} ms each on average"


def _servers(data: Path, port: int, threads: int | None) -> tuple[Any, dict[str, int], list[Any]]:
    """``rlpipe serve`` on ``data``, and the two bare servers of the baselines."""
    extra = [] if threads is None else ["--threads", str(threads)]
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", "--data", str(data), "--env",
         "CartPole-v1", "--port", str(port), *extra], cwd=ROOT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    bare_ports = {kind: _free_port() for kind in ("flask", "wsgi")}
    bares = [
        subprocess.Popen([sys.executable, __file__, "--bare-server", str(bare_port),
                          "--bare-kind", kind], stderr=subprocess.DEVNULL)
        for kind, bare_port in bare_ports.items()
    ]  # fmt: skip
    return server, bare_ports, bares


def _baselines(ports: dict[str, int], seconds: float) -> tuple[float, float]:
    """Requests/s with 8 clients and p50 with 1, of the bare Flask route (the issue's
    reference) and of a bare WSGI function (what a route costs without a framework)."""
    measured = {}
    for kind, port in ports.items():
        bare_url = f"http://127.0.0.1:{port}"
        p50 = _phase("bare", bare_url, 1, seconds)["p50_ms"]
        measured[kind] = (_phase("bare", bare_url, 8, seconds)["steps_per_s"], p50)
        print(f"baseline: bare {kind} route on granian: {measured[kind][0]:,.0f} requests/s "
              f"with 8 clients, p50 {p50:.2f} ms with 1")  # fmt: skip
    return measured["flask"]


def _remote(url: str, seconds: float, baseline: float, bare_p50: float) -> dict[str, float]:
    figures = {}
    for clients in (1, 4, 8):
        result = _phase("remote", url, clients, seconds)
        print(f"remote x{clients}: {result['steps_per_s']:,.0f} steps/s "
              f"({result['steps_per_s'] / baseline:.2f}x bare round trips), get_action p50 "
              f"{result['p50_ms']:.2f} ms p99 {result['p99_ms']:.2f} ms; "
              f"{result['cpu']}")  # fmt: skip
        if clients == 1:
            figures["remote_p50_ms_1"] = result["p50_ms"]
            print(f"  p50 is {result['p50_ms'] / bare_p50:.2f}x a bare round trip's")
    figures["remote_steps_per_s_8"] = result["steps_per_s"]
    return figures


def _vector(url: str, seconds: float, baseline: float, bare_p50: float) -> dict[str, float]:
    result = _phase("vector", url, 8, seconds, envs=16)
    vector = result["steps_per_s"]
    print(f"remote 8x16 (batch form): {vector:,.0f} steps/s "
          f"({vector / baseline:.1f}x bare round trips); {result['cpu']}")  # fmt: skip
    return {"remote_vector_steps_per_s_8x16": vector}


def _local(url: str, seconds: float, baseline: float, bare_p50: float) -> dict[str, float]:
    for clients in (1, 4, 8):
        before = _accepted(url)
        result = _phase("local", url, clients, seconds)
        stored = _accepted(url) - before
        if not result["ok"] or stored != result["steps"]:
            raise SystemExit(
                f"local x{clients}: clients took {result['steps']} steps, the "
                f"server acknowledged {stored} (all delivered: {result['ok']})"
            )
        local = result["steps_per_s"]
        print(f"local x{clients}: {local:,.0f} steps/s durably logged "
              f"({local / baseline:.1f}x bare round trips); {result['cpu']}")  # fmt: skip
    return {"local_steps_per_s_8": local}


def _accepted(url: str) -> int:
    """Steps the server has acknowledged (written to its durable log), from its metrics."""
    import requests

    text = requests.get(url + "/v1/metrics", timeout=10).text
    return int(float(re.search(r"^rlpipe_steps_accepted_total (\S+)$", text, re.M)[1]))  # type: ignore[index]


def _ingest(url: str, seconds: float, baseline: float, bare_p50: float) -> dict[str, float]:
    result = _phase("ingest", url, 1, seconds)
    ingest = result["steps_per_s"]
    print(f"batch ingest: {ingest:,.0f} steps/s ({ingest / baseline:.0f}x bare round trips); "
          f"{result['cpu']}")  # fmt: skip
    return {"ingest_steps_per_s": ingest}


PHASES = {"remote": _remote, "vector": _vector, "local": _local, "ingest": _ingest}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

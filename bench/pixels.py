"""Pixels benchmark: 84x84x3 ``uint8`` observations through remote and local inference (issue 23).

Frames are random (incompressible: the worst case for every byte) or rendered: real CartPole
``rgb_array`` frames (gymnasium's ``AddRenderObservation``), resized to 84x84 by nearest
neighbour (gymnasium's ``ResizeObservation`` needs OpenCV, which is not installed here). Rendered
frames are rendered once per run and replayed by every client, so the figures are the
pipeline's, not pygame's. Every client is its own process against one ``rlpipe serve``
(granian) process, as in ``bench/serve.py``. Baselines, measured in the same run:

- remote: the same clients sending JSON numbers (what every client did before);
- local: plain file writes of the bytes the server logs per step, with the server's sync policy
  (``--sync background``: written, and fsynced every 50 ms), in the same directory;
- bytes per step: the frame's own size.

Then a local client plays frames at full speed for ``--delivery-seconds`` (30) and must deliver
every step: ``close()`` True, and the table holding each step once.
Run: ``python bench/pixels.py [--seconds S] [--delivery-seconds S] [--threshold]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import _accepted, _cpu_seconds

from server import process

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (84, 84, 3)
BARS = {
    "remote_image_steps_per_s_8": 1000.0,
    "local_image_vs_disk": 0.5,
    "image_bytes_per_step_vs_frame": 1.1,
}
EPISODE = 100  # steps per episode of every client
ENVS = 16  # episodes per request of a remote client on the batch form


# --- frames ------------------------------------------------------------------------------------


def rendered_frames(n: int, seed: int = 0) -> np.ndarray:
    """``n`` real CartPole frames (random actions), resized to 84x84 by nearest neighbour."""
    import gymnasium as gym
    from gymnasium.wrappers import AddRenderObservation

    env = AddRenderObservation(gym.make("CartPole-v1", render_mode="rgb_array"), render_only=True)
    frame, _ = env.reset(seed=seed)
    rows = np.linspace(0, frame.shape[0] - 1, SHAPE[0]).astype(int)
    cols = np.linspace(0, frame.shape[1] - 1, SHAPE[1]).astype(int)
    frames = np.empty((n, *SHAPE), np.uint8)
    for i in range(n):
        frames[i] = frame[rows][:, cols]
        frame, _, terminated, truncated, _ = env.step(int(env.action_space.sample()))
        if terminated or truncated:
            frame, _ = env.reset()
    env.close()
    return frames


def _pool(frames: str, seed: int) -> np.ndarray:
    if frames == "random":
        return np.random.default_rng(seed).integers(0, 256, (256, *SHAPE), np.uint8)
    return np.load(frames)


# --- workers (one process each) ---------------------------------------------------------------


def worker_remote(url: str, seconds: float, start_at: float, seed: int, **opts: Any) -> dict:
    """Remote inference: ``envs`` > 1 steps that many episodes per request (the batch form),
    1 one get_action per step; ``json`` sends JSON numbers (the baseline)."""
    from pipeline.client import PolicyClient, binary
    from pipeline.client.vector import VectorEpisodes

    if opts["json"]:
        binary.BINARY_MIN_BYTES = 1 << 62
    envs, pool = int(opts["envs"]), _pool(opts["frames"], seed)
    client = PolicyClient(url, inference_mode="remote", timeout=60.0)
    time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    began, steps, i = time.perf_counter(), 0, 0
    if envs == 1:
        while time.perf_counter() - began < seconds:
            episode = client.start_episode()
            for _ in range(EPISODE):
                client.get_action(episode, pool[i % len(pool)])
                client.log_returns(episode, 1.0)
                i, steps = i + 1, steps + 1
            client.end_episode(episode, pool[i % len(pool)], truncated=True)
    else:
        vector, ended = VectorEpisodes(client, envs), np.zeros(envs, bool)
        vector.reset(pool[:envs])
        while time.perf_counter() - began < seconds:
            i += 1
            rows = (np.arange(envs) + i * envs) % len(pool)
            steps += int(envs - ended.sum())
            ended = np.full(envs, i % EPISODE == 0)
            vector.step(pool[rows], np.ones(envs), ended, np.zeros(envs, bool))
        vector.close(pool[:envs], np.ones(envs), np.zeros(envs, bool), np.ones(envs, bool))
    client.close()
    return {
        "steps": steps,
        "seconds": time.perf_counter() - began,
        "ok": True,
        "cpu": time.process_time() - cpu,
    }


def worker_local(url: str, seconds: float, start_at: float, seed: int, **opts: Any) -> dict:
    """Local inference at full speed for ``seconds``; the time counts until ``close()`` has
    delivered every step."""
    from pipeline.client import PolicyClient

    pool = _pool(opts["frames"], seed)
    with tempfile.TemporaryDirectory() as spool:
        client = PolicyClient(url, inference_mode="local", spool_dir=spool, seed=seed)
        time.sleep(max(0.0, start_at - time.time()))
        cpu = time.process_time()
        began, steps = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            episode = client.start_episode()
            for t in range(EPISODE):
                client.get_action(episode, pool[(steps + t) % len(pool)])
                client.log_returns(episode, 1.0)
            steps += EPISODE
            client.end_episode(episode, pool[steps % len(pool)], truncated=True)
        played = time.perf_counter() - began
        delivered = client.close(300)
    return {
        "steps": steps,
        "seconds": time.perf_counter() - began,
        "played": played,
        "ok": delivered,
        "cpu": time.process_time() - cpu,
    }


WORKERS = {"remote": worker_remote, "local": worker_local}


# --- orchestration ----------------------------------------------------------------------------


def _phase(kind: str, url: str, clients: int, seconds: float, **opts: Any) -> dict[str, Any]:
    """``clients`` worker processes together: total steps/s, and the server's CPU per step
    (once the server has written the shards of the phase before, which would count here)."""
    _settled(url)
    start_at = time.time() + 1.5 + 0.4 * clients
    extra = [f"--{key}={value}" for key, value in opts.items()]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                kind,
                "--url",
                url,
                "--seconds",
                str(seconds),
                "--start-at",
                str(start_at),
                "--seed",
                str(i),
                *extra,
            ],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        for i in range(clients)
    ]
    cpu = _cpu_seconds(SERVER["pid"])
    results = [json.loads(p.communicate()[0].decode().strip().splitlines()[-1]) for p in processes]
    steps = sum(r["steps"] for r in results)
    cpu = _cpu_seconds(SERVER["pid"]) - cpu
    return {
        "steps": steps,
        "steps_per_s": steps / max(r["seconds"] for r in results),
        "ok": all(r["ok"] for r in results),
        "cpu": f"CPU per step: server {cpu / max(1, steps) * 1e6:.0f} us, clients "
        f"{sum(r['cpu'] for r in results) / max(1, steps) * 1e6:.0f} us",
    }


SERVER: dict[str, int] = {"pid": 0}


def _settled(url: str, patience_s: float = 120.0) -> None:
    """Wait until the server has no rolled shard waiting to be written."""
    import requests

    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        if requests.get(url + "/v1/health", timeout=10).json()["queue_depth"] == 0:
            return
        time.sleep(0.2)


def _serve(data: Path, space: Any = None) -> tuple[subprocess.Popen[str], str]:
    """``rlpipe serve --spaces`` for frames (or ``space``) and two actions, on a port the OS
    picks: the process and its address, once it listens."""
    import gymnasium as gym

    from pipeline.format.spaces import space_to_json

    spaces = data.parent / f"{data.name}-spaces.json"
    observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8) if space is None else space
    doc = {
        "env_id": "Pixels-v0",
        "observation_space": space_to_json(observation_space),
        "action_space": space_to_json(gym.spaces.Discrete(2)),
    }
    spaces.write_text(json.dumps(doc))
    server, url = process.start(["--data", str(data), "--spaces", str(spaces)], cwd=ROOT)
    SERVER["pid"] = server.pid
    return server, url


def _stop(server: subprocess.Popen[str]) -> None:
    server.terminate()  # a clean stop commits every row
    server.wait(120)


def _remote(url: str, seconds: float, frames: str, label: str) -> float:
    """8 clients on the batch form ({ENVS} episodes a request) and one step a request, as Arrow;
    the batch form as JSON, the baseline."""
    batch = _phase("remote", url, 8, seconds, envs=ENVS, frames=frames, json=0)
    single = _phase("remote", url, 8, seconds, envs=1, frames=frames, json=0)
    base = _phase("remote", url, 8, seconds, envs=ENVS, frames=frames, json=1)["steps_per_s"]
    rate = batch["steps_per_s"]
    print(
        f"remote x8 {label}, batch form ({ENVS} episodes a request): {rate:,.0f} steps/s, "
        f"{rate / base:.1f}x the same as JSON ({base:,.0f} steps/s); {batch['cpu']}\n"
        f"remote x8 {label}, a step a request: {single['steps_per_s']:,.0f} steps/s; "
        f"{single['cpu']}"
    )
    return float(rate)


def _local(url: str, seconds: float, data: Path) -> tuple[float, float]:
    """8 local clients' steps/s, durably logged and all delivered, against plain writes of the
    bytes the server logs per step, with its sync policy (fsync every 50 ms)."""
    before = _accepted(url)
    result = _phase("local", url, 8, seconds, frames="random")
    stored = _accepted(url) - before
    if not result["ok"] or stored != result["steps"]:
        raise SystemExit(
            f"local x8: played {result['steps']}, stored {stored}, delivered: {result['ok']}"
        )
    per_step = _logged_bytes_per_step()
    disk = _disk_bytes_per_s(data.parent / "plain-writes", seconds) / per_step
    local = result["steps_per_s"]
    print(
        f"local x8: {local:,.0f} steps/s durably logged, every step delivered; "
        f"{result['cpu']}\n  plain writes of {per_step:,} bytes a step, fsync every 50 ms: "
        f"{disk:,.0f} steps/s: {local / disk:.2f}x"
    )
    return local, local / disk


def _logged_bytes_per_step() -> int:
    """What the server's log holds per step: a row of the step table in Arrow."""
    import gymnasium as gym

    from pipeline.format import codec

    space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
    frame = codec.to_arrow(space, np.zeros((1, *SHAPE), np.uint8)).nbytes
    return 2 * frame + 100  # observation, next_observation, and ~100 bytes of the rest


def _disk_bytes_per_s(path: Path, seconds: float) -> float:
    """Plain file writes of 4 MiB chunks for ``seconds``, fsynced every 50 ms by a thread."""
    chunk = os.urandom(4 * 2**20)
    stop = threading.Event()
    with open(path, "wb") as handle:

        def sync() -> None:
            while not stop.wait(0.05):
                os.fsync(handle.fileno())

        syncer = threading.Thread(target=sync)
        syncer.start()
        began, written = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            handle.write(chunk)
            written += len(chunk)
        handle.flush()
        os.fsync(handle.fileno())
        elapsed = time.perf_counter() - began
        stop.set()
        syncer.join()
    path.unlink()
    return written / elapsed


def _bytes_per_step(data: Path) -> float:
    """The step table's Parquet bytes per row, over the frame's 21,168 bytes."""
    import pyarrow.parquet as pq

    from pipeline.dataset import discovery
    from pipeline.dataset.location import locate

    shards = [Path(path) for path in discovery.list_shards(locate(data))]  # not log checkpoints
    rows = sum(pq.ParquetFile(shard).metadata.num_rows for shard in shards)
    return sum(shard.stat().st_size for shard in shards) / max(1, rows) / np.prod(SHAPE)


def _delivery(url: str, data: Path, seconds: float, server: subprocess.Popen[str]) -> bool:
    """One local client at full speed for ``seconds``: every step delivered, each stored once."""
    import pandas as pd

    result = _phase("local", url, 1, seconds, frames="random")
    _stop(server)
    keys = pd.read_parquet(data / "steps", columns=["episode_id", "agent_id", "t"])
    once = len(keys) == result["steps"] and not keys.duplicated().any()
    print(
        f"delivery: one local client played {result['steps']:,} frames in {seconds:.0f} s; "
        f"close() {result['ok']}; stored {len(keys):,} rows, each step once: {once}"
    )
    return bool(result["ok"] and once)


def run(seconds: float, delivery_seconds: float) -> None:
    from common import machine, report

    print(f"frames 84x84x3 uint8; {machine()}")
    figures: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "rendered.npy", rendered_frames(512))
        for frames in ("random", str(Path(tmp) / "rendered.npy")):
            label = "random" if frames == "random" else "rendered"
            data = Path(tmp) / label
            server, url = _serve(data)
            try:
                steps = _remote(url, seconds, frames, label)
                if label == "random":
                    figures["remote_image_steps_per_s_8"] = steps
                    local, versus = _local(url, seconds, data)
                    figures["local_image_steps_per_s_8"], figures["local_image_vs_disk"] = (
                        local,
                        versus,
                    )
            finally:
                _stop(server)
            ratio = _bytes_per_step(data)
            print(f"bytes per step ({label} frames): {ratio:.2f}x the frame's 21,168")
            figures[f"{label}_bytes_per_step_vs_frame"] = ratio
        figures["image_bytes_per_step_vs_frame"] = figures.pop("random_bytes_per_step_vs_frame")
        if delivery_seconds > 0:
            data = Path(tmp) / "delivery"
            server, url = _serve(data)
            figures["delivery_ok"] = float(_delivery(url, data, delivery_seconds, server))
    for key, bar in BARS.items():
        value = figures.get(key)
        if value is not None:
            ratio = bar / value if key.startswith("image_bytes") else value / bar
            print(f"{key}: {value:,.2f} ({ratio:.2f}x the issue's bar)")
    report(figures)


def threshold(seconds: float) -> None:
    """One remote client, one step a request, JSON against Arrow, for float32 Boxes of growing
    size and the frame: where the binary form starts to win (``BINARY_MIN_BYTES``)."""
    import gymnasium as gym

    from pipeline.client import PolicyClient, binary

    for size in (4, 64, 256, 512, 1024, 4096):
        with tempfile.TemporaryDirectory() as tmp:
            env = gym.spaces.Box(-1, 1, (size,), np.float32)
            server, url = _serve(Path(tmp) / "ds", env)
            try:
                client = PolicyClient(url, inference_mode="remote")
                rates = []
                for limit in (1 << 62, 0):
                    binary.BINARY_MIN_BYTES = limit
                    rates.append(_steps_per_s(client, env.sample, seconds))
                client.close()
            finally:
                _stop(server)
        print(
            f"float32 x{size} ({4 * size} bytes): JSON {rates[0]:,.0f} steps/s, "
            f"Arrow {rates[1]:,.0f} steps/s: {rates[1] / rates[0]:.2f}x"
        )


def _steps_per_s(client: Any, sample: Any, seconds: float) -> float:
    episode, steps = client.start_episode(), 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        client.get_action(episode, sample())
        steps += 1
    client.end_episode(episode, sample())
    return steps / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument(
        "--delivery-seconds",
        type=float,
        default=30.0,
        help="the local client's full-speed play (0: skip)",
    )
    parser.add_argument(
        "--threshold", action="store_true", help="only: where Arrow beats JSON, one remote client"
    )
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--envs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--frames", default="random", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        opts = {"envs": args.envs, "frames": args.frames, "json": args.json}
        work = WORKERS[args.worker]
        print(json.dumps(work(args.url, args.seconds, args.start_at, args.seed, **opts)))
    elif args.threshold:
        threshold(args.seconds)
    else:
        run(args.seconds, args.delivery_seconds)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()

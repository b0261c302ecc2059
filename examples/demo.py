"""The main job end to end: simulators play CartPole through the policy server while PPO trains
from the live dataset, until the policy is solved; then inspect, a learning curve and a replay.

What runs, all on 127.0.0.1 and all real processes:

- ``rlpipe serve`` writes every step to ``runs/demo/data`` and acts for remote clients with the
  newest checkpoint the trainer published;
- ``rlpipe train ppo --follow`` reads the dataset as it grows and publishes a checkpoint after
  every update;
- four ``examples/cartpole_client.py`` processes: two run the policy themselves (local inference,
  pulling weights), two ask the server for every action (remote inference).

Run with ``make demo``; output goes to ``runs/demo`` (or ``--out DIR``). ``--data
s3://bucket/prefix`` (``make demo DATA=s3://bucket/prefix``) puts the dataset in a bucket instead,
reached with the standard environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
...); checkpoints then stay in ``runs/demo/run/checkpoints``, where the server reads them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import requests

from server import process as serve

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = (("local", 1), ("local", 2), ("remote", 3), ("remote", 4))
SOLVED = 475.0
# RL-Zoo's CartPole PPO settings: small updates, many of them (bench/learn.py, racing SB3's
# wall time, waits for 128 new rows an update and keeps GAE's lambda at 0.95; see its PPO_SETTINGS)
PPO_OPTIONS = ("--batch-size", "256", "--lr", "1e-3", "--gamma", "0.98", "--gae-lambda", "0.8",
               "--update-epochs", "20", "--num-minibatches", "1",
               "--anneal-updates", "390")  # fmt: skip
RETURN_LINE = re.compile(r"^episode \S+: total reward (?P<reward>[-\d.]+)")


ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def _rlpipe(*args: str, **options: object) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pipeline", *args]
    return subprocess.Popen(command, text=True, env=ENV, cwd=ROOT, **options)  # type: ignore[call-overload]


def _follow_returns(stream: IO[str], returns: collections.deque[float], counts: list[int]) -> None:
    for line in stream:
        match = RETURN_LINE.match(line)
        if match:
            returns.append(float(match["reward"]))
            counts[0] += 1


def _progress(
    address: str, started: float, returns: collections.deque[float], episodes: int
) -> str:
    try:
        health = requests.get(f"{address}/v1/health", timeout=2).json()
        version = health.get("policy_version")
    except requests.RequestException:
        version = None
    mean = sum(returns) / len(returns) if returns else float("nan")
    return (
        f"\r{time.perf_counter() - started:5.0f}s  episodes {episodes:5d}  "
        f"mean return of the last 20 {mean:6.1f}  policy version {version}   "
    )


def play(out: Path, data: str, budget: float) -> tuple[str, bool]:
    """Serve, train and play until PPO stops (solved) or ``budget`` seconds pass."""
    run = out / "run"
    # a bucket holds no checkpoints: the trainer publishes into its run, the server reads there
    policy = ["--policy", str(run / "checkpoints")] if "://" in data else []
    server, address = serve.start(["--data", data, "--env", "CartPole-v1", *policy,
                                   "--commit-age", "0.25"], env=ENV, cwd=ROOT)  # fmt: skip
    port = address.rsplit(":", 1)[1]
    print(f"rlpipe serve on {address}, writing {data}")
    with (out / "train.log").open("w") as log:
        trainer = _rlpipe("train", "ppo", "--follow", "--data", data, "--run-dir", str(run),
                          "--stop-return", str(SOLVED), "--max-seconds", str(budget),
                          *PPO_OPTIONS, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    returns: collections.deque[float] = collections.deque(maxlen=20)
    counts = [0]
    clients = []
    for mode, seed in CLIENTS:
        client = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "cartpole_client.py"), "--port", port,
             "--inference-mode", mode, "--seed", str(seed * 100_000), "--update-interval", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)),
        )  # fmt: skip
        threading.Thread(target=_follow_returns, args=(client.stdout, returns, counts),
                         daemon=True).start()  # fmt: skip
        clients.append(client)
    print("4 CartPole clients: 2 with local inference, 2 with remote inference; PPO follows live")
    started = time.perf_counter()
    while trainer.poll() is None:
        print(_progress(address, started, returns, counts[0]), end="", flush=True)
        time.sleep(1.0)
    print(_progress(address, started, returns, counts[0]))
    for client in clients:
        client.send_signal(signal.SIGINT)  # local clients deliver what they hold before exiting
    for client in clients:
        try:
            client.wait(timeout=20)
        except subprocess.TimeoutExpired:
            client.kill()
    server.send_signal(signal.SIGINT)  # closes the episodes still open as truncated
    server.wait(timeout=30)
    solved = _solved(run)
    return address, solved


def _solved(run: Path) -> bool:
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scores = [m["episode_return"] for m in metrics if m.get("episode_return") is not None]
    return bool(scores) and max(scores) >= SOLVED


def report(out: Path, data: str) -> None:
    """inspect, the learning curve and a GIF of the best episode."""
    from deltalake import DeltaTable

    from pipeline.commands.cli import main as rlpipe
    from pipeline.dataset.location import locate

    print()
    rlpipe(["inspect", data, "--plot", str(out / "dataset.png")])
    # the episodes table is one row per episode: the best one with a seed can be replayed
    location = locate(data)
    table = DeltaTable(
        location.table_uri("episodes"), storage_options=dict(location.storage_options) or None
    )
    episodes = table.to_pandas().dropna(subset=["seed"])
    best = str(episodes.sort_values("return", ascending=False)["episode_id"].iloc[0])
    gif = out / "best-episode.gif"
    rlpipe(["replay", data, "--episode", best, "--render", str(gif)])
    curves = sorted((out / "run").glob("*.png"))
    print(f"\nlearning curve: {curves[0] if curves else 'none (see run/metrics.jsonl)'}")
    print(f"dataset plot:   {out / 'dataset.png'}")
    print(f"best episode:   {gif} (episode {best})")


def _holds_dataset(uri: str) -> bool:
    import pyarrow.fs as pafs

    from pipeline.dataset.location import locate

    location = locate(uri)
    info = location.filesystem.get_file_info(location.path("manifest.json"))
    return info.type != pafs.FileType.NotFound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo")
    parser.add_argument("--budget", type=float, default=140.0, help="seconds of training at most")
    parser.add_argument(
        "--data",
        help="where the dataset goes (default: OUT/data); a URI such as s3://bucket/prefix, "
        "reached with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... from the environment, must be new",
    )
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    data = args.data or str(args.out / "data")
    if args.data is not None and _holds_dataset(args.data):
        sys.exit(f"demo: {args.data} holds a dataset already; give a new prefix")
    started = time.perf_counter()
    _, solved = play(args.out, data, args.budget)
    print("solved: the mean return of 20 episodes reached 475" if solved else "not solved in time")
    report(args.out, data)
    print(f"demo took {time.perf_counter() - started:.0f}s; everything is in {args.out}")
    sys.exit(0 if solved else 1)


if __name__ == "__main__":
    main()

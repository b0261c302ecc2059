"""The soak's clients (``bench/soak.py``): CartPole simulators that carry on through server kills
and write down every step the server acknowledged.

Each runs in its own process until SIGTERM, then ends its episode, closes its client and prints
one JSON line of counts. It writes the keys ``episode_id agent_id t`` of the rows the server
acknowledged to its own file, one per line. What acknowledges a row (``docs/protocol.md``,
``pipeline/recording/recorder.py``, ``server/stepper.py``):

- Remote inference (one episode or many per request): the row of an agent's step ``t`` is
  completed by the request that brings the agent's next observation (its next ``get_action``, or
  ``end_episode``), and the server makes it durable (``--sync always``: fsynced) before it
  answers. So a call that returned acknowledges the row of each observed agent's pending step,
  and the first observation of an agent acknowledges nothing. A call that raised acknowledges
  nothing (its rows may still be stored: the server may have died between the write and the
  answer). Today an episode open at a server kill is unknown to the restarted server (404), so
  the client abandons it and starts another.
- Local inference: rows are completed in the client and delivered in the background;
  ``flush()`` or ``close()`` returning True says every row completed before the call is on the
  server, so those rows are acknowledged then, and the others are not.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym
import numpy as np

from pipeline.client import PolicyClient, VectorEpisodes
from pipeline.errors import RlpipeError, ServerUnavailable
from pipeline.format.layout import DEFAULT_AGENT_ID as AGENT

STOP = {"now": False}
FLUSH_EVERY_S = 2.0  # local inference: how often a flush point acknowledges rows
AGENTS = ("north", "east")  # the multi-agent client's agents, a CartPole each
OnRow = Callable[[str, str, int], None]  # (episode_id, agent_id, t) of a row a call completed


class Ledger:
    """What one client counts, and its acknowledged keys (one ``episode agent t`` per line)."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = open(path, "w", buffering=1 << 20)  # noqa: SIM115  # see close
        self.acked = 0
        self.episodes = 0
        self.errors: Counter[str] = Counter()

    def ack(self, episode_id: str, agent_id: str, t: int) -> None:
        self.file.write(f"{episode_id} {agent_id} {t}\n")
        self.acked += 1

    def error(self, error: BaseException) -> None:
        status = getattr(error, "status", None)
        self.errors[type(error).__name__ + (f" {status}" if status else "")] += 1
        if not isinstance(error, RlpipeError) or self.errors.total() <= 3:
            traceback.print_exception(error, file=sys.stderr)

    def close(self, **extra: Any) -> None:
        self.file.close()
        counts = {"acked": self.acked, "episodes": self.episodes, "errors": dict(self.errors)}
        print(json.dumps({**counts, **extra}), flush=True)


def _env() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1", disable_env_checker=True)


def _start(client: PolicyClient, ledger: Ledger, seed: int) -> str:
    """A new episode, retried while the server is away (until told to stop)."""
    while True:
        try:
            episode_id = client.start_episode(seed=seed)
            ledger.episodes += 1
            return episode_id
        except RlpipeError as error:
            ledger.error(error)
            if STOP["now"]:
                raise
            time.sleep(0.2)


def play(client: PolicyClient, ledger: Ledger, seed: int, pace: float, on_row: OnRow) -> None:
    """One CartPole episode; ``on_row`` hears of each row as the call completing it returns.
    A call that raises propagates, and the episode is abandoned."""
    env = _env()
    observation, _ = env.reset(seed=seed)
    episode_id = _start(client, ledger, seed)
    t = -1  # the pending step's t (-1: none yet)
    while True:
        action = client.get_action(episode_id, observation)
        if t >= 0:
            on_row(episode_id, AGENT, t)
        t += 1
        observation, reward, terminated, truncated, _ = env.step(action)
        client.log_returns(episode_id, float(reward))
        if terminated or truncated or STOP["now"]:
            client.end_episode(episode_id, observation, truncated=not terminated)
            on_row(episode_id, AGENT, t)
            return
        time.sleep(pace)


def play_agents(
    client: PolicyClient, ledger: Ledger, seed: int, pace: float, on_row: OnRow
) -> None:
    """One multi-agent episode: an independent CartPole per agent. An agent whose CartPole
    terminates sends its last observation with its done flag and leaves; the episode ends when
    all have left, or truncated when one CartPole is truncated (or the client stops)."""
    envs = {agent: _env() for agent in AGENTS}
    observations = {a: env.reset(seed=seed + k)[0] for k, (a, env) in enumerate(envs.items())}
    episode_id = _start(client, ledger, seed)
    pending: dict[str, int] = {}  # t of each acting agent's pending step
    while True:
        actions = client.get_action(episode_id, observations)
        for agent in observations:
            if agent in pending:
                on_row(episode_id, agent, pending[agent])
            if agent in actions:
                pending[agent] = pending.get(agent, -1) + 1
            else:  # its done flag rode on this call: that wrote its last row
                pending.pop(agent, None)
        observations, rewards, dones, cut = {}, {}, {}, False
        for agent in pending:
            observations[agent], rewards[agent], terminated, truncated, _ = envs[agent].step(
                actions[agent]
            )
            dones[agent], cut = bool(terminated), cut or bool(truncated)
        client.log_returns(episode_id, rewards, multiagent_done_dict=dones)
        if cut or all(dones.values()) or STOP["now"]:
            client.end_episode(episode_id, observations, truncated=cut or STOP["now"])
            for agent, t in pending.items():
                on_row(episode_id, agent, t)
            return
        time.sleep(pace)


def run_remote(url: str, ledger: Ledger, seed: int, pace: float, agents: bool) -> dict[str, Any]:
    """Remote inference, single-agent or multi-agent: a row is acknowledged when it is written."""
    client = PolicyClient(url, inference_mode="remote")
    episode, playing = 0, play_agents if agents else play
    while not STOP["now"]:
        episode += 1
        try:
            playing(client, ledger, seed * 100_000 + episode, pace, ledger.ack)
        except RlpipeError as error:
            ledger.error(error)
    client.close()
    return {}


def run_local(url: str, ledger: Ledger, seed: int, pace: float) -> dict[str, Any]:
    """Local inference: rows are acknowledged at flush points and by ``close()``."""
    spool = Path(tempfile.mkdtemp(prefix="soak-spool-"))
    client = _local_client(url, ledger, spool, seed)
    completed: list[tuple[str, str, int]] = []  # rows not yet known to be on the server
    flushed, episode, flushes = time.monotonic(), 0, Counter[str]()
    while not STOP["now"]:
        episode += 1
        try:
            play(client, ledger, seed * 100_000 + episode, pace, lambda *key: completed.append(key))
        except RlpipeError as error:  # a delivery failed for good: a new client takes the spool
            ledger.error(error)
            client.close(5)
            client = _local_client(url, ledger, spool, seed)
        if time.monotonic() - flushed >= FLUSH_EVERY_S:
            flushed = time.monotonic()
            if client.flush(0.5):
                _ack_all(ledger, completed)
            flushes["delivered" if not completed else "not_yet"] += 1
    delivered = client.close(120)
    if delivered:
        _ack_all(ledger, completed)
    return {"undelivered": len(completed), "flushes": dict(flushes), "closed": delivered}


def _local_client(url: str, ledger: Ledger, spool: Path, seed: int) -> PolicyClient:
    """A local-inference client, made once the server answers: making one reads the spaces and
    weights from the server, and a simulator (re)started while the server restarts waits for it,
    as a supervisor would start it again, rather than exiting."""
    while True:
        try:
            return PolicyClient(url, inference_mode="local", spool_dir=spool, seed=seed)
        except ServerUnavailable as error:
            ledger.error(error)


def _ack_all(ledger: Ledger, keys: list[tuple[str, str, int]]) -> None:
    for key in keys:
        ledger.ack(*key)
    keys.clear()


def run_vector(url: str, ledger: Ledger, seed: int, pace: float, envs: int) -> dict[str, Any]:
    """A gymnasium vector env of CartPoles through VectorEpisodes, one request per vector step;
    after a failed step the whole vector env starts over with new episodes."""
    client = PolicyClient(url, inference_mode="remote")
    round_ = 0
    while not STOP["now"]:
        round_ += 1
        try:
            _vector_round(client, ledger, seed * 100_000 + round_ * envs, pace, envs)
        except RlpipeError as error:
            ledger.error(error)
    client.close()
    return {}


def _vector_round(client: PolicyClient, ledger: Ledger, seed: int, pace: float, n: int) -> None:
    """Vector steps until told to stop; each returned step acknowledges the row of every sub-env
    that was in an episode before it (gymnasium's next-step autoreset: a sub-env that ended
    last step starts a new episode now, which completes nothing)."""
    sims = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    vector = VectorEpisodes(client, n)
    observations, _ = sims.reset(seed=seed)
    actions = vector.reset(observations, seeds=[seed + i for i in range(n)])
    ledger.episodes += n
    pending = np.zeros(n, np.int64)  # each sub-env's pending t
    while True:
        observations, rewards, terminated, truncated, _ = sims.step(actions)
        before = list(vector.episode_ids)
        last = STOP["now"]
        if last:
            vector.close(observations, rewards, terminated, truncated)
        else:
            actions = vector.step(observations, rewards, terminated, truncated)
        for i, episode_id in enumerate(before):
            if episode_id is None:  # this observation started a new episode
                pending[i] = 0
                ledger.episodes += 0 if last else 1
                continue
            ledger.ack(episode_id, AGENT, int(pending[i]))
            pending[i] += 1
        if last:
            return
        time.sleep(pace)


def main() -> None:
    parser = argparse.ArgumentParser(description="one soak client (see bench/soak.py)")
    parser.add_argument("kind", choices=["remote", "local", "vector", "agents"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--acks", type=Path, required=True, help="file of acknowledged keys")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pace", type=float, default=0.001, help="seconds between steps")
    parser.add_argument("--envs", type=int, default=8, help="vector: sub-envs")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: STOP.update(now=True))
    ledger = Ledger(args.acks)
    if args.kind == "local":
        extra = run_local(args.url, ledger, args.seed, args.pace)
    elif args.kind == "vector":
        extra = run_vector(args.url, ledger, args.seed, args.pace, args.envs)
    else:
        extra = run_remote(args.url, ledger, args.seed, args.pace, args.kind == "agents")
    ledger.close(kind=args.kind, **extra)


if __name__ == "__main__":
    main()

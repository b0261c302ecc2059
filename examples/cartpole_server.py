"""The server half of RLlib's External Application example, on rlpipe: a policy server for CartPole
that owns no env. Simulators connect with ``examples/cartpole_client.py``; every step they report
lands in the dataset directory, ready for training.

    python examples/cartpole_server.py --data runs/cartpole-server            # port 9900
    python examples/cartpole_server.py --data runs/cartpole-server --port 0   # an OS-picked port

It prints ``serving http://127.0.0.1:PORT -> DIR`` once it listens, and serves until Ctrl-C (or
SIGTERM), then closes open episodes and prints what was recorded. The same server from the shell:
``rlpipe serve --data DIR --env CartPole-v1``.

Where RLlib's server trains in-process, rlpipe's trainer follows the dataset from its own process,
and clients in local inference mode pull the weights it publishes into ``DIR/checkpoints``:

    rlpipe train ppo --follow --data runs/cartpole-server --stop-return 450
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym

from pipeline import InputReader
from server.config import ServerConfig
from server.host import serve


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("runs/cartpole-server"),
                        help="the dataset directory steps are written to")  # fmt: skip
    parser.add_argument("--port", type=int, default=9900, help="0 lets the OS pick one")
    return parser.parse_args()


def summary(data: Path) -> str:
    """One line on what the dataset holds, read back as a trainer would read it."""
    returns = [float(episode.rewards.sum()) for episode in InputReader(data, episodes=True)]
    if not returns:
        return f"recorded no episodes in {data}"
    mean = sum(returns) / len(returns)
    return f"recorded {len(returns)} episodes, mean return {mean:.1f}, in {data}"


def main() -> None:
    args = parse_args()
    # No env is created to run: the server only needs CartPole's spaces, as RLlib's example does.
    env = gym.make("CartPole-v1")
    config = ServerConfig(data=args.data, observation_space=env.observation_space,
                          action_space=env.action_space, env_id="CartPole-v1")  # fmt: skip
    env.close()

    # one worker process serves; it ends open episodes as truncated when told to stop
    serve(config, "127.0.0.1", args.port, threads=8,
          announce=lambda url: print(f"serving {url} -> {args.data}", flush=True))  # fmt: skip
    print(summary(args.data), flush=True)


if __name__ == "__main__":
    main()

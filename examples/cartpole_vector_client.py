"""A vectorized CartPole simulator on rlpipe: a gymnasium vector env of N CartPoles, each vector
step sent to the policy server as one request, each sub-env's episodes recorded as episodes.

Start ``examples/cartpole_server.py`` first, then:

    python examples/cartpole_vector_client.py --port 9900 --envs 16 --steps 1000
    python examples/cartpole_vector_client.py --port 9900 --inference-mode local

``VectorEpisodes`` keeps one episode per sub-env and starts the next one when the sub-env resets
itself (gymnasium's autoreset, next-step by default). Each sub-env's first episode records the
seed the vector env gave it, so ``rlpipe replay`` re-runs it exactly. When the simulator stops,
``close`` ends the episodes still running as truncated.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

from pipeline.client import PolicyClient
from pipeline.client.vector import VectorEpisodes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9900, help="the server's port on 127.0.0.1")
    parser.add_argument("--inference-mode", default="remote", choices=["local", "remote"])
    parser.add_argument("--envs", type=int, default=16, help="sub-envs of the vector env")
    parser.add_argument("--steps", type=int, default=1000, help="vector steps to take")
    parser.add_argument("--seed", type=int, default=0, help="sub-env i is reset with seed + i")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    envs = gym.make_vec("CartPole-v1", num_envs=args.envs, vectorization_mode="sync")
    client = PolicyClient(f"127.0.0.1:{args.port}", inference_mode=args.inference_mode)
    vector = VectorEpisodes(client, args.envs, autoreset_mode=envs.metadata["autoreset_mode"])

    observations, _ = envs.reset(seed=args.seed)  # SyncVectorEnv seeds sub-env i with seed + i
    actions = vector.reset(observations, seeds=[args.seed + i for i in range(args.envs)])
    ended = np.zeros(args.envs, bool)
    steps = finished = running = 0
    for number in range(args.steps):
        observations, rewards, terminated, truncated, infos = envs.step(actions)
        steps += int((~ended).sum())  # a sub-env that ended last step only reset in this one
        if number == args.steps - 1:
            running = int((~ended & ~terminated & ~truncated).sum())
            vector.close(observations, rewards, terminated, truncated, infos)
        else:
            actions = vector.step(observations, rewards, terminated, truncated, infos)
        ended = terminated | truncated
        finished += int(ended.sum())

    delivered = client.close()  # local mode uploads in the background: wait for the server
    envs.close()
    print(f"{steps} steps in {finished + running} episodes ({finished} ended by the envs, "
          f"{running} truncated by close); all steps delivered: {delivered}")  # fmt: skip


if __name__ == "__main__":
    main()

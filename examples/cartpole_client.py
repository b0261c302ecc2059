"""The client half of RLlib's External Application example, on rlpipe: a CartPole simulator that
asks a policy server for actions (or chooses its own) and reports what happened.

Start ``examples/cartpole_server.py`` first, then any number of these:

    python examples/cartpole_client.py --port 9900 --inference-mode remote
    python examples/cartpole_client.py --port 9900 --inference-mode local --episodes 3
    python examples/cartpole_client.py --port 9900 --off-policy   # random actions, logged

The call sequence is RLlib's: ``start_episode``, then per step ``get_action`` (or ``log_action``
for an action the simulator chose itself) and ``log_returns``, and ``end_episode`` at the last
observation. In ``remote`` mode the server picks each action; in ``local`` mode the client acts
with the newest weights it pulls from the server and uploads steps in batches. Only the import
differs from RLlib's ``ray.rllib.env.policy_client.PolicyClient``.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

from pipeline.client import PolicyClient


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9900, help="the server's port on 127.0.0.1")
    parser.add_argument("--inference-mode", default="local", choices=["local", "remote"])
    parser.add_argument("--off-policy", action="store_true",
                        help="take random actions and log them, not the policy's")  # fmt: skip
    parser.add_argument("--no-train", action="store_true",
                        help="mark the episodes as not for training")  # fmt: skip
    parser.add_argument("--stop-reward", type=float, default=9999.0,
                        help="stop once an episode returns this much")  # fmt: skip
    parser.add_argument("--episodes", type=int, default=None, help="stop after this many")
    parser.add_argument("--seed", type=int, default=0, help="seeds episode i with seed + i")
    parser.add_argument("--update-interval", type=float, default=10.0,
                        help="local inference: seconds between weight pulls")  # fmt: skip
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    env = gym.make("CartPole-v1")  # the only env in the whole example, server side included
    env.action_space.seed(args.seed)
    client = PolicyClient(
        f"127.0.0.1:{args.port}",
        inference_mode=args.inference_mode,
        update_interval=args.update_interval,
    )

    number = 0
    while args.episodes is None or number < args.episodes:
        # The seed is recorded with the episode, so `rlpipe replay` can re-run it exactly.
        observation, info = env.reset(seed=args.seed + number)
        episode_id = client.start_episode(training_enabled=not args.no_train,
                                          seed=args.seed + number)  # fmt: skip
        total, terminated, truncated = 0.0, False, False
        while not (terminated or truncated):
            if args.off_policy:
                action = env.action_space.sample()
                client.log_action(episode_id, observation, action)
            else:
                action = client.get_action(episode_id, observation)
            observation, reward, terminated, truncated, info = env.step(action)
            total += float(reward)
            client.log_returns(episode_id, float(reward), info=info)
        client.end_episode(episode_id, observation, truncated=truncated)
        print(f"episode {episode_id}: total reward {total}", flush=True)
        number += 1
        if total >= args.stop_reward:
            print("target reward achieved, exiting")
            break

    # Local mode uploads in the background: wait until the server has every step.
    delivered = client.close()
    env.close()
    print(f"{number} episodes, all steps delivered: {delivered}")


if __name__ == "__main__":
    main()

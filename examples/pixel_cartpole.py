"""A camera simulator on rlpipe: CartPole seen as 84x84x3 ``uint8`` frames, not four floats.

The env is gymnasium's CartPole-v1 rendered as ``rgb_array`` (``AddRenderObservation``) and
resized to 84x84 (Pillow: gymnasium's ``ResizeObservation`` needs OpenCV). Importing this module
registers it as ``PixelCartPole-v0``, so any rlpipe command takes it by the id
``examples.pixel_cartpole:PixelCartPole-v0`` (run from the project root). The whole path:

    rlpipe serve --env examples.pixel_cartpole:PixelCartPole-v0 --data /tmp/pixels --port 9900
    python examples/pixel_cartpole.py --port 9900 --inference-mode remote --episodes 3
    python examples/pixel_cartpole.py --port 9900 --inference-mode local --episodes 3
    rlpipe train bc --data /tmp/pixels --max-updates 50   # a CNN encodes the frames
    rlpipe replay /tmp/pixels --episode <id> --json
    rlpipe inspect /tmp/pixels

Frames travel as Arrow bytes (``PolicyClient`` picks the binary form for large observations) and
are stored once per step, as their bytes (``docs/format.md`` 4.3 and 7).
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AddRenderObservation
from PIL import Image

ENV_ID = "PixelCartPole-v0"
ENV_REF = f"examples.pixel_cartpole:{ENV_ID}"  # the id a command in the project root takes
SIZE = 84


class Resize(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """Frames resized to ``SIZE`` x ``SIZE`` (bilinear), as ``uint8`` (height, width, 3)."""

    def __init__(self, env: gym.Env[np.ndarray, Any]) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        image = Image.fromarray(observation).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        return np.asarray(image, np.uint8)


def make_env(render_mode: str | None = None, **kwargs: Any) -> gym.Env[np.ndarray, Any]:
    """The env; it renders ``rgb_array`` frames whatever ``render_mode`` asks (its frames are
    its observations)."""
    env = gym.make("CartPole-v1", render_mode="rgb_array", **kwargs)
    return Resize(AddRenderObservation(env, render_only=True))


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=make_env, max_episode_steps=500)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9900, help="the server's port on 127.0.0.1")
    parser.add_argument("--inference-mode", default="local", choices=["local", "remote"])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seeds episode i with seed + i")
    return parser.parse_args()


def play(port: int, inference_mode: str, episodes: int, seed: int = 0) -> bool:
    """Play ``episodes`` through the server at ``port``; whether every step was delivered."""
    from pipeline.client import PolicyClient

    env = gym.make(ENV_ID)
    client = PolicyClient(f"127.0.0.1:{port}", inference_mode=inference_mode)
    for number in range(episodes):
        observation, _ = env.reset(seed=seed + number)
        episode_id = client.start_episode(seed=seed + number)
        total, terminated, truncated = 0.0, False, False
        while not (terminated or truncated):
            action = client.get_action(episode_id, observation)
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            total += float(reward)
        client.end_episode(episode_id, observation, truncated=truncated)
        print(f"episode {episode_id}: total reward {total}")
    env.close()
    return client.close()


def main() -> None:
    args = parse_args()
    delivered = play(args.port, args.inference_mode, args.episodes, args.seed)
    print(f"delivered: {delivered}")


if __name__ == "__main__":
    main()

"""``rlpipe replay DIR --episode ID [--render FILE.gif]``: re-run a recorded episode in its env.

The env is rebuilt from the manifest's ``env_id`` and reset with the episode's recorded seed and
reset options (episodes table); the recorded actions are then executed one by one. Row ``t``
diverges when the env's observation before the step, or its reward or next observation after it,
differs from what was recorded, so a deterministic env replays exactly and a tampered or
nondeterministic one is caught at the first step that differs. Observations are compared after the
cast to the observation space's dtype, the one they were stored in.

Where the env cannot be rebuilt (an external simulator, an env id gymnasium does not know), replay
draws the recorded trajectory instead: observations, actions and rewards over ``t``.

``--to ADDRESS`` re-sends recorded episodes to a policy server as a client would (RLlib's
``log_action``/``log_returns``/``end_episode``, with the recorded seed and reset options), for
re-ingesting a dataset elsewhere and for load tests.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.commands.storage_options import add_storage_options, storage_options
from pipeline.errors import ConfigError, DatasetError, RlpipeError

if TYPE_CHECKING:
    from pipeline.dataset.location import Location

_COLUMNS = (
    "observation",
    "action",
    "reward",
    "next_observation",
    "terminated",
    "truncated",
    "training_enabled",
)


@dataclass(frozen=True)
class Divergence:
    """The first row whose ``field`` differs; values are flattened to lists for printing."""

    t: int
    field: str
    recorded: Any
    replayed: Any


@dataclass(frozen=True)
class ReplayResult:
    episode_id: str
    env_id: str | None
    seed: int | None
    steps: int
    replayed_steps: int
    divergence: Divergence | None
    output: str | None = None  # the GIF (or, without an env, the trajectory PNG) written

    @property
    def exact(self) -> bool:
        return self.divergence is None and self.replayed_steps == self.steps

    def describe(self) -> str:
        head = (
            f"episode {self.episode_id} ({self.env_id or 'no env'}, seed {self.seed}, "
            f"{self.steps} steps)"
        )
        if self.replayed_steps == 0 and self.env_id is None:
            body = "not replayed: the dataset names no env"
        elif self.divergence is None:
            body = f"replayed {self.replayed_steps} steps with zero divergence"
        else:
            d = self.divergence
            body = f"diverged at t={d.t} in {d.field}: recorded {d.recorded}, replayed {d.replayed}"
        if self.divergence is not None and self.divergence.t == 0 and self.seed is None:
            body += " (no seed was recorded, so the env started from a random state)"
        tail = f"\nwrote {self.output}" if self.output else ""
        return f"{head}: {body}{tail}"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="re-run a recorded episode in its env and report where it diverges",
        description="Rebuild the env from the manifest and the episode's seed and reset options, "
        "re-execute the recorded actions, and report the first step where observations or "
        "rewards diverge. Exit code 0: replayed exactly; 1: diverged.",
    )
    parser.add_argument("dir", metavar="DIR", help="the dataset: a local path or a URI")
    parser.add_argument(
        "--episode", metavar="ID", help="the episode id (with --to: all episodes when absent)"
    )
    parser.add_argument("--agent", default=None, help="the agent id (multi-agent datasets)")
    parser.add_argument(
        "--render",
        metavar="FILE.gif",
        help="write an animated GIF of the replay (a PNG of the recorded trajectory when the env "
        "cannot be rebuilt)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document")
    parser.add_argument(
        "--to", metavar="ADDRESS", help="re-send the episodes to the server at ADDRESS instead"
    )
    parser.add_argument(
        "--inference-mode",
        choices=("local", "remote"),
        default="local",
        help="with --to: upload in batches (local) or one request per step (remote)",
    )
    parser.add_argument("--token", default=None, help="with --to: the server's bearer token")
    add_storage_options(parser)
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    from pipeline.dataset.location import locate

    dataset = locate(args.dir, storage_options("replay", args.storage_option))
    if args.to:
        episodes, steps = resend(
            dataset,
            args.to,
            episode_id=args.episode,
            inference_mode=args.inference_mode,
            token=args.token,
        )
        print(f"re-sent {episodes} episodes ({steps} steps) to {args.to}")
        return 0
    if not args.episode:
        raise ConfigError("replay", "episode", "an episode id (--episode ID), or --to", None)
    result = replay_episode(dataset, args.episode, agent_id=args.agent, render=args.render)
    print(json.dumps(asdict(result), default=str) if args.json else result.describe())
    return 0 if result.exact or result.env_id is None else 1


def replay_episode(
    path: str | Path | Location,
    episode_id: str,
    *,
    agent_id: str | None = None,
    render: str | Path | None = None,
) -> ReplayResult:
    """Replay one episode; see the module docstring for what counts as divergence."""
    import gymnasium as gym

    from pipeline.format.manifest import read_manifest

    manifest = read_manifest(path)
    episode = read_episode(path, episode_id, agent_id)
    seed, options = _reset_args(path, episode_id, agent_id)
    steps = len(episode.rewards)
    output: str | None
    if manifest.env_id is None:
        output = _draw_or_explain(episode, manifest, render, "the dataset names no env")
        return ReplayResult(episode_id, None, seed, steps, 0, None, output)
    try:
        # frames go to an array, never a screen: keep SDL from looking for a display
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        env = gym.make(manifest.env_id, render_mode="rgb_array" if render else None)
    except (gym.error.Error, ImportError) as error:
        output = _draw_or_explain(episode, manifest, render, f"{manifest.env_id!r}: {error}")
        return ReplayResult(episode_id, None, seed, steps, 0, None, output)
    try:
        divergence, replayed, frames = _execute(env, manifest, episode, seed, options, render)
    finally:
        env.close()
    output = _write_gif(frames, render, env.metadata.get("render_fps", 30)) if render else None
    return ReplayResult(episode_id, manifest.env_id, seed, steps, replayed, divergence, output)


def read_episode(path: str | Path | Location, episode_id: str, agent_id: str | None = None) -> Any:
    """The episode's step rows as one Batch ordered by ``t``."""
    import pyarrow.dataset as ds

    from pipeline.dataset.reader import InputReader

    reader = InputReader(
        path,
        episodes=True,
        columns=_COLUMNS,
        agent_ids=(agent_id,) if agent_id else None,
        filter=ds.field("episode_id") == episode_id,
    )
    found = list(reader)
    if not found:
        raise DatasetError(f"{path}: no steps of episode {episode_id!r}")
    if len(found) > 1:
        agents = sorted({str(batch.agent_ids[0]) for batch in found})
        raise DatasetError(f"episode {episode_id!r} has agents {agents}; choose one with --agent")
    return found[0]


def resend(
    path: str | Path | Location,
    address: str,
    *,
    episode_id: str | None = None,
    inference_mode: str = "local",
    token: str | None = None,
) -> tuple[int, int]:
    """Re-send recorded episodes (all, or one) through a PolicyClient; (episodes, steps) sent.

    Raises:
        DatasetError: when the client could not deliver every step before closing.
    """
    import pyarrow.dataset as ds

    from pipeline.client import PolicyClient
    from pipeline.dataset.reader import InputReader

    condition = ds.field("episode_id") == episode_id if episode_id else None
    reader = InputReader(path, episodes=True, columns=_COLUMNS, filter=condition)
    client = PolicyClient(address, inference_mode, update_interval=None, token=token)
    episodes = steps = 0
    try:
        for episode in reader:
            steps += _resend_episode(client, path, episode)
            episodes += 1
    finally:
        delivered = client.close()
    if not delivered:
        raise DatasetError(f"{address}: not every step was delivered before the client closed")
    if episode_id and not episodes:
        raise DatasetError(f"{path}: no steps of episode {episode_id!r}")
    return episodes, steps


def _resend_episode(client: Any, path: str | Path | Location, episode: Any) -> int:
    from pipeline.recording.batches import row_of

    episode_id = str(episode.episode_ids[0])
    seed, options = _reset_args(path, episode_id, str(episode.agent_ids[0]))
    sent = client.start_episode(
        episode_id=episode_id,
        training_enabled=bool(episode.training_enabled[0]),
        seed=seed,
        options=options,
    )
    n = len(episode.rewards)
    for t in range(n):
        client.log_action(sent, row_of(episode.observations, t), row_of(episode.actions, t))
        client.log_returns(sent, float(episode.rewards[t]))
    terminated = bool(episode.terminateds[-1])
    client.end_episode(sent, row_of(episode.next_observations, n - 1), truncated=not terminated)
    return n


def _reset_args(
    path: str | Path | Location, episode_id: str, agent_id: str | None
) -> tuple[int | None, dict[str, Any] | None]:
    """The seed and reset options the episodes table recorded (None when it has no row)."""
    import pyarrow.dataset as ds

    from pipeline.dataset import discovery
    from pipeline.dataset.location import locate

    keep = ds.field("episode_id") == episode_id
    if agent_id:
        keep = keep & (ds.field("agent_id") == agent_id)
    return discovery.reset_args(locate(path), keep).get(episode_id, (None, None))


def _execute(
    env: Any, manifest: Any, episode: Any, seed: int | None, options: Any, render: Any
) -> tuple[Divergence | None, int, list[Any]]:
    """Step the env through the recorded actions, noting the first divergence."""
    from pipeline.recording.batches import row_of

    observation_space = manifest.observation_space
    observation, _ = env.reset(seed=seed, options=options)
    frames = [env.render()] if render else []
    divergence: Divergence | None = None
    replayed = 0
    for t in range(len(episode.rewards)):
        recorded_now = row_of(episode.observations, t)
        if divergence is None and not _same(observation_space, recorded_now, observation):
            divergence = _diverged(observation_space, t, "observation", recorded_now, observation)
        observation, reward, terminated, truncated, _ = env.step(row_of(episode.actions, t))
        replayed += 1
        if render:
            frames.append(env.render())
        if divergence is None and float(reward) != float(episode.rewards[t]):
            divergence = Divergence(t, "reward", float(episode.rewards[t]), float(reward))
        recorded_next = row_of(episode.next_observations, t)
        if divergence is None and not _same(observation_space, recorded_next, observation):
            divergence = _diverged(
                observation_space, t, "next_observation", recorded_next, observation
            )
        if (terminated or truncated) and t + 1 < len(episode.rewards):
            if divergence is None:
                divergence = Divergence(
                    t, "ended", "running", "terminated" if terminated else "truncated"
                )
            break
    return divergence, replayed, frames


def _flat(space: Any, value: Any) -> Any:
    """``value`` flattened, in the dtype the dataset stores the space in."""
    import gymnasium as gym
    import numpy as np

    if isinstance(space, gym.spaces.Box):
        return np.asarray(value).astype(space.dtype).reshape(-1)
    return np.asarray(gym.spaces.utils.flatten(space, value)).reshape(-1)


def _same(space: Any, recorded: Any, replayed: Any) -> bool:
    import numpy as np

    return bool(np.array_equal(_flat(space, recorded), _flat(space, replayed)))


def _diverged(space: Any, t: int, field: str, recorded: Any, replayed: Any) -> Divergence:
    return Divergence(t, field, _flat(space, recorded).tolist(), _flat(space, replayed).tolist())


def _write_gif(frames: list[Any], path: str | Path | None, fps: int) -> str:
    try:
        from PIL import Image
    except ModuleNotFoundError:
        raise RlpipeError("--render needs Pillow: pip install pillow") from None
    images = [Image.fromarray(frame) for frame in frames if frame is not None]
    if not images:
        raise RlpipeError("--render: the env returned no rgb_array frames")
    target = Path(str(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    duration = max(20, round(1000 / max(1, int(fps))))
    images[0].save(
        target, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0
    )
    return str(target.resolve())


def _draw_or_explain(episode: Any, manifest: Any, render: Any, why: str) -> str:
    if not render:
        raise DatasetError(
            f"cannot rebuild the env ({why}); pass --render FILE.png to draw the recorded "
            "trajectory instead"
        )
    return draw_trajectory(episode, manifest, Path(str(render)).with_suffix(".png"))


def draw_trajectory(episode: Any, manifest: Any, out: Path) -> str:
    """Observations (flattened), actions and rewards of the recorded episode over ``t``."""
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise RlpipeError("drawing a trajectory needs matplotlib: pip install matplotlib") from None
    from pipeline.format import flattening

    observations = flattening.flatten_batch(manifest.observation_space, episode.observations)
    actions = flattening.flatten_batch(manifest.action_space, episode.actions)
    figure = Figure(figsize=(8, 8), dpi=100)
    top, middle, bottom = figure.subplots(3, 1, sharex=True)
    top.plot(observations)
    top.set(ylabel="observation", title="Recorded trajectory (the env could not be rebuilt)")
    middle.plot(actions, drawstyle="steps-post")
    middle.set(ylabel="action")
    bottom.plot(episode.rewards)
    bottom.set(xlabel="t", ylabel="reward")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png")
    return str(out.resolve())

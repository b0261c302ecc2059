"""``rlpipe train`` end to end: offline from history, resuming, online from a live dataset."""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from trainer_factories import (
    bandit,
    bandit_reward,
    count_rows,
    logged_play,
    rllib_cartpole,
    scripted_cartpole,
)

from pipeline import DatasetWriter, InputReader
from pipeline.commands.cli import main
from pipeline.format.schema import rows_to_columns
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.policy.network import NumpyPolicy
from pipeline.trainers import loop  # noqa: F401  (torch imported before client threads start)

ANCHOR = Path(__file__).resolve().parents[2] / "shared" / "anchor-data" / "rllib-test-data"
SMALL = ["--hidden", "32,32", "--eval-episodes", "2", "--lr", "0.003"]


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _has_tensorboard() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def test_train_bc_offline_checkpoints_to_the_run_dir_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = scripted_cartpole(tmp_path / "ds", steps=3000, epsilon=0.1)
    run_dir = tmp_path / "run"
    args = ["train", "bc", "--data", str(data), "--run-dir", str(run_dir), "--max-updates",
            "300", "--eval-every", "150", *SMALL]  # fmt: skip
    assert main(args) == 0
    metrics = _metrics(run_dir)
    assert [m["version"] for m in metrics] == [1, 2]
    assert metrics[-1]["eval_return"] > 150  # random play: about 22
    assert latest_checkpoint(run_dir) == run_dir / "checkpoints" / "policy-00000002.npz"
    assert not (data / "checkpoints").exists()  # never into the dataset
    assert (run_dir / "learning_curve.png").exists() == _has_matplotlib()
    # TensorBoard scalars beside metrics.jsonl (tests/test_board.py reads them back)
    assert bool(list(run_dir.glob("events.out.tfevents.*"))) == _has_tensorboard()
    # the same run dir resumes: trainer state, version and update counters and metrics carry on
    assert main([*args[:7], "400", "--eval-every", "100", *SMALL]) == 0
    resumed = _metrics(run_dir)[-1]
    assert resumed["version"] == 3 and resumed["update"] == 400
    assert load_checkpoint(latest_checkpoint(run_dir)).spec.algorithm == "bc"  # type: ignore[arg-type]
    # a run that has made its --max-updates says so, rather than making one more
    assert main([*args[:7], "400", *SMALL]) == 2
    assert "train.max_updates: expected more than the 400 updates" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ppo"], "train.algorithm: expected --follow, or one of ('sac', 'bc', 'marwil', 'cql')"),
        (["marwil", "--follow"], "train.follow: expected an online algorithm"),
        (["bc", "--batch-size", "0"], "train.batch_size: expected an integer >= 1, got 0"),
        (
            ["bc", "--env", "NoSuchEnv-v0"],
            'train.env: expected a registered gymnasium id, got "NoSuchEnv-v0 (Environment',
        ),
    ],
)
def test_train_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    data = scripted_cartpole(tmp_path / "ds", steps=50, epsilon=0.5)
    code = main(
        ["train", argv[0], "--data", str(data), "--run-dir", str(tmp_path / "r"), *argv[1:]]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def _client(data: Path, stop: threading.Event, seed: int, env_id: str = "CartPole-v1") -> None:
    """A local-inference client: acts with the newest published checkpoint, logs its rows."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    with DatasetWriter(data) as writer:
        episode = 0
        while not stop.is_set():
            path = latest_checkpoint(data)
            if path is None:
                stop.wait(0.05)
                continue
            policy = NumpyPolicy(load_checkpoint(path))
            rows = []
            observation, _ = env.reset(seed=seed * 10_000 + episode)
            for t in range(100):  # episodes cut short: the trainer sees rows sooner
                action, logp = policy.act(observation[None], rng)
                next_observation, reward, terminated, truncated, _ = env.step(action[0])
                rows.append({"episode_id": f"c{seed}-{episode}", "t": t, "observation": observation,
                             "action": action[0], "reward": float(reward),
                             "next_observation": next_observation, "terminated": terminated,
                             "truncated": truncated, "action_logp": float(logp[0]),
                             "policy_version": policy.version})  # fmt: skip
                observation = next_observation
                if terminated or truncated or t == 99:
                    rows[-1]["truncated"] = not terminated
                    break
            writer.append(rows_to_columns(rows))
            writer.flush()
            episode += 1
            stop.wait(0.02)  # share the GIL with the trainer, as separate processes would
    env.close()


def _train_beside(clients: list[Callable[[], None]], stop: threading.Event, argv: list[str]) -> int:
    """``rlpipe train ARGV`` while ``clients`` play on threads; they stop when it returns."""
    threads = [threading.Thread(target=client) for client in clients]
    for thread in threads:
        thread.start()
    try:
        return main(["train", *argv])
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_train_ppo_online_publishes_versions_the_clients_act_with(tmp_path: Path) -> None:
    data = tmp_path / "live"
    env = gym.make("CartPole-v1")
    DatasetWriter(data, env.observation_space, env.action_space, env_id="CartPole-v1").close()
    env.close()
    stop = threading.Event()
    clients = [functools.partial(_client, data, stop, s) for s in (1, 2)]
    code = _train_beside(clients, stop, ["ppo", "--data", str(data), "--follow", "--run-dir",
                         str(tmp_path / "run"), "--max-updates", "3", "--batch-size", "300",
                         "--timeout", "20", "--eval-episodes", "1"])  # fmt: skip
    assert code == 0
    published = sorted(p.name for p in (data / "checkpoints").iterdir())
    assert published == [f"policy-{v:08d}.npz" for v in (1, 2, 3, 4)]
    reader = InputReader(data, columns=["policy_version"])
    versions = np.concatenate([batch.policy_versions for batch in reader])
    assert versions.max() >= 2  # the clients acted with a newer version
    assert [m["version"] for m in _metrics(tmp_path / "run")] == [1, 2, 3, 4]


@pytest.mark.parametrize("algorithm", ["bc", "marwil"])
def test_train_offline_on_rllib_recorded_cartpole(tmp_path: Path, algorithm: str) -> None:
    source = ANCHOR / "cartpole" / "cartpole-v1_large"
    if not source.is_dir():
        pytest.skip(f"anchor data absent: {source}")
    data = rllib_cartpole(source, tmp_path / "ds")
    run_dir = tmp_path / "run"
    args = ["train", algorithm, "--data", str(data), "--run-dir", str(run_dir),
            "--max-updates", "200", "--eval-every", "200", *SMALL]  # fmt: skip
    assert main(args) == 0
    # RLlib's own learning test for BC on this data asks for 350
    assert _metrics(run_dir)[-1]["eval_return"] >= 350


def test_train_sac_online_samples_a_replay_buffer_of_live_rows(tmp_path: Path) -> None:
    data = tmp_path / "live"
    env = gym.make("Pendulum-v1")
    DatasetWriter(data, env.observation_space, env.action_space, env_id="Pendulum-v1").close()
    env.close()
    stop = threading.Event()
    client = functools.partial(_client, data, stop, 1, "Pendulum-v1")
    code = _train_beside([client], stop, ["sac", "--data", str(data), "--follow", "--run-dir",
                         str(tmp_path / "run"), "--max-updates", "40", "--eval-every", "20",
                         "--batch-size", "64", "--hidden", "16", "--timeout", "20",
                         "--eval-episodes", "1"])  # fmt: skip
    assert code == 0
    metrics = _metrics(tmp_path / "run")
    assert [m["version"] for m in metrics] == [1, 2, 3]
    assert metrics[-1]["update"] >= 40 and "eval_return" in metrics[-1]
    assert NumpyPolicy(load_checkpoint(latest_checkpoint(data))).spec.distribution == (  # type: ignore[arg-type]
        "squashed_gaussian"
    )


def test_train_ppo_online_through_a_real_server(tmp_path: Path) -> None:
    """A real server, a trainer following its dataset, two local-inference clients."""
    from server_fixtures import cartpole_config, running_server

    from pipeline import WriterConfig
    from pipeline.client import PolicyClient

    data = tmp_path / "live"
    config = cartpole_config(data, policy_poll_s=0.2, writer=WriterConfig(max_age_s=0.3))
    stop = threading.Event()

    def play(url: str, seed: int) -> None:
        env = gym.make("CartPole-v1")
        with PolicyClient(
            url,
            update_interval=0.2,
            seed=seed,
            upload_rows=64,
            upload_interval_s=0.2,
            spool_dir=tmp_path / f"spool-{seed}",
        ) as client:
            episode = 0
            while not stop.is_set():
                episode_id = client.start_episode()
                observation, _ = env.reset(seed=seed * 1000 + episode)
                for _ in range(100):
                    action = client.get_action(episode_id, observation)
                    observation, reward, terminated, truncated, _ = env.step(action)
                    client.log_returns(episode_id, float(reward))
                    if terminated or truncated:
                        break
                client.end_episode(episode_id, observation, truncated=not terminated)
                episode += 1
                stop.wait(0.02)  # share the GIL with the trainer, as separate processes would
        env.close()

    with running_server(config) as server:
        clients = [functools.partial(play, server.url, s) for s in (1, 2)]
        code = _train_beside(clients, stop, ["ppo", "--data", str(data), "--follow", "--run-dir",
                             str(tmp_path / "run"), "--max-updates", "2", "--batch-size", "200",
                             "--timeout", "20", "--eval-episodes", "1"])  # fmt: skip
    assert code == 0
    assert latest_checkpoint(data) == data / "checkpoints" / "policy-00000003.npz"
    reader = InputReader(data, columns=["policy_version"])
    versions = np.concatenate([batch.policy_versions for batch in reader])
    assert versions.max() >= 2  # the clients acted with a version the trainer published


def _untrained(include: bool) -> list[str]:
    return ["--include-untrained"] if include else []


@pytest.mark.parametrize("include", [False, True], ids=["default", "include-untrained"])
@pytest.mark.parametrize(
    ("algorithm", "discrete"), [("bc", True), ("marwil", True), ("cql", True), ("sac", False)]
)
def test_train_offline_skips_training_disabled_episodes_unless_asked(
    tmp_path: Path, algorithm: str, discrete: bool, include: bool
) -> None:
    """300 expert episodes, then 300 of the worst actions marked training_enabled=False."""
    data = bandit(tmp_path / "ds", steps=300, discrete=discrete, expert=True, untrained=300)
    run_dir = tmp_path / "run"
    args = ["train", algorithm, "--data", str(data), "--run-dir", str(run_dir)]
    options = ["--max-updates", "1", "--eval-every", "1", "--hidden", "16"]
    assert main([*args, *options, *_untrained(include)]) == 0
    assert _metrics(run_dir)[-1]["rows"] == (600 if include else 300)


def test_train_bc_offline_learns_nothing_from_training_disabled_episodes(tmp_path: Path) -> None:
    """RLlib's promise: an episode started with training_enabled=False gives no training batch.
    Here those episodes hold the worst actions; learning from them too halves the reward."""
    data = bandit(tmp_path / "ds", steps=1000, discrete=True, expert=True, untrained=1000)
    run_dir = tmp_path / "run"
    args = ["train", "bc", "--data", str(data), "--run-dir", str(run_dir)]
    assert main([*args, "--max-updates", "200", "--eval-every", "200", *SMALL]) == 0
    policy = NumpyPolicy(load_checkpoint(latest_checkpoint(run_dir)))  # type: ignore[arg-type]
    s = np.linspace(-1, 1, 101, dtype=np.float32)[:, None]
    actions, _ = policy.act(s, np.random.default_rng(0), explore=False)
    assert bandit_reward(actions, s, discrete=True) > 0.95  # about 0.5 with the others too


@pytest.mark.parametrize("include", [False, True], ids=["default", "include-untrained"])
@pytest.mark.parametrize(("algorithm", "env_id"), [("ppo", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_train_online_skips_training_disabled_episodes_unless_asked(
    tmp_path: Path, algorithm: str, env_id: str, include: bool
) -> None:
    """Rows of version 1, every second episode training_enabled=False, all committed before
    the trainer starts: its first update reads them all in one look."""
    data = logged_play(tmp_path / "live", env_id, episodes=8)
    trained, total = count_rows(data, training_enabled=True), count_rows(data)
    assert 0 < trained < total
    run_dir = tmp_path / "run"
    args = ["train", algorithm, "--data", str(data), "--follow", "--run-dir", str(run_dir)]
    options = ["--max-updates", "1", "--batch-size", str(trained), "--timeout", "5"]
    assert main([*args, *options, "--hidden", "16", *_untrained(include)]) == 0
    last = _metrics(run_dir)[-1]
    assert (last["update"], last["env_steps"]) == (1, total if include else trained)
    assert count_rows(data) == total  # stored and kept: inspect and replay see every row

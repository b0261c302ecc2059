"""RLlib importers against RLlib's real recordings, the episode rules, and the numpy-only unpickler.

The source's figures (steps, episodes, per-episode returns) are computed here straight from the raw
files with json and pyarrow, never through the importer's own code.
"""

from __future__ import annotations

import base64
import json
import math
import re
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import lz4.frame
import numpy as np
import pyarrow.dataset as ds
import pytest

from pipeline import InputReader, read_manifest
from pipeline.commands.cli import main
from pipeline.errors import DatasetError, RlpipeWarning
from pipeline.importers import boundaries
from pipeline.importers.transitions import SourceSteps, env_spaces
from pipeline.importers.unpickler import load_ndarray

ANCHOR = Path(__file__).resolve().parents[2] / "shared" / "anchor-data" / "rllib-test-data"
needs_anchor = pytest.mark.skipif(not ANCHOR.is_dir(), reason=f"no anchor data at {ANCHOR}")

# (format, source, --env, --max-episode-steps, expected (terminated, truncated) episodes)
SOURCES = [
    ("rllib-json", "cartpole/small.json", "CartPole-v1", None, (3, 0)),
    ("rllib-json", "cartpole/large.json", "CartPole-v1", 200, (1, 20)),
    ("rllib-json", "pendulum/small.json", "Pendulum-v1", None, (0, 1)),
    ("rllib-json", "pendulum/large.json", "Pendulum-v1", None, (0, 30)),
    ("rllib-json", "pendulum/enormous.zip", "Pendulum-v1", None, (0, 82)),
    ("rllib-jsonl", "cartpole/cartpole-v1.jsonl", "CartPole-v1", None, (3, 0)),
    ("rllib-jsonl", "cartpole/cartpole-v1_large.jsonl", "CartPole-v1", 200, (1, 20)),
    ("rllib-parquet", "cartpole/cartpole-v1_large", "CartPole-v1", 200, (1, 20)),
    ("rllib-parquet", "pendulum/pendulum-v1_large", "Pendulum-v1", None, (0, 30)),
    ("rllib-parquet", "pendulum/pendulum-v1_enormous", "Pendulum-v1", None, (0, 82)),
]

# Pendulum recordings whose actions all lie in [-1, 1] while Pendulum's torque spans [-2, 2]
NORMALIZED = {"pendulum/small.json", "pendulum/enormous.zip", "pendulum/pendulum-v1_enormous"}


def source_figures(fmt: str, src: Path) -> dict[str, Any]:
    """Rows, and per eps_id: step count, exact return, and whether its last row says done."""
    if fmt == "rllib-parquet":
        table = ds.dataset(src, format="parquet").to_table(columns=["eps_id", "rewards", "dones"])
        rows: list[dict[str, Any]] = table.to_pylist()
    elif fmt == "rllib-jsonl":
        rows = [
            json.loads(line) for p in sorted(src.iterdir()) for line in p.read_text().splitlines()
        ]
    else:
        if src.suffix == ".zip":
            with zipfile.ZipFile(src) as archive:
                text = archive.read("enormous.json").decode()
        else:
            text = src.read_text()
        rows = []
        for line in text.splitlines():
            batch = json.loads(line)
            rows += [
                {"eps_id": e, "rewards": r, "dones": d}
                for e, r, d in zip(batch["eps_id"], batch["rewards"], batch["dones"], strict=True)
            ]
    rewards: dict[str, list[float]] = defaultdict(list)
    done: dict[str, bool] = {}
    for row in rows:
        rewards[str(row["eps_id"])].append(float(row["rewards"]))
        done[str(row["eps_id"])] = bool(row["dones"])
    return {
        "steps": len(rows),
        "lengths": {key: len(values) for key, values in rewards.items()},
        "returns": {key: math.fsum(values) for key, values in rewards.items()},
        "done": done,
    }


def episodes_table(path: Path) -> dict[str, dict[str, Any]]:
    rows = ds.dataset(path / "episodes", format="parquet", partitioning="hive").to_table()
    return {row["episode_id"]: row for row in rows.to_pylist()}


@needs_anchor
@pytest.mark.parametrize(("fmt", "source", "env_id", "limit", "ends"), SOURCES)
def test_import_of_rllib_recordings_keeps_counts_and_returns_exactly(
    tmp_path: Path,
    fmt: str,
    source: str,
    env_id: str,
    limit: int | None,
    ends: tuple[int, int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, dest = ANCHOR / source, tmp_path / "ds"
    argv = ["import", fmt, str(src), str(dest), "--env", env_id]
    argv += ["--max-episode-steps", str(limit)] if limit else []
    if source in NORMALIZED:  # counts and returns do not depend on the flag: leave it out
        with pytest.warns(RlpipeWarning, match=re.escape("import with --actions-normalized")):
            assert main(argv) == 0
    else:
        assert main(argv) == 0
    expected = source_figures(fmt, src)
    assert f"imported {expected['steps']} steps in {len(expected['lengths'])} episodes" in (
        capsys.readouterr().out
    )

    episodes = list(InputReader(dest, episodes=True))
    assert sum(len(e.rewards) for e in episodes) == expected["steps"]
    assert {e.episode_ids[0]: len(e.rewards) for e in episodes} == expected["lengths"]
    assert {e.episode_ids[0]: math.fsum(e.rewards.tolist()) for e in episodes} == expected[
        "returns"
    ]
    for episode in episodes:  # every episode ends on exactly one flagged row, its last
        ended = episode.terminateds | episode.truncateds
        assert ended[-1] and not ended[:-1].any()
        assert episode.ts.tolist() == list(range(len(episode.ts)))

    table = episodes_table(dest)
    assert {key: row["return"] for key, row in table.items()} == expected["returns"]
    assert {key: row["length"] for key, row in table.items()} == expected["lengths"]
    reasons = [row["end_reason"] for row in table.values()]
    assert (reasons.count("terminated"), reasons.count("truncated")) == ends
    assert read_manifest(dest).env_id == env_id


@needs_anchor
def test_cartpole_episodes_terminated_exactly_where_the_pole_fell(tmp_path: Path) -> None:
    """The 200-step limit the data was recorded under makes 20 episodes truncated; the one that
    ended early ended because CartPole's termination rule fired (|x| > 2.4 or |angle| > 0.2095)."""
    src = ANCHOR / "cartpole/cartpole-v1_large"
    argv = ["import", "rllib-parquet", str(src), str(tmp_path / "ds"), "--env", "CartPole-v1"]
    assert main([*argv, "--max-episode-steps", "200"]) == 0
    raw = ds.dataset(src, format="parquet").to_table(columns=["eps_id", "dones", "new_obs"])
    columns = (raw[name].to_pylist() for name in raw.column_names)
    last = {str(e): o for e, d, o in zip(*columns, strict=True) if d}
    fell = {key for key, obs in last.items() if abs(obs[0]) > 2.4 or abs(obs[2]) > 0.2095}
    table = episodes_table(tmp_path / "ds")
    assert {k for k, row in table.items() if row["end_reason"] == "terminated"} == fell
    assert len(fell) == 1


def steps(keys: list[Any], **flags: list[bool]) -> SourceSteps:
    n = len(keys)
    return SourceSteps(
        episode_keys=np.asarray(keys),
        observations=np.zeros((n, 2)),
        actions=np.zeros(n, dtype=np.int64),
        rewards=np.arange(n, dtype=np.float64),
        next_observations=np.zeros((n, 2)),
        **{name: np.asarray(values) for name, values in flags.items()},
    )


def ends(source: SourceSteps, limit: int | None = None) -> list[tuple[str, int, str]]:
    """(episode id, length, end reason) per episode."""
    split = boundaries.split(source, limit)
    out = []
    for start, end in zip(split.starts, split.ends, strict=True):
        reason = "terminated" if split.terminateds[end - 1] else "truncated"
        assert split.terminateds[end - 1] != split.truncateds[end - 1]
        out.append((str(split.episode_ids[start]), int(end - start), reason))
    return out


@pytest.mark.parametrize(
    ("source", "limit", "expected"),
    [
        # a done before the time limit ends the episode: terminated
        (steps([1, 1, 1], dones=[False, False, True]), 5, [("1", 3, "terminated")]),
        # a done at the time limit: truncated
        (steps([1, 1, 1], dones=[False, False, True]), 3, [("1", 3, "truncated")]),
        # the id changes without a done, and the data ends without one: both truncated
        (steps([1, 1, 2], dones=[False, False, False]), None, [("1", 2, "truncated"),
                                                              ("2", 1, "truncated")]),
        # explicit columns win over the time limit
        (steps([7, 7], terminateds=[False, True], truncateds=[False, False]), 2,
         [("7", 2, "terminated")]),
        (steps([7, 7], terminateds=[False, False], truncateds=[False, True]), None,
         [("7", 2, "truncated")]),
        # interleaved rows of two episodes are grouped, keeping source order inside each
        (steps([1, 2, 1, 2], dones=[False, False, True, True]), None, [("1", 2, "terminated"),
                                                                      ("2", 2, "terminated")]),
        # an id reused after a done starts a second episode
        (steps([4, 4, 4], dones=[True, False, True]), None, [("4", 1, "terminated"),
                                                             ("4-1", 2, "terminated")]),
    ],
)  # fmt: skip
def test_episode_boundaries_and_end_reasons(
    source: SourceSteps, limit: int | None, expected: list[tuple[str, int, str]]
) -> None:
    assert ends(source, limit) == expected


def test_time_limit_counts_the_source_step_index_when_given() -> None:
    """An episode recorded from t=198 on, done at t=199, hit Pendulum's 200-step limit."""
    source = steps([1, 1], dones=[False, True], ts=[198, 199])
    assert ends(source, 200) == [("1", 2, "truncated")]


def test_interleaved_rows_keep_their_rewards(tmp_path: Path) -> None:
    split = boundaries.split(steps([1, 2, 1, 2], dones=[False, False, True, True]), None)
    assert split.order.tolist() == [0, 2, 1, 3]
    assert split.ts.tolist() == [0, 1, 0, 1]


# A protocol-0 pickle that calls os.system("touch <file>") when loaded, written out by hand.
def evil_pickle(target: Path) -> bytes:
    return f"cos\nsystem\n(S'touch {target}'\ntR.".encode()


def test_unpickler_refuses_anything_but_numpy(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    with pytest.raises(
        DatasetError,
        match=re.escape("col: refused to load os.system: only numpy arrays may be unpickled"),
    ):
        load_ndarray(evil_pickle(target), "col")
    assert not target.exists()
    builtins = b"cbuiltins\neval\n(S'1'\ntR."
    with pytest.raises(DatasetError, match=re.escape("refused to load builtins.eval")):
        load_ndarray(builtins, "col")
    with pytest.raises(DatasetError, match=re.escape("col: expected a numeric numpy array, got")):
        load_ndarray(b"(dp0\n.", "col")  # a dict: allowed opcodes, not an array


def test_import_refuses_a_sample_batch_with_a_malicious_packed_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "pwned"
    packed = base64.b64encode(lz4.frame.compress(evil_pickle(target))).decode()
    line = {"type": "SampleBatch", "eps_id": [1], "obs": packed, "new_obs": [[0.0]],
            "actions": [0], "rewards": [1.0], "dones": [True]}  # fmt: skip
    src = tmp_path / "evil.json"
    src.write_text(json.dumps(line) + "\n")
    assert main(["import", "rllib-json", str(src), str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert f"{src}:1: 'obs': refused to load os.system: only numpy arrays" in err
    assert not target.exists()
    assert not (tmp_path / "ds").exists()


@needs_anchor
def test_packed_columns_decode_to_the_recorded_arrays(tmp_path: Path) -> None:
    """pendulum/small.json packs obs; its new_obs of one row is the next row's obs."""
    lines = (ANCHOR / "pendulum/small.json").read_text().splitlines()
    first, second = json.loads(lines[0]), json.loads(lines[1])
    unpack = lambda text: load_ndarray(lz4.frame.decompress(base64.b64decode(text)), "x")  # noqa: E731
    assert unpack(first["obs"]).shape == (1, 3)
    assert unpack(first["obs"]).dtype == np.float32
    np.testing.assert_array_equal(unpack(first["new_obs"]), unpack(second["obs"]))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"type": "MultiAgentBatch"}', "got type 'MultiAgentBatch'"),
        ("not json", ":1: not JSON"),
        ('{"type": "SampleBatch", "eps_id": [1], "obs": [[0.0]]}',
         "missing RLlib columns ['actions', 'rewards', 'new_obs']"),
        ('{"type": "SampleBatch", "eps_id": [1], "obs": "notbase64!"}',
         ":1: 'obs': a string that is not base64"),
    ],
)  # fmt: skip
def test_bad_sample_batch_files_name_the_problem(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "bad.json"
    src.write_text(line + "\n")
    assert main(["import", "rllib-json", str(src), str(tmp_path / "ds")]) == 2
    assert message in capsys.readouterr().err


def test_import_never_appends_to_an_existing_dataset(
    make_dataset: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_dataset(steps=10)
    src = tmp_path / "one.json"
    src.write_text(json.dumps({"type": "SampleBatch", "eps_id": [1], "obs": [[0.0] * 4],
                               "new_obs": [[0.0] * 4], "actions": [0], "rewards": [1.0],
                               "dones": [True]}) + "\n")  # fmt: skip
    assert main(["import", "rllib-json", str(src), str(path)]) == 2
    assert "already holds a dataset; import into a new directory" in capsys.readouterr().err


@needs_anchor
def test_normalized_actions_are_stored_as_the_torque_the_env_applied(tmp_path: Path) -> None:
    """RLlib logged Pendulum's actions in [-1, 1]; Pendulum's own dynamics on each row's
    observation -> next_observation give the torque applied, which the import must store."""
    src = str(ANCHOR / "pendulum/pendulum-v1_enormous")
    for flag, scale in (["--actions-normalized"], 1.0), ([], 0.5):
        out = tmp_path / f"ds{len(flag)}"
        argv = ["import", "rllib-parquet", src, str(out), "--env", "Pendulum-v1", *flag]
        if flag:
            assert main(argv) == 0
        else:  # without the flag: stored at half the torque, and the import says so
            with pytest.warns(RlpipeWarning, match=re.escape("all 16231 imported actions lie in")):
                assert main(argv) == 0
        batch = next(iter(InputReader(out, batch_size=100_000)))
        _, sin, speed = batch.observations.T
        next_speed = batch.next_observations[:, 2]
        free = np.abs(next_speed) < 7.99  # not clipped at Pendulum's max speed
        # thdot' = thdot + (3 g / (2 l) sin(th) + 3 / (m l^2) u) dt, with g=10, l=m=1, dt=0.05
        torque = ((next_speed - speed) / 0.05 - 15.0 * sin) / 3.0
        assert free.sum() > 1000
        np.testing.assert_allclose(batch.actions[free, 0], scale * torque[free], atol=2e-3)


def test_normalized_actions_need_a_bounded_box(tmp_path: Path) -> None:
    from pipeline.errors import ConfigError
    from pipeline.importers.transitions import write_dataset

    with pytest.raises(ConfigError, match="expected a Box action space with finite bounds"):
        write_dataset(steps(["a", "a"], dones=[False, True]), tmp_path / "ds",
                      env_id="CartPole-v1", actions_normalized=True)  # fmt: skip
    assert not (tmp_path / "ds").exists()


def sample_batch(*keys: int, **extra: list[Any]) -> str:
    """One SampleBatch JSON line of one-step episodes with 2-float observations."""
    n = len(keys)
    batch = {
        "type": "SampleBatch",
        "eps_id": list(keys),
        "obs": [[0.0, 1.0]] * n,
        "new_obs": [[1.0, 0.0]] * n,
        "actions": [0] * n,
        "rewards": [1.0] * n,
        "dones": [True] * n,
        **extra,
    }
    return json.dumps(batch) + "\n"


def test_rllib_json_takes_a_glob_pattern_as_rllibs_json_reader_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "out"
    (src / "nested").mkdir(parents=True)
    (src / "a.json").write_text(sample_batch(1, 2))
    (src / "b.json").write_text(sample_batch(3))
    (src / "nested" / "c.json").write_text(sample_batch(4))
    for name in ("notes.txt", ".partial.json"):  # not matched: reading them would fail
        (src / name).write_text("not a SampleBatch\n")
    assert main(["import", "rllib-json", f"{src}/*.json", str(tmp_path / "ds")]) == 0
    assert "imported 3 steps in 3 episodes" in capsys.readouterr().out
    assert sorted(episodes_table(tmp_path / "ds")) == ["1", "2", "3"]
    assert main(["import", "rllib-json", f"{src}/*/?.json", str(tmp_path / "ds2")]) == 0
    assert "imported 1 steps in 1 episodes" in capsys.readouterr().out
    # a pattern left unquoted reaches rlpipe as the shell expanded it: one word on what to do
    expanded = sorted(str(path) for path in src.glob("*.json"))
    assert main(["import", "rllib-json", *expanded, str(tmp_path / "ds3")]) == 2
    assert capsys.readouterr().err == (
        "rlpipe import: import.src: expected one file, directory or glob pattern (quote a "
        f"pattern, 'DIR/*.json', or the shell expands it), got '{' '.join(expanded)}'\n"
    )
    assert not (tmp_path / "ds3").exists()


def test_a_glob_pattern_that_matches_nothing_is_named(tmp_path: Path) -> None:
    from pipeline.importers.rllib import read_sample_batches

    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path}/*.json: no files match")):
        read_sample_batches(f"{tmp_path}/*.json")
    with pytest.raises(DatasetError, match=re.escape(f"no such directory {tmp_path}/absent")):
        read_sample_batches(f"{tmp_path}/absent/*.json")


@needs_anchor
def test_rllib_json_glob_over_rllibs_recordings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cartpole/l*.json`` is large.json alone; ``cartpole/*.json`` adds small.json, which RLlib
    recorded with other columns: refused, naming both files and the columns."""
    large = source_figures("rllib-json", ANCHOR / "cartpole/large.json")
    argv = ["import", "rllib-json", f"{ANCHOR}/cartpole/l*.json", str(tmp_path / "ds")]
    assert main([*argv, "--env", "CartPole-v1"]) == 0
    assert f"imported {large['steps']} steps in {len(large['lengths'])} episodes" in (
        capsys.readouterr().out
    )
    from pipeline.importers.rllib import read_sample_batches

    message = (
        f"{ANCHOR}/cartpole/small.json:1: its columns differ from those of "
        f"{ANCHOR}/cartpole/large.json:1: missing ['action_logp'], extra ['agent_index', 't'] "
        "(every SampleBatch of a source must hold the same columns)"
    )
    with pytest.raises(DatasetError, match=re.escape(message)):
        read_sample_batches(f"{ANCHOR}/cartpole/*.json")


def test_sample_batches_with_different_columns_name_the_file_and_the_column(
    tmp_path: Path,
) -> None:
    from pipeline.importers.rllib import read_sample_batches

    src = tmp_path.resolve() / "out"
    src.mkdir()
    (src / "a.json").write_text(sample_batch(1, action_logp=[-0.5]))
    (src / "b.json").write_text(sample_batch(2))
    message = (
        f"{src}/b.json:1: its columns differ from those of {src}/a.json:1: missing "
        "['action_logp'] (every SampleBatch of a source must hold the same columns)"
    )
    with pytest.raises(DatasetError, match=re.escape(message)):
        read_sample_batches(src)
    (src / "a.json").write_text(sample_batch(1, 2, action_logp=[-0.5]))
    message = f"{src}/a.json:1: columns differ in length: 'eps_id' has 2 rows, 'action_logp' has 1"
    with pytest.raises(DatasetError, match=re.escape(message)):
        read_sample_batches(src)


@pytest.mark.parametrize("file_format", ["json", "parquet"])
def test_ray_data_files_with_different_columns_name_the_file_and_the_column(
    tmp_path: Path, file_format: str
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.importers.rllib import read_ray_data

    src = tmp_path.resolve() / "out"
    src.mkdir()
    row = {"eps_id": 1, "obs": [0.0], "new_obs": [1.0], "actions": 0, "rewards": 1.0, "dones": True}
    for name, extra in (("a", {}), ("b", {"action_logp": -0.5, "t": 0})):
        path = src / f"{name}.{file_format}"
        if file_format == "json":
            path.write_text(json.dumps({**row, **extra, "eps_id": name}) + "\n")
        else:
            pq.write_table(pa.Table.from_pylist([{**row, **extra, "eps_id": name}]), path)
    message = (
        f"{src}/b.{file_format}: its columns differ from those of {src}/a.{file_format}: extra "
        "['action_logp', 't'] (every file of a source must hold the same columns)"
    )
    with pytest.raises(DatasetError, match=re.escape(message)):
        read_ray_data(src, file_format)


def pendulum_steps(actions: list[float]) -> SourceSteps:
    n = len(actions)
    return SourceSteps(
        episode_keys=np.zeros(n, dtype=np.int64),
        observations=np.zeros((n, 3), dtype=np.float32),
        actions=np.asarray(actions, dtype=np.float64).reshape(n, 1),
        rewards=np.zeros(n),
        next_observations=np.zeros((n, 3), dtype=np.float32),
    )


def test_actions_that_look_normalized_are_warned_about(tmp_path: Path) -> None:
    """Every action in [-1, 1], Pendulum's torque in [-2, 2]: the warning names the flag."""
    from pipeline.importers.transitions import write_dataset

    message = (
        "actions: all 3 imported actions lie in [-1, 1] while the action space is "
        "Box(-2.0, 2.0, (1,), float32); if the source logged them normalized (RLlib's "
        "actions_in_input_normalized), import with --actions-normalized "
        "(actions_normalized=True) to store them in the space's units"
    )
    with pytest.warns(RlpipeWarning, match=re.escape(message)) as caught:
        write_dataset(pendulum_steps([-1.0, 0.25, 1.0]), tmp_path / "a", env_id="Pendulum-v1")
    assert caught[0].filename == __file__  # it points at the caller's line
    # no warning (filterwarnings=error would fail these): the flag given, an action outside
    # [-1, 1], no bounds to tell (the spaces inferred from the data), a space within [-1, 1]
    one = pendulum_steps([0.5])
    write_dataset(one, tmp_path / "b", env_id="Pendulum-v1", actions_normalized=True)
    write_dataset(pendulum_steps([0.5, -1.5]), tmp_path / "c", env_id="Pendulum-v1")
    write_dataset(one, tmp_path / "d")
    anything = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    unit = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    write_dataset(one, tmp_path / "e", observation_space=anything, action_space=unit)


def test_episode_keys_past_int64_stay_exact(tmp_path: Path) -> None:
    """numpy makes [2**63, 1] a float64 array, and int64 and uint64 parts meet in float64:
    keys 2**63 + 1 and 2**63 + 2 would both round to 2**63 and merge into one episode."""
    from pipeline.importers.rllib import read_sample_batches

    big = 2**63
    (tmp_path / "a.json").write_text(sample_batch(big + 1, big + 2, 1) + sample_batch(7))
    keys = read_sample_batches(tmp_path / "a.json").episode_keys.tolist()
    assert keys == [big + 1, big + 2, 1, 7]
    assert main(["import", "rllib-json", str(tmp_path / "a.json"), str(tmp_path / "ds")]) == 0
    episodes = {str(batch.episode_ids[0]) for batch in InputReader(tmp_path / "ds", episodes=True)}
    assert episodes == {str(big + 1), str(big + 2), "1", "7"}


def test_an_env_whose_package_is_missing_is_named() -> None:
    """An env id gymnasium knows but cannot import is refused naming it, not as an ImportError."""
    gym.register("RlpipeMissingPackage-v0", entry_point="rlpipe_no_such_package:Env")
    try:
        with pytest.raises(
            DatasetError, match=re.escape("--env RlpipeMissingPackage-v0: gymnasium")
        ):
            env_spaces("RlpipeMissingPackage-v0")
    finally:
        del gym.registry["RlpipeMissingPackage-v0"]

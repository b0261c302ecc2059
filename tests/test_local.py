"""Local inference's column log (pipeline/client/local.py, pipeline/recording/recorder.py) against
a real server: the rows it uploads are the known ones, whatever the interleaving of episodes and
uploads."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from server_fixtures import cartpole_checkpoint, cartpole_config, running_server
from stored import read_steps

from pipeline.client import PolicyClient
from pipeline.errors import SchemaError


def _observation(episode: int, t: int) -> np.ndarray:
    return np.array([episode, t, 0.5, -0.5], np.float32)


def test_interleaved_episodes_and_small_uploads_give_the_known_rows(tmp_path: Path) -> None:
    """Two episodes open at once, uploads every 3 complete rows (pending rows are carried
    over to the next batch), logged and chosen actions, rewards summed, info kept."""
    data = tmp_path / "ds"
    cartpole_checkpoint(data / "checkpoints", 4, seed=1)
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, spool_dir=tmp_path / "spool", upload_rows=3,
                              upload_interval_s=0.01, seed=0)  # fmt: skip
        a, b = client.start_episode("a", seed=1), client.start_episode("b")
        chosen = []
        for t in range(7):
            chosen.append(client.get_action(a, _observation(0, t)))
            client.log_action(b, _observation(1, t), t % 2)
            client.log_returns(a, 1.0)
            client.log_returns(a, 0.5)
            client.log_returns(b, float(t), info={"t": t})
        client.end_episode(a, _observation(0, 7))
        client.end_episode(b, _observation(1, 7), truncated=True)
        assert client.flush(10)
        client.close()
    steps = read_steps(data).sort_values(["episode_id", "t"])
    mine_a, mine_b = steps[steps["episode_id"] == "a"], steps[steps["episode_id"] == "b"]
    assert mine_a["t"].tolist() == list(range(7)) and mine_b["t"].tolist() == list(range(7))
    assert mine_a["action"].tolist() == chosen and mine_b["action"].tolist() == [0, 1] * 3 + [0]
    assert mine_a["reward"].tolist() == [1.5] * 7
    assert mine_b["reward"].tolist() == [float(t) for t in range(7)]
    assert mine_b["info"].tolist() == [f'{{"t": {t}}}' for t in range(7)]
    for episode, rows in ((0, mine_a), (1, mine_b)):
        np.testing.assert_array_equal(np.stack(rows["observation"]),
                                      [_observation(episode, t) for t in range(7)])  # fmt: skip
        np.testing.assert_array_equal(np.stack(rows["next_observation"]),
                                      [_observation(episode, t) for t in range(1, 8)])  # fmt: skip
    assert mine_a["terminated"].tolist() == [False] * 6 + [True]
    assert mine_b["truncated"].tolist() == [False] * 6 + [True]
    assert mine_a["policy_version"].tolist() == [4] * 7 and mine_a["action_logp"].lt(0).all()
    assert mine_b["policy_version"].isna().all() and mine_b["action_logp"].isna().all()
    episodes = pd.read_parquet(data / "episodes").set_index("episode_id").sort_index()
    assert episodes["length"].tolist() == [7, 7]
    assert episodes["return"].tolist() == [10.5, 21.0]
    assert episodes["end_reason"].tolist() == ["terminated", "truncated"]


def test_a_long_episode_outgrows_the_buffer_and_nothing_is_lost(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with running_server(cartpole_config(data)) as server:
        client = PolicyClient(server.url, spool_dir=tmp_path / "spool", upload_rows=10**6,
                              upload_interval_s=60, seed=0)  # fmt: skip
        episode = client.start_episode()
        for t in range(2500):  # past the first capacity (1024) twice
            client.get_action(episode, _observation(0, t))
            client.log_returns(episode, 1)
        client.end_episode(episode, _observation(0, 2500), truncated=True)
        assert client.close(10)
    steps = read_steps(data).sort_values("t")
    assert steps["t"].tolist() == list(range(2500))
    assert [o[1] for o in steps["next_observation"]] == list(range(1, 2501))


@pytest.mark.parametrize(
    ("observation", "message"),
    [
        ([0.0, 0.0, 0.0], "field 'observation': expected float32 of shape (4,) per row, got "
         "shape (3,)"),
        (np.array([np.nan, 0, 0, 0], np.float32), "row 0, field 'observation': expected finite "
         "values, got nan"),
        (np.array([0, 0, -np.inf, 0], np.float32), "row 0, field 'observation': expected finite "
         "values, got -inf"),
        (["a", "b", "c", "d"], "row 0, field 'observation': expected float32 of shape (4,) per "
         "row, got ['a', 'b', 'c', 'd']"),
    ],
)  # fmt: skip
def test_the_fast_path_refuses_a_bad_observation_at_the_call(
    tmp_path: Path, observation: object, message: str
) -> None:
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        client = PolicyClient(server.url, spool_dir=tmp_path / "spool")
        episode = client.start_episode()
        with pytest.raises(SchemaError, match=re.escape(message)):
            client.get_action(episode, observation)
        assert client.get_action(episode, _observation(0, 0)) in (0, 1)
        client.close(5)

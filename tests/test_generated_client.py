"""A client generated from the OpenAPI document plays a real episode (issue 16, point 6: "tightly
enough that a client generated from it works").

openapi-python-client, the generator Python users reach for, builds a typed client (httpx and
attrs) from ``GET /v1/openapi.json``; a CartPole episode played through it is stored as the
step rules say. Until the single- and multi-agent forms of each body were schemas of their own,
the generator dropped every step operation ("Invalid property in union").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import requests
from server_fixtures import cartpole_config, container_spaces, running_server

from server.config import ServerConfig

# the Arrow and .npz bodies as bytes: the generator knows no such content types; no
# formatting of the generated code afterwards (its default runs ruff from PATH)
CONFIG = """content_type_overrides:
  application/vnd.apache.arrow.stream: application/octet-stream
  application/x-npz: application/octet-stream
post_hooks: []
"""
PLAY = """
import sys
import gymnasium as gym
from rlpipe_client import Client
from rlpipe_client.api.default import end_episode, get_action, start_episode
from rlpipe_client.models import EndStepSingleAgent, Start, Started, StepSingleAgent

client = Client(base_url=sys.argv[1])
env = gym.make("CartPole-v1")
observation, _ = env.reset(seed=3)
assert isinstance(start_episode.sync(client=client, body=Start(episode_id="gen", seed=3)), Started)
reward, number = 0.0, 1
while True:
    step = StepSingleAgent(observation=observation.tolist(), reward=reward, request=number)
    action = get_action.sync(client=client, episode_id="gen", body=step).action
    observation, reward, terminated, truncated, _ = env.step(action)
    number += 1
    if terminated or truncated:
        end = EndStepSingleAgent(observation=observation.tolist(), reward=reward,
                                 truncated=truncated, request=number)
        assert end_episode.sync(client=client, episode_id="gen", body=end).ended
        print(number - 1)
        break
"""


PLAY_CONTAINERS = """
import json
import sys
from rlpipe_client import Client
from rlpipe_client.api.default import end_episode, get_action, log_action, start_episode
from rlpipe_client.models import (
    EndStepSingleAgent, LoggedStepSingleAgent, Observation, Start, StepSingleAgent,
)

client = Client(base_url=sys.argv[1])
seen = Observation(pos=[0.1, 0.2, 0.3], mode=1, flags=[0, 1, 1, 0])
start_episode.sync(client=client, body=Start(episode_id="gen"))
step = StepSingleAgent(observation=seen, request=1)
action = get_action.sync(client=client, episode_id="gen", body=step).action
logged = LoggedStepSingleAgent(observation=seen, action=action, reward=1.0, request=2)
log_action.sync(client=client, episode_id="gen", body=logged)
end = EndStepSingleAgent(observation=seen, reward=2.0, request=3)
assert end_episode.sync(client=client, episode_id="gen", body=end).ended
print(json.dumps(action))
"""


def test_a_client_generated_from_the_document_plays_an_episode(tmp_path: Path) -> None:
    pytest.importorskip("openapi_python_client", reason="a test dependency: .[test]")
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        played = _generate_and_run(tmp_path, server.url, PLAY)
    actions = int(played.split()[-1])
    steps = pd.read_parquet(tmp_path / "ds" / "steps").sort_values("t")
    assert steps["t"].tolist() == list(range(actions))
    assert (steps["episode_id"] == "gen").all()
    ends = (steps["terminated"] | steps["truncated"]).tolist()
    assert ends == [False] * (actions - 1) + [True]


def test_a_client_generated_for_dict_and_tuple_spaces_logs_back_the_action_it_got(
    tmp_path: Path,
) -> None:
    """A Tuple is an array of fixed length. Closed with ``"items": false`` (a boolean schema),
    it stopped the generator reading the document at all; answered as an object, the action
    could not be logged back."""
    pytest.importorskip("openapi_python_client", reason="a test dependency: .[test]")
    observation_space, action_space = container_spaces()
    config = ServerConfig(tmp_path / "ds", observation_space, action_space, None)
    with running_server(config) as server:
        played = _generate_and_run(tmp_path, server.url, PLAY_CONTAINERS)
    action = json.loads(played.splitlines()[-1])
    assert action_space.contains(tuple(np.asarray(part) for part in action))
    stored = pq.read_table(tmp_path / "ds" / "steps", columns=["t", "action", "reward"])
    assert stored.sort_by("t").to_pylist() == [
        {"t": 0, "action": {"0": action[0], "1": action[1]}, "reward": 1.0},
        {"t": 1, "action": {"0": action[0], "1": action[1]}, "reward": 2.0},
    ]


def _generate_and_run(tmp_path: Path, url: str, script: str) -> str:
    """Generate the client from the server's document (no warnings: every operation made), run
    ``script`` with it against the server, and return what it printed."""
    (tmp_path / "config.yaml").write_text(CONFIG)
    document = requests.get(url + "/v1/openapi.json", timeout=5).text
    (tmp_path / "openapi.json").write_text(document)
    generate = [
        *(sys.executable, "-m", "openapi_python_client", "generate", "--meta", "none"),
        *("--path", "openapi.json", "--config", "config.yaml"),
        *("--output-path", "rlpipe_client"),
    ]
    generated = subprocess.run(generate, cwd=tmp_path, capture_output=True, text=True)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    said = generated.stdout + generated.stderr
    assert "Warning" not in said and "WARNING" not in said, said
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    played = subprocess.run(
        [sys.executable, "-c", script, url], env=env, capture_output=True, text=True, timeout=120
    )
    assert played.returncode == 0, played.stderr[-3000:]
    return played.stdout

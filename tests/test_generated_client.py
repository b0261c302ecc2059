"""A client generated from the OpenAPI document plays a real episode (issue 16, point 6: "tightly
enough that a client generated from it works").

openapi-python-client, the generator Python users reach for, builds a typed client (httpx and
attrs) from ``GET /v1/openapi.json``; a CartPole episode played through it is stored as the
step rules say. Until the single- and multi-agent forms of each body were schemas of their own,
the generator dropped every step operation ("Invalid property in union").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import requests
from server_fixtures import cartpole_config, running_server

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


def test_a_client_generated_from_the_document_plays_an_episode(tmp_path: Path) -> None:
    pytest.importorskip("openapi_python_client", reason="a test dependency: .[test]")
    (tmp_path / "config.yaml").write_text(CONFIG)
    with running_server(cartpole_config(tmp_path / "ds")) as server:
        document = requests.get(server.url + "/v1/openapi.json", timeout=5).text
        (tmp_path / "openapi.json").write_text(document)
        generate = [
            *(sys.executable, "-m", "openapi_python_client", "generate", "--meta", "none"),
            *("--path", "openapi.json", "--config", "config.yaml"),
            *("--output-path", "rlpipe_client"),
        ]
        generated = subprocess.run(generate, cwd=tmp_path, capture_output=True, text=True)
        assert generated.returncode == 0, generated.stdout + generated.stderr
        said = generated.stdout + generated.stderr
        assert "Warning" not in said and "WARNING" not in said, said  # every operation made
        env = dict(os.environ, PYTHONPATH=str(tmp_path))
        played = subprocess.run(
            [sys.executable, "-c", PLAY, server.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert played.returncode == 0, played.stderr[-3000:]
    actions = int(played.stdout.split()[-1])
    steps = pd.read_parquet(tmp_path / "ds" / "steps").sort_values("t")
    assert steps["t"].tolist() == list(range(actions))
    assert (steps["episode_id"] == "gen").all()
    ends = (steps["terminated"] | steps["truncated"]).tolist()
    assert ends == [False] * (actions - 1) + [True]

"""Same calls, same rows (docs/protocol.md, "What a step row holds"): hypothesis generates
sequences of client calls and plays each against one real server in remote mode, local mode and
(single-agent sequences) vectorized mode (pipeline.client.vector.step_many). Every mode's stored
step and episode rows, timestamps and client ids aside, must equal a small reference model of the
rules.

Actions: the server has no checkpoint, so both modes act at random; rows of actions the policy
chose are compared without their ``action`` value (checked to lie in the space), rows of logged
actions with it. ``step_many`` has no logged form, so vectorized mode asks for every action.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_fixtures import Running, cartpole_config, running_server
from stored import read_steps

from pipeline.client import PolicyClient
from pipeline.client.vector import step_many

SINGLE = "agent0"
CHOSEN = "chosen"  # the model's action of a step whose action the policy chose
_numbers = itertools.count()


@dataclass
class Script:
    """One episode's calls: ("act", {agent: logged action or None}), ("reward", {agent: r},
    info or None), ("done", agent) and a final ("end", [agents], truncated). Agent ids are as
    the client gives them (ints or strings); single-agent scripts use SINGLE."""

    multiagent: bool
    training_enabled: bool
    seed: int | None
    ops: list[tuple[Any, ...]]


def observation(op: int, agent: Any) -> list[float]:
    return [float(op), float(ord(agent[-1]) if isinstance(agent, str) else agent), 0.5, -0.5]


# --- the reference model of the rules -------------------------------------------------------


@dataclass
class Agent:
    t: int = 0
    pending: tuple[Any, Any] | None = None  # (observation, action or CHOSEN)
    reward: float = 0.0
    info: Any = None
    terminated: bool = False
    length: int = 0
    ret: float = 0.0


@dataclass
class Model:
    training_enabled: bool
    agents: dict[str, Agent] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def row(self, agent_id: str, next_obs: Any, terminated: bool, truncated: bool) -> None:
        state = self.agents[agent_id]
        assert state.pending is not None
        obs, action = state.pending
        self.rows.append(
            {
                "agent_id": agent_id,
                "t": state.t,
                "observation": obs,
                "action": action,
                "reward": state.reward,
                "next_observation": next_obs,
                "terminated": terminated,
                "truncated": truncated and not terminated,
                "training_enabled": self.training_enabled,
                "info": state.info,
            }
        )
        state.t, state.length, state.ret = state.t + 1, state.length + 1, state.ret + state.reward
        state.pending, state.reward, state.info = None, 0.0, None
        state.terminated = state.terminated or terminated

    def valid(self, op: tuple[Any, ...]) -> bool:
        """Done flags only for an agent with a pending step (a leave)."""
        if op[0] != "done":
            return True
        state = self.agents.get(str(op[1]))
        return state is not None and state.pending is not None and not state.terminated

    def apply(self, n: int, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "reward":  # rewards accrue to the pending step; without one, to nothing
            for agent, reward in op[1].items():
                state = self.agents.get(str(agent))
                if state is not None and state.pending is not None:
                    state.reward += reward
                    state.info = op[2] if op[2] is not None else state.info
        elif kind == "done":
            self.agents[str(op[1])].terminated = True
        elif kind == "act":
            for agent, action in op[1].items():
                state = self.agents.setdefault(str(agent), Agent())
                if state.pending is not None:
                    self.row(str(agent), observation(n, agent), state.terminated, False)
                if not state.terminated:
                    state.pending = (observation(n, agent), CHOSEN if action is None else action)
        else:
            _, observed, truncated = op
            seen = {str(agent) for agent in observed}
            for agent_id, state in self.agents.items():
                if state.pending is None:
                    continue
                if agent_id in seen:
                    self.row(
                        agent_id,
                        observation(n, agent_id_of(observed, agent_id)),
                        not truncated or state.terminated,
                        truncated,
                    )
                else:
                    self.row(agent_id, state.pending[0], state.terminated, True)

    def episodes(self, end: tuple[Any, ...]) -> list[dict[str, Any]]:
        _, observed, truncated = end
        reason = "truncated" if truncated else "terminated"
        seen = {str(agent) for agent in observed}
        agents = self.agents or {SINGLE: Agent()}
        return [
            {
                "agent_id": agent_id,
                "length": state.length,
                "return": state.ret,
                "end_reason": "terminated"
                if state.terminated
                else "truncated"
                if agent_id not in seen
                else reason,
                "training_enabled": self.training_enabled,
            }
            for agent_id, state in agents.items()
        ]


def agent_id_of(observed: list[Any], agent_id: str) -> Any:
    return next(agent for agent in observed if str(agent) == agent_id)


def normalized(script: Script) -> tuple[Script, Model]:
    """The script without invalid done flags, and the model after playing it."""
    model = Model(script.training_enabled)
    ops = []
    for op in script.ops:
        if model.valid(op):
            model.apply(len(ops), op)
            ops.append(op)
    return Script(script.multiagent, script.training_enabled, script.seed, ops), model


# --- scripts --------------------------------------------------------------------------------

rewards = st.sampled_from([0.0, 0.25, 1.0, -2.5, 4.0])
infos = st.sampled_from([None, None, {"k": 1}, {"k": [1, "x"]}])


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    multiagent = draw(st.booleans())
    ids: list[Any] = [SINGLE]
    if multiagent:
        ids = [0, 1, 2] if draw(st.booleans()) else ["a", "b", "c"]
    some = st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True)
    act = st.builds(
        lambda agents, logged, action: ("act", {a: action if logged else None for a in agents}),
        some,
        st.booleans(),
        st.integers(0, 1),
    )
    reward = st.builds(
        lambda agents, r, info: ("reward", {a: r for a in agents}, info), some, rewards, infos
    )
    kinds = [act, reward] + (
        [st.builds(lambda a: ("done", a), st.sampled_from(ids))] if multiagent else []
    )
    ops = draw(st.lists(st.one_of(kinds), max_size=7))
    ops.append(("end", draw(some), draw(st.booleans())))
    return Script(multiagent, draw(st.booleans()), draw(st.none() | st.integers(0, 9)), ops)


# --- playing a script -----------------------------------------------------------------------


def keyed(script: Script, values: dict[Any, Any]) -> Any:
    return values if script.multiagent else values[SINGLE]


def play(client: PolicyClient, script: Script, episode_id: str) -> None:
    """The script through the one-episode verbs (remote or local inference)."""
    client.start_episode(episode_id, script.training_enabled, seed=script.seed)
    for n, op in enumerate(script.ops):
        if op[0] == "reward":
            info = op[2] if op[2] is None or not script.multiagent else dict.fromkeys(op[1], op[2])
            client.log_returns(episode_id, keyed(script, op[1]), info)
        elif op[0] == "done":
            client.log_returns(episode_id, {}, multiagent_done_dict={op[1]: True})
        elif op[0] == "act":
            obs = keyed(script, {a: np.array(observation(n, a), np.float32) for a in op[1]})
            if None in op[1].values():
                answer = client.get_action(episode_id, obs)
                if script.multiagent:  # keyed by the ids as given, int or str
                    assert set(answer) <= set(op[1]), (answer, op)
            else:
                client.log_action(episode_id, obs, keyed(script, op[1]))
        else:
            obs = keyed(script, {a: np.array(observation(n, a), np.float32) for a in op[1]})
            client.end_episode(episode_id, obs, truncated=op[2])


def play_vector(client: PolicyClient, script: Script, episode_id: str) -> None:
    """A single-agent script through step_many: rewards ride on the next row, the first row
    starts the episode."""
    reward, start = 0.0, [{"training_enabled": script.training_enabled, "seed": script.seed}]
    info = None
    for n, op in enumerate(script.ops):
        if op[0] == "reward":
            reward, info = reward + op[1][SINGLE], op[2] if op[2] is not None else info
            continue
        end = op[0] == "end"
        step_many(
            client,
            [episode_id],
            np.array([observation(n, SINGLE)], np.float32),
            rewards=[reward],
            terminated=[end and not op[2]],
            truncated=[end and op[2]],
            starts=start,
            infos=[info],
        )
        reward, start, info = 0.0, None, None  # type: ignore[assignment]


# --- the test -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path]]:
    data = tmp_path_factory.mktemp("modes") / "ds"
    with running_server(cartpole_config(data)) as running:
        yield running, data


def stored(running: Running, data: Path, episode_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    running.service.writer.flush()
    where = [("episode_id", "==", episode_id)]
    steps = read_steps(data) if (data / "steps").exists() else None
    steps = None if steps is None else steps[steps["episode_id"] == episode_id]
    episodes = pd.read_parquet(data / "episodes", filters=where)
    if steps is None or not len(steps):
        steps = pd.DataFrame(columns=["agent_id", "t"])
    return steps.sort_values(["agent_id", "t"]), episodes.sort_values("agent_id")


def check(
    steps: pd.DataFrame,
    episodes: pd.DataFrame,
    model: Model,
    script: Script,
    chosen_only: bool,
    mode: str,
) -> None:
    expected = sorted(model.rows, key=lambda row: (row["agent_id"], row["t"]))
    got = []
    for row in steps.to_dict("records"):
        assert row["action"] in (0, 1) and pd.isna(row["action_logp"]), (mode, row)
        assert pd.isna(row["policy_version"]), (mode, row)
        row["info"] = None if pd.isna(row["info"]) else json.loads(row["info"])
        got.append({key: row[key] for key in expected[0]} if expected else row)
        for key in ("observation", "next_observation"):
            got[-1][key] = [float(x) for x in row[key]]
    for want, have in zip(expected, got, strict=False):
        if want["action"] == CHOSEN or chosen_only:
            want["action"] = have["action"] = CHOSEN
    assert got == expected, mode
    summaries = model.episodes(script.ops[-1])
    keys = list(summaries[0])
    have_summaries = [{key: row[key] for key in keys} for row in episodes.to_dict("records")]
    assert have_summaries == sorted(summaries, key=lambda row: row["agent_id"]), mode
    assert set(episodes["seed"].map(lambda s: None if pd.isna(s) else int(s))) == {script.seed}
    assert (episodes["started_at"] <= episodes["ended_at"]).all(), mode


@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,  # the same 50 sequences every run; no example database on disk
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(script=scripts())
def test_every_mode_stores_the_rows_of_the_rules(
    server: tuple[Running, Path], script: Script
) -> None:
    running, data = server
    script, model = normalized(script)
    number = next(_numbers)
    modes = ["remote", "local"] + ([] if script.multiagent else ["vector"])
    for mode in modes:
        client = PolicyClient(
            running.url,
            "local" if mode == "local" else "remote",
            upload_interval_s=0.01,
            seed=number,
        )
        episode_id = f"{mode}-{number}"
        if mode == "vector":
            play_vector(client, script, episode_id)
        else:
            play(client, script, episode_id)
        assert client.close(10), mode
        steps, episodes = stored(running, data, episode_id)
        check(
            steps,
            episodes,
            Model(**{**model.__dict__, "rows": list(map(dict, model.rows))}),
            script,
            mode == "vector",
            mode,
        )

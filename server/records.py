"""The journal's records (:mod:`server.journal`): open episodes and step passes as JSON, and back.

A *snapshot* holds every open episode whole: each agent's pending step (observation, action,
log-probability, policy version), its accrued reward, info, ``t``, return and length, and the
episode's retry memory (its last request number and the answer it got). A *pass* holds what a
step pass was given and picked: its requests' rows (the observations one batch, as the edge
checked them) and the actions, so that replaying it through the step core
(:func:`server.stepper.settle`) advances the episodes exactly as the pass did.

Values go through orjson. A pass's observations, when an array, are kept as its bytes; other
observations come back through the same check the edge uses
(:func:`pipeline.recording.batches.checked`): either way a replayed pending step is the one the
live server held, value for value.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import gymnasium as gym
import numpy as np
import orjson

from pipeline.recording import batches
from pipeline.recording.episode import AgentState, Episode, Pending, Returns
from pipeline.recording.recorder import Steps
from server.stepper import Request

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(doc: dict[str, Any]) -> bytes:
    """One record as one line."""
    return orjson.dumps(doc, option=_OPTIONS, default=_plain) + b"\n"


def _plain(value: Any) -> Any:
    """What orjson does not take natively (a numpy dtype it lacks, a tuple of arrays)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"type {type(value).__name__} is not JSON serializable")


# --- episodes --------------------------------------------------------------------------------


def episode_doc(episode: Episode) -> dict[str, Any]:
    """An open episode whole, as a snapshot holds it."""
    return {
        "id": episode.episode_id,
        "client": episode.client_id,
        "training": episode.training_enabled,
        "seed": episode.seed,
        "options": episode.reset_options,
        "env": episode.env_id,
        "multi": episode.multiagent,
        "requests": episode.requests,
        "last": episode.last_request,
        "started": episode.started_at,
        "agents": {agent_id: _agent_doc(state) for agent_id, state in episode.agents.items()},
    }


def start_doc(episode: Episode) -> dict[str, Any]:
    """What start_episode gave a new episode (no agents, no requests yet)."""
    return {k: v for k, v in episode_doc(episode).items() if k not in ("agents", "last")}


def _agent_doc(state: AgentState) -> dict[str, Any]:
    """An agent's state; its pending observation, when an array, as its bytes (``array``): a
    frame as JSON numbers made every snapshot of many open episodes megabytes long."""
    pending = state.pending
    array = None
    if pending is not None and _plain_array(pending.observation):
        array = _batch_doc(pending.observation[None], 1)
    return {
        "t": state.t,
        "pending": None
        if pending is None
        else [
            None if array is not None else pending.observation,
            pending.action,
            pending.action_logp,
            pending.policy_version,
        ],
        **({} if array is None else {"array": array}),
        "reward": state.reward,
        "info": state.info,
        "terminated": state.terminated,
        "return": state.episode_return,
        "length": state.length,
        "started": state.started_at,
    }


def episode_of(doc: dict[str, Any], space: gym.Space[Any]) -> Episode:
    """The episode a snapshot (or a start record) holds; ``space``: the observation space."""
    last = doc.get("last")
    episode = Episode(
        episode_id=doc["id"],
        client_id=doc["client"],
        training_enabled=doc["training"],
        seed=doc["seed"],
        reset_options=doc["options"],
        env_id=doc["env"],
        multiagent=doc["multi"],
        last_request=None if last is None else (last[0], last[1]),
        requests=doc["requests"],
        started_at=datetime.fromisoformat(doc["started"]),
    )
    for agent_id, state in doc.get("agents", {}).items():
        episode.agents[agent_id] = _agent_of(state, space)
    return episode


def _agent_of(doc: dict[str, Any], space: gym.Space[Any]) -> AgentState:
    pending, array = doc["pending"], doc.get("array")
    if pending is not None:
        rows = _batch_of(array, space) if array is not None else _batch(space, [pending[0]])
        pending = Pending(batches.row_of(rows, 0), *pending[1:])
    return AgentState(
        t=doc["t"],
        pending=pending,
        reward=doc["reward"],
        info=doc["info"],
        terminated=doc["terminated"],
        episode_return=doc["return"],
        length=doc["length"],
        started_at=datetime.fromisoformat(doc["started"]),
    )


# --- passes ----------------------------------------------------------------------------------


def request_doc(request: Request) -> dict[str, Any]:
    """One request of a pass: its rows as the edge made them."""
    steps = request.steps
    return {
        "ids": request.episode_ids,
        "rows": request.rows,
        "numbers": request.numbers,
        "forms": request.forms,
        "field": request.field,
        "ids_field": request.ids_field,
        "agents": steps.agent_ids,
        "observations": _batch_doc(steps.observations, len(steps)),
        "rewards": steps.rewards,
        "infos": steps.infos,
        "ends": steps.ends,
        "dones": steps.dones,
        "actions": steps.actions,
        "returns": {
            episode_id: [r.rewards, r.infos, r.dones] for episode_id, r in steps.returns.items()
        },
        "starts": [start_doc(episode) for episode in steps.touched if not episode.recorded],
    }


def request_of(doc: dict[str, Any], space: gym.Space[Any]) -> Request:
    """A pass's request as :func:`request_doc` wrote it, its episodes not yet bound."""
    steps = Steps(
        episodes=[],
        agent_ids=doc["agents"],
        observations=_batch_of(doc["observations"], space),
        rewards=doc["rewards"],
        infos=doc["infos"],
        ends=doc["ends"],
        dones=doc["dones"],
        actions=doc["actions"],
        returns={k: Returns(*parts) for k, parts in doc["returns"].items()},
    )
    return Request(
        doc["ids"],
        doc["rows"],
        steps,
        doc["numbers"],
        doc["forms"],
        doc["field"],
        doc["ids_field"],
    )


def _plain_array(value: Any) -> bool:
    return type(value) is np.ndarray and value.dtype.kind in "fiub"


def _batch_doc(batch: Any, n: int) -> Any:
    """A checked batch: an array's bytes (base64: bit for bit, and ~20x cheaper than its
    numbers as JSON), a Dict or Tuple batch as its rows' JSON values."""
    if _plain_array(batch):
        data = base64.b64encode(np.ascontiguousarray(batch).tobytes()).decode()
        return {"dtype": batch.dtype.str, "shape": batch.shape, "data": data}
    return [batches.value_of(batch, i) for i in range(n)]


def _batch_of(doc: Any, space: gym.Space[Any]) -> Any:
    if isinstance(doc, dict):
        data = base64.b64decode(doc["data"])
        return np.frombuffer(data, np.dtype(doc["dtype"])).reshape(doc["shape"]).copy()
    return _batch(space, doc)


def _batch(space: gym.Space[Any], rows: list[Any]) -> Any:
    """Observations (JSON values) as the edge's checked batch."""
    return batches.checked(space, rows, "observations")

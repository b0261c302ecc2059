"""The step requests' three forms (one episode's body, the batch form's entries, its columns),
each turned into the rows of one :class:`~server.stepper.Request`, once.

A multi-agent body keys its fields by agent id (:mod:`server.schemas`): each observed agent is a
row, and the rewards, infos and done flags of agents it does not observe ride along as
:class:`~pipeline.recording.episode.Returns`. All observations of a request are checked in one
pass (:func:`server.messages.batch`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from pipeline.format import layout
from pipeline.recording import batches
from pipeline.recording.episode import Returns, episode_id_of
from pipeline.recording.recorder import TERMINATED, TRUNCATED, Steps
from server import messages
from server.errors import bad_request
from server.stepper import Request

ACT, LOG, END = "actions", "logged-actions", "end"
_AGENT = layout.DEFAULT_AGENT_ID


class _Rows:
    """Rows gathered entry by entry, checked together at the end."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.rows: list[int] = []
        self.agent_ids: list[str] = []
        self.observations: list[Any] = []
        self.names: list[str] = []
        self.rewards: list[float] = []
        self.infos: list[Any] = []
        self.ends: dict[str, str] = {}
        self.dones: list[bool] = []
        self.actions: list[Any] = []
        self.action_names: list[str] = []
        self.returns: dict[str, Returns] = {}
        self.numbers: list[int | None] = []
        self.forms: list[bool] = []

    def add(
        self, doc: dict[str, Any], episode_id: str, end: str | None, logged: bool, prefix: str = ""
    ) -> None:
        """One episode's body (single- or multi-agent) as its rows."""
        k = len(self.ids)
        self.ids.append(episode_id)
        self.numbers.append(messages.int64(doc.get("request"), prefix + "request"))
        if end is not None:
            self.ends[episode_id] = end
        self.forms.append("observations" in doc)
        if "observations" in doc:
            self._multi(doc, k, logged, prefix)
        elif "observation" in doc:
            self._row(k, _AGENT, doc["observation"], prefix + "observation")
            self.rewards.append(messages.reward(doc.get("reward", 0.0), prefix + "reward"))
            self.infos.append(_info(doc.get("info"), prefix + "info"))
            self.dones.append(False)
            if logged:
                self.actions.append(messages.required(doc, "action", prefix))
                self.action_names.append(prefix + "action")
        else:
            raise bad_request(
                prefix + "observation",
                "an observation (or 'observations' keyed by agent id)",
                "nothing",
            )

    def _row(self, k: int, agent_id: str, observation: Any, name: str) -> None:
        self.rows.append(k)
        self.agent_ids.append(agent_id)
        self.observations.append(observation)
        self.names.append(name)

    def _multi(self, doc: dict[str, Any], k: int, logged: bool, prefix: str) -> None:
        observations = messages.keyed(doc["observations"], prefix + "observations")
        rewards, infos, dones = _keyed_returns(doc, prefix)
        actions = (
            messages.keyed(messages.required(doc, "actions", prefix), prefix + "actions")
            if logged
            else {}
        )
        missing = sorted(set(observations) - set(actions)) if logged else []
        if missing:
            raise bad_request(
                prefix + "actions", "an action for every observed agent", f"none for {missing}"
            )
        for agent_id, observation in observations.items():
            self._row(k, agent_id, observation, f"{prefix}observations.{agent_id}")
            self.rewards.append(
                messages.reward(rewards.pop(agent_id, 0.0), f"{prefix}rewards.{agent_id}")
            )
            self.infos.append(_info(infos.pop(agent_id, None), f"{prefix}infos.{agent_id}"))
            self.dones.append(dones.pop(agent_id, False))
            if logged:
                self.actions.append(actions[agent_id])
                self.action_names.append(f"{prefix}actions.{agent_id}")
        if rewards or infos or dones:
            self.returns[self.ids[k]] = returns_of(
                {"rewards": rewards, "infos": infos, "dones": dones}, prefix
            )

    def request(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        field: str = "request",
    ) -> Request:
        """The rows, their observations (and logged actions) checked in one pass each."""
        observations = messages.batch(observation_space, self.observations, self.names)
        actions = None
        if self.actions:
            checked = messages.batch(action_space, self.actions, self.action_names)
            actions = [batches.value_of(checked, i) for i in range(len(self.actions))]
        steps = Steps(
            episodes=[],
            agent_ids=self.agent_ids,
            observations=observations,
            rewards=self.rewards,
            infos=self.infos if any(i is not None for i in self.infos) else None,
            ends=self.ends,
            dones=self.dones if any(self.dones) else None,
            actions=actions,
            returns=self.returns,
        )
        return Request(self.ids, self.rows, steps, self.numbers, self.forms, field)


def one_episode(
    doc: dict[str, Any],
    episode_id: str,
    verb: str,
    observation_space: gym.Space[Any],
    action_space: gym.Space[Any],
) -> Request:
    """get_action, log_action or end_episode for one episode."""
    rows = _Rows()
    end = None
    if verb == END:
        end = TRUNCATED if messages.flag(doc.get("truncated", False), "truncated") else TERMINATED
    rows.add(doc, episode_id, end, verb == LOG)
    return rows.request(observation_space, action_space)


def entries(
    doc: dict[str, Any], observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> tuple[Request, list[dict[str, Any] | None]]:
    """The batch form's ``episodes`` entries, and each one's start (None: it goes on)."""
    items = doc.get("episodes")
    if not isinstance(items, list) or not items:
        raise bad_request("episodes", "a non-empty list of episode steps", type(items).__name__)
    rows, starts = _Rows(), []
    for i, entry in enumerate(items):
        prefix = f"episodes[{i}]."
        if not isinstance(entry, dict):
            raise bad_request(f"episodes[{i}]", "an object", type(entry).__name__)
        episode_id = episode_id_of(entry.get("episode_id"), prefix + "episode_id")
        terminated = messages.flag(entry.get("terminated", False), prefix + "terminated")
        truncated = messages.flag(entry.get("truncated", False), prefix + "truncated")
        end = TERMINATED if terminated else TRUNCATED if truncated else None
        rows.add(entry, episode_id, end, logged=False, prefix=prefix)
        starts.append(_start(entry.get("start"), prefix + "start"))
    return rows.request(observation_space, action_space), starts


def columns(
    doc: dict[str, Any], observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> tuple[Request, list[dict[str, Any] | None]]:
    """The columnar batch form: lists of one entry per episode (single-agent rows)."""
    ids = doc["episode_ids"]
    if not isinstance(ids, list) or not ids:
        raise bad_request("episode_ids", "a non-empty list of episode ids", type(ids).__name__)
    n = len(ids)
    episode_ids = messages.column(doc, "episode_ids", n, episode_id_of, messages.plain_ids)
    values = messages.column(doc, "observations", n, required=True)
    observations = messages.batch(observation_space, values, "observations")
    terminated = messages.column(doc, "terminated", n, messages.flag, messages.bools, False)
    truncated = messages.column(doc, "truncated", n, messages.flag, messages.bools, False)
    starts = messages.column(doc, "starts", n, _start, messages.nulls)
    infos = None
    if doc.get("infos") is not None:
        infos = messages.column(doc, "infos", n, _info, messages.no_text)
    ends = {
        episode_id: TERMINATED if te else TRUNCATED
        for episode_id, te, tr in zip(episode_ids, terminated, truncated, strict=True)
        if te or tr
    }
    steps = Steps(
        episodes=[],
        agent_ids=[_AGENT] * n,
        observations=observations,
        rewards=messages.column(doc, "rewards", n, messages.reward, messages.floats, 0.0),
        infos=infos,
        ends=ends,
    )
    numbers = messages.column(doc, "requests", n, messages.int64, messages.int64s)
    request = Request(
        episode_ids, list(range(n)), steps, numbers, [False] * n, "requests", "episode_ids"
    )
    return request, starts


def returns_of(doc: dict[str, Any], prefix: str = "") -> Returns:
    """A log_returns body: ``reward`` and ``info``, or ``rewards``, ``infos`` and ``dones``."""
    if "rewards" not in doc:
        return Returns(
            rewards={_AGENT: messages.reward(doc.get("reward", 0.0), prefix + "reward")},
            infos={} if doc.get("info") is None else {_AGENT: _info(doc["info"], "info")},
        )
    rewards, infos, dones = _keyed_returns(doc, prefix)
    return Returns(
        rewards={k: messages.reward(v, f"{prefix}rewards.{k}") for k, v in rewards.items()},
        infos={k: _info(v, f"{prefix}infos.{k}") for k, v in infos.items()},
        dones=dones,
    )


def _keyed_returns(doc: dict[str, Any], prefix: str) -> tuple[dict[str, Any], ...]:
    """A multi-agent body's ``rewards``, ``infos`` and ``dones`` (its flags checked, and
    RLlib's ``__all__`` dropped), each keyed by agent id."""
    rewards = messages.keyed(doc.get("rewards") or {}, prefix + "rewards")
    infos = messages.keyed(doc.get("infos") or {}, prefix + "infos")
    dones = messages.keyed(doc.get("dones") or {}, prefix + "dones")
    for agent_id, flag in dones.items():
        if not isinstance(flag, bool):
            raise bad_request(f"{prefix}dones.{agent_id}", "true or false", repr(flag))
    return rewards, infos, {k: v for k, v in dones.items() if k != "__all__"}


def _start(value: Any, name: str) -> dict[str, Any] | None:
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise bad_request(name, "an object or null", type(value).__name__)
    return value


def _info(value: Any, name: str) -> Any:
    return None if value is None else messages.json_value(value, name)

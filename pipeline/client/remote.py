"""Remote inference: the server picks every action, and a step costs one round trip.

:class:`RemoteInference` has :class:`~pipeline.client.local.LocalInference`'s methods. Rewards,
infos and done flags logged with :meth:`RemoteInference.add_returns` ride on the episode's next
request; each request carries its number in the episode, so a retry is recognised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import gymnasium as gym
import numpy as np

from pipeline.client import binary
from pipeline.client.servers import Servers, route_headers
from pipeline.client.transport import Http, jsonable
from pipeline.errors import EpisodeError, ServerError
from pipeline.format import layout
from pipeline.recording.episode import Returns, reward_sum

_AGENT = layout.DEFAULT_AGENT_ID
_log = logging.getLogger("rlpipe.client")
_E = TypeVar("_E")


class RemoteEpisode:
    """What rides on the next request: rewards, infos and done flags logged since the last;
    and the server that holds the episode, with the route key its requests carry."""

    def __init__(self, http: Http, headers: dict[str, str]) -> None:
        self.http, self.headers = http, headers
        self.rewards: dict[str, float] = {}
        self.infos: dict[str, Any] = {}
        self.dones: dict[str, bool] = {}
        self.request = 0
        self.sent_rewards: dict[str, float] = {}  # per agent, a bound on the server's return

    def add(self, returns: Returns) -> None:
        """Keep what rides on the next request; a reward that would make a sum non-finite is
        refused here (the server would refuse the next request instead)."""
        sums = {
            agent_id: reward_sum(
                self.rewards.get(agent_id, 0.0),
                float(reward),
                self.sent_rewards.get(agent_id, 0.0),
                agent_id,
            )
            for agent_id, reward in returns.rewards.items()
        }
        self.rewards.update(sums)
        self.infos.update(returns.infos)
        self.dones.update(returns.dones)

    def body(self, multiagent: bool, observation: Any) -> dict[str, Any]:
        key = "observations" if multiagent else "observation"
        return {"request": self.request + 1, key: observation, **self.returns(multiagent)}

    def returns(self, multiagent: bool) -> dict[str, Any]:
        """What is held for the next request, in a single-agent or multi-agent body's form."""
        if multiagent:
            return {"rewards": self.rewards, "infos": jsonable(self.infos), "dones": self.dones}
        return {"reward": self.rewards.get(_AGENT, 0.0), "info": jsonable(self.infos.get(_AGENT))}

    def sent(self) -> None:
        self.request += 1
        for agent_id, reward in self.rewards.items():
            self.sent_rewards[agent_id] = self.sent_rewards.get(agent_id, 0.0) + reward
        if self.rewards or self.infos or self.dones:
            self.rewards, self.infos, self.dones = {}, {}, {}


Spaces = tuple[gym.Space[Any], gym.Space[Any]]


class RemoteInference:
    """The episodes a remote-inference client has open, and the requests that step them;
    ``spaces`` gives the server's observation and action spaces (read when first needed)."""

    def __init__(self, servers: Servers, client_id: str, spaces: Callable[[], Spaces]) -> None:
        self.servers, self.client_id = servers, client_id
        self.episodes: dict[str, RemoteEpisode] = {}
        self.spaces = spaces

    def start(
        self,
        episode_id: str,
        training_enabled: bool,
        seed: int | None,
        options: Mapping[str, Any] | None,
    ) -> None:
        body = {
            "episode_id": episode_id,
            "training_enabled": training_enabled,
            "seed": seed,
            "options": jsonable(options),
            "client_id": self.client_id,
        }
        episode = self.routed(episode_id)  # an episode started on its own: by its id
        episode.http.call("POST", "/v1/episodes", json=body, headers=episode.headers)
        self.episodes[episode_id] = episode

    def routed(self, key: str) -> RemoteEpisode:
        """A new episode on the server of route key ``key``, its requests carrying the key."""
        return RemoteEpisode(self.servers.pick(key), route_headers(key))

    def episode(self, episode_id: str) -> RemoteEpisode:
        return opened(self.episodes, episode_id)

    def step(self, episode_id: str, observation: Any, action: Any, multiagent: bool) -> Any:
        """get_action (``action`` None: the server picks, and the action is returned) or
        log_action (the simulator's ``action`` is recorded)."""
        if action is not None:
            logged = {"actions" if multiagent else "action": jsonable(action)}
            self._request(episode_id, "logged-actions", observation, multiagent, logged)
            return None
        answer = self._request(episode_id, "actions", observation, multiagent, {})
        if "actions" in answer:
            return {k: self.decode(v) for k, v in answer["actions"].items()}
        return self.decode(answer["action"])

    def add_reward(self, episode_id: str, reward: float) -> None:
        self.episode(episode_id).add(Returns({_AGENT: reward}))

    def add_returns(self, episode_id: str, returns: Returns) -> None:
        self.episode(episode_id).add(returns)

    def end(self, episode_id: str, observation: Any, truncated: bool, multiagent: bool) -> None:
        self._request(episode_id, "end", observation, multiagent, {"truncated": truncated})
        del self.episodes[episode_id]

    def close_all(self) -> bool:
        """Send the rewards still held for a next request on their own; True when all went."""
        for episode_id, state in self.episodes.items():
            if not (state.rewards or state.infos or state.dones):
                continue
            multiagent = bool(state.dones) or not set(state.rewards) | set(state.infos) <= {_AGENT}
            try:
                path = f"/v1/episodes/{quote(episode_id, safe='')}/returns"
                state.http.call("POST", path, json=state.returns(multiagent), headers=state.headers)
            except ServerError as error:
                _log.warning("rewards of episode '%s' were not delivered: %s", episode_id, error)
                return False
            state.rewards, state.infos, state.dones = {}, {}, {}
        return True

    def decode(self, value: Any) -> Any:
        """The server's action as the env takes it (the space is read for a list or an object
        only: a Discrete's int is as it came)."""
        return decoded(self.spaces()[1], value) if isinstance(value, list | dict) else value

    def _request(
        self, episode_id: str, verb: str, observation: Any, multiagent: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        state = self.episode(episode_id)
        # any id, as RLlib's: quoted whole, '/' too, and the server reads it back
        path = f"/v1/episodes/{quote(episode_id, safe='')}/{verb}"
        data = None
        if not multiagent and binary.large(observation):  # a frame: its bytes, not numbers
            data = binary.step_body(*self.spaces(), {**state.body(False, observation), **extra})
        if data is not None:
            headers = {**state.headers, "Content-Type": binary.ARROW_TYPE}
            response = state.http.call("POST", path, data=data, headers=headers)
        else:
            body = {**state.body(multiagent, jsonable(observation)), **extra}
            response = state.http.call("POST", path, json=body, headers=state.headers)
        state.sent()
        answer: dict[str, Any] = response.json()
        return answer


def opened(episodes: dict[str, _E], episode_id: str) -> _E:
    """An episode this client started (remote or local); else an EpisodeError (404)."""
    try:
        return episodes[episode_id]
    except KeyError:
        raise EpisodeError(
            404,
            f"episode '{episode_id}' was not started by this client; call start_episode() first",
        ) from None


def decoded(action_space: gym.Space[Any], value: Any) -> Any:
    """An action as JSON gave it, in the form the space's own samples have, as local inference
    gives it: an array of the space's dtype for a Box, MultiDiscrete or MultiBinary, a tuple for
    a Tuple, a dict for a Dict, each part decoded alike (a Discrete's int as it came)."""
    if isinstance(action_space, gym.spaces.Box | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        return np.asarray(value, dtype=action_space.dtype)
    if isinstance(action_space, gym.spaces.Tuple):
        return tuple(decoded(part, item) for part, item in zip(action_space, value, strict=True))
    if isinstance(action_space, gym.spaces.Dict):
        return {name: decoded(part, value[name]) for name, part in action_space.items()}
    return value


def decoded_all(action_space: gym.Space[Any], values: list[Any]) -> list[Any]:
    """:func:`decoded` of each of a batch's actions (None, for an ended episode, stays None)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return values  # ints, as JSON gave them
    return [None if value is None else decoded(action_space, value) for value in values]

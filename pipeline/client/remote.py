"""Remote inference: the server picks every action, and a step costs one round trip.

:class:`~pipeline.client.PolicyClient` in ``"remote"`` mode hands its verbs here, as it hands
them to :class:`~pipeline.client.local.LocalInference` in local mode: the same methods, so the
same calls reach the step core (on the server, here) in either mode. Rewards, infos and done
flags logged with :meth:`RemoteInference.add_returns` ride on the episode's next request instead
of making their own; each request carries its number in the episode, so a retry is recognised.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import gymnasium as gym
import numpy as np

from pipeline.client.transport import Http, jsonable
from pipeline.errors import EpisodeError, SchemaError, ServerError
from pipeline.format import layout
from pipeline.recording.episode import Returns, reward_field

_AGENT = layout.DEFAULT_AGENT_ID
_log = logging.getLogger("rlpipe.client")


class RemoteEpisode:
    """What rides on the next request: rewards, infos and done flags logged since the last."""

    def __init__(self) -> None:
        self.rewards: dict[str, float] = {}
        self.infos: dict[str, Any] = {}
        self.dones: dict[str, bool] = {}
        self.request = 0
        self.sent_rewards: dict[str, float] = {}  # per agent, a bound on the server's return

    def add(self, returns: Returns) -> None:
        """Keep what rides on the next request; a reward that would make a sum non-finite is
        refused here (the server would refuse the next request instead)."""
        sums = {}
        for agent_id, reward in returns.rewards.items():
            total = self.rewards.get(agent_id, 0.0) + float(reward)
            sent = self.sent_rewards.get(agent_id, 0.0)
            if not (math.isfinite(total) and math.isfinite(sent + total)):
                raise SchemaError.single(
                    reward_field(agent_id),
                    "a reward that keeps the step's reward sum and the return finite",
                    repr(reward),
                )
            sums[agent_id] = total
        self.rewards.update(sums)
        self.infos.update(returns.infos)
        self.dones.update(returns.dones)

    def body(self, multiagent: bool, observation: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"request": self.request + 1}
        if multiagent:
            body.update(
                observations=observation,
                rewards=self.rewards,
                infos=jsonable(self.infos),
                dones=self.dones,
            )
        else:
            body.update(
                observation=observation,
                reward=self.rewards.get(_AGENT, 0.0),
                info=jsonable(self.infos.get(_AGENT)),
            )
        return body

    def held(self) -> dict[str, Any] | None:
        """What is held for the next request as a ``returns`` body (None: nothing held)."""
        if not (self.rewards or self.infos or self.dones):
            return None
        if not self.dones and set(self.rewards) | set(self.infos) <= {_AGENT}:
            return {
                "reward": self.rewards.get(_AGENT, 0.0),
                "info": jsonable(self.infos.get(_AGENT)),
            }
        return {"rewards": self.rewards, "infos": jsonable(self.infos), "dones": self.dones}

    def sent(self) -> None:
        self.request += 1
        for agent_id, reward in self.rewards.items():
            self.sent_rewards[agent_id] = self.sent_rewards.get(agent_id, 0.0) + reward
        if self.rewards or self.infos or self.dones:
            self.rewards, self.infos, self.dones = {}, {}, {}


class RemoteInference:
    """The episodes a remote-inference client has open, and the requests that step them.

    Args:
        http: the client's connection to the server.
        client_id: recorded with each episode.
        action_space: gives the server's action space (read once, when first needed).
    """

    def __init__(
        self, http: Http, client_id: str, action_space: Callable[[], gym.Space[Any]]
    ) -> None:
        self.http, self.client_id = http, client_id
        self.episodes: dict[str, RemoteEpisode] = {}
        self._action_space = action_space

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
        self.http.call("POST", "/v1/episodes", json=body)
        self.episodes[episode_id] = RemoteEpisode()

    def episode(self, episode_id: str) -> RemoteEpisode:
        try:
            return self.episodes[episode_id]
        except KeyError:
            raise EpisodeError(
                404,
                f"episode '{episode_id}' was not started by this client; "
                "call start_episode() first",
            ) from None

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
            body = state.held()
            if body is None:
                continue
            try:
                path = f"/v1/episodes/{quote(episode_id, safe='')}/returns"
                self.http.call("POST", path, json=body)
            except ServerError as error:
                _log.warning("rewards of episode '%s' were not delivered: %s", episode_id, error)
                return False
            state.rewards, state.infos, state.dones = {}, {}, {}
        return True

    def decode(self, value: Any) -> Any:
        return decoded(self._action_space(), value) if isinstance(value, list) else value

    def _request(
        self, episode_id: str, verb: str, observation: Any, multiagent: bool, extra: dict[str, Any]
    ) -> dict[str, Any]:
        state = self.episode(episode_id)
        body = {**state.body(multiagent, jsonable(observation)), **extra}
        # any id, as RLlib's: quoted whole, '/' too, and the server reads it back
        path = f"/v1/episodes/{quote(episode_id, safe='')}/{verb}"
        response = self.http.call("POST", path, json=body)
        state.sent()
        answer: dict[str, Any] = response.json()
        return answer


def decoded(action_space: gym.Space[Any], value: Any) -> Any:
    """An action as JSON gave it, as the env takes it (a Box's as an array of its dtype)."""
    if isinstance(value, list) and isinstance(action_space, gym.spaces.Box):
        return np.asarray(value, dtype=action_space.dtype)
    return value

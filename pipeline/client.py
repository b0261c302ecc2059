"""PolicyClient: RLlib's client verbs over rlpipe's safe HTTP protocol (``docs/protocol.md``).

Code written against ``ray.rllib.env.policy_client.PolicyClient`` runs with only the import
changed. Two modes, as in RLlib:

- ``"remote"``: the server picks every action. A step costs one round trip: rewards logged with
  :meth:`log_returns` ride on the next request instead of making their own.
- ``"local"``: the client runs the policy itself (numpy, with weights it pulls every
  ``update_interval`` seconds) and uploads steps in numbered batches from a background thread,
  spooling them to disk while the server cannot take them, so a server that blinks costs
  neither waiting nor data (:mod:`pipeline.spool` says exactly what survives what).

Importing this module imports neither torch nor Flask.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import requests

from pipeline import codec, layout, schema
from pipeline.errors import (
    ConfigError,
    EpisodeError,
    RequestRejected,
    SchemaError,
    ServerError,
    ServerUnavailable,
    Unauthorized,
)
from pipeline.policy import NumpyPolicy, load_checkpoint
from pipeline.recorder import Episode, Pending
from pipeline.spool import Spool, Uploader
from pipeline.transport import (
    ARROW_TYPE,
    Http,
    RemoteEpisode,
    base_url,
    jsonable,
    parse_spaces,
    row_of,
)

INFERENCE_MODES = ("local", "remote")


class PolicyClient:
    """Connects a simulator to an rlpipe server; RLlib's verbs and meanings.

    Args:
        address: ``"host:port"`` or a URL such as ``"http://host:9900"``.
        inference_mode: ``"local"`` (act here, upload batches) or ``"remote"`` (server acts).
        update_interval: seconds between weight pulls in local mode; None pulls only on
            :meth:`update_policy_weights`.
        session: a ``requests.Session`` to reuse (connection pools, proxies, certificates).
        timeout: seconds for each request; remote calls retry within it.
        token: the server's bearer token, if it has one.
        spool_dir: where local mode keeps batches until the server has them (default: a new
            temporary directory); batches a crashed client left there are delivered too.
        upload_rows: buffered steps that trigger an upload in local mode.
        upload_interval_s: the longest a step waits in memory in local mode.
        seed: seeds local action sampling.
    """

    def __init__(
        self,
        address: str,
        inference_mode: str = "local",
        update_interval: float | None = 10.0,
        session: requests.Session | None = None,
        timeout: float = 10.0,
        token: str | None = None,
        spool_dir: str | Path | None = None,
        *,
        upload_rows: int = 4096,
        upload_interval_s: float = 0.5,
        seed: int | None = None,
    ) -> None:
        if inference_mode not in INFERENCE_MODES:
            raise ConfigError("PolicyClient", "inference_mode", f"one of {INFERENCE_MODES}",
                              inference_mode)  # fmt: skip
        self.inference_mode = inference_mode
        self.update_interval = update_interval
        self.client_id = secrets.token_hex(8)
        self._http = Http(address, session, timeout, token)
        self._spaces: tuple[gym.Space[Any], gym.Space[Any], str | None] | None = None
        self._remote: dict[str, RemoteEpisode] = {}
        self._local: dict[str, Episode] = {}
        self._rng = np.random.default_rng(seed)
        self._policy: NumpyPolicy | None = None
        self._random: list[Any] = []
        self._pulled = 0.0
        self._uploader: Uploader | None = None
        if inference_mode == "local":
            spool = Spool(spool_dir or tempfile.mkdtemp(prefix="rlpipe-spool-"))
            self._weights_dir = Path(tempfile.mkdtemp(prefix="rlpipe-weights-"))
            self._load_spaces(spool.directory / "spaces.json")
            self._try_pull()
            self._uploader = Uploader(self.client_id, self._build, self._send, spool,
                                      upload_rows, upload_interval_s, self._tick)  # fmt: skip

    # --- RLlib's verbs --------------------------------------------------------------------

    def start_episode(
        self,
        episode_id: str | None = None,
        training_enabled: bool = True,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """Open an episode; ``seed`` and reset ``options`` are recorded so it can be replayed."""
        episode_id = episode_id or secrets.token_hex(8)  # named here, so a retry is idempotent
        if self._uploader is None:
            body = {
                "episode_id": episode_id,
                "training_enabled": training_enabled,
                "seed": seed,
                "options": jsonable(options),
                "client_id": self.client_id,
            }
            self._http.call("POST", "/v1/episodes", json=body)  # fmt: skip
            self._remote[episode_id] = RemoteEpisode()
            return episode_id
        self._check_uploads()
        self._local[episode_id] = Episode(
            episode_id, self.client_id, training_enabled, seed,
            None if options is None else json.dumps(jsonable(options)), self._space()[2],
        )  # fmt: skip
        return episode_id

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """The action for ``observation`` (a dict keyed by agent id for multi-agent envs)."""
        if self._uploader is None:
            answer = self._remote_step(episode_id, "actions", observation, {})
            return self._decode(answer)
        return self._local_step(episode_id, observation, None)

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an action the simulator chose itself (off-policy data)."""
        if self._uploader is None:
            multi = self._multiagent(observation)
            self._remote_step(episode_id, "logged-actions", observation,
                              {"actions" if multi else "action": jsonable(action)})  # fmt: skip
            return
        self._local_step(episode_id, observation, action)

    def log_returns(
        self,
        episode_id: str,
        reward: float | Mapping[str, float],
        info: Any = None,
        multiagent_done_dict: Mapping[str, bool] | None = None,
    ) -> None:
        """Add rewards to the current step (they sum until the next action; none means 0.0)."""
        rewards = dict(reward) if isinstance(reward, Mapping) else {_AGENT: reward}
        _check_rewards(rewards, info)
        infos = dict(info) if isinstance(reward, Mapping) and isinstance(info, Mapping) else (
            {} if info is None else {_AGENT: info})  # fmt: skip
        dones = {k: bool(v) for k, v in (multiagent_done_dict or {}).items() if k != "__all__"}
        if self._uploader is None:
            self._remote_episode(episode_id).add(rewards, infos, dones)
            return
        self._local_episode(episode_id).add_rewards(
            {k: float(v) for k, v in rewards.items()}, infos, dones
        )

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """End the episode at its last observation (``truncated=True`` for a time limit)."""
        if self._uploader is None:
            self._remote_step(episode_id, "end", observation, {"truncated": truncated})
            del self._remote[episode_id]
            return
        episode = self._local_episode(episode_id)
        observations = self._observations(observation)
        self._observation_batch(list(observations.values()))  # refuse a bad one at the call
        terminated = {agent_id: not truncated for agent_id in observations}
        rows = episode.complete(observations, {}, {}, terminated, truncated=truncated)
        seen = {row["agent_id"] for row in rows}
        rows += [r for r in episode.close_rows({}, truncated=True) if r["agent_id"] not in seen]
        episode.commit(rows, {})
        del self._local[episode_id]
        self._uploader.add("steps", rows)
        self._uploader.add("episodes", episode.summary_rows("truncated" if truncated
                                                            else "terminated"))  # fmt: skip

    def update_policy_weights(self) -> None:
        """Pull the newest weights now (local mode); 304 when they have not changed."""
        if self.inference_mode != "local":
            return
        version = self._policy.version if self._policy is not None else None
        params = {"version": version} if version is not None else {}
        try:
            response = self._http.call("GET", "/v1/weights", params=params)
        except EpisodeError as error:  # 404: nothing published yet, keep acting at random
            if error.status == 404:
                return
            raise
        self._pulled = time.monotonic()
        if response.status_code == 304:
            return
        new = int(response.headers["X-Rlpipe-Policy-Version"])
        path = self._weights_dir / f"policy-{new:08d}.npz"
        path.write_bytes(response.content)
        self._policy = NumpyPolicy(load_checkpoint(path))
        path.unlink()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Deliver every buffered and spooled step now; True when the server has them all."""
        self._check_uploads()
        return self._uploader.flush(timeout_s) if self._uploader is not None else True

    def close(self, timeout_s: float = 30.0) -> bool:
        """Deliver what can be delivered, then stop; undelivered batches stay in the spool."""
        if self._uploader is None:
            self._http.close()
            return True
        delivered = self._uploader.close(timeout_s)
        shutil.rmtree(self._weights_dir, ignore_errors=True)
        self._http.close()
        return delivered

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- remote inference ------------------------------------------------------------------

    def _remote_episode(self, episode_id: str) -> RemoteEpisode:
        try:
            return self._remote[episode_id]
        except KeyError:
            raise EpisodeError(404, f"episode '{episode_id}' was not started by this client; "
                                    "call start_episode() first") from None  # fmt: skip

    def _remote_step(self, episode_id: str, verb: str, observation: Any,
                     extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        state = self._remote_episode(episode_id)
        body = {**state.body(self._multiagent(observation), jsonable(observation)), **extra}
        response = self._http.call("POST", f"/v1/episodes/{episode_id}/{verb}", json=body)
        state.sent()
        answer: dict[str, Any] = response.json()
        return answer

    def _decode(self, answer: dict[str, Any]) -> Any:
        if "actions" in answer:
            return {k: self._decode_one(v) for k, v in answer["actions"].items()}
        return self._decode_one(answer["action"])

    def _decode_one(self, value: Any) -> Any:
        if isinstance(value, list):
            action_space = self._space()[1]
            if isinstance(action_space, gym.spaces.Box):
                return np.asarray(value, dtype=action_space.dtype)
        return value

    # --- local inference -------------------------------------------------------------------

    def _local_episode(self, episode_id: str) -> Episode:
        self._check_uploads()
        try:
            return self._local[episode_id]
        except KeyError:
            raise EpisodeError(404, f"episode '{episode_id}' is not open in this client; call "
                                    "start_episode() first") from None  # fmt: skip

    def _local_step(self, episode_id: str, observation: Any, action: Any) -> Any:
        episode = self._local_episode(episode_id)
        observations = self._observations(observation)
        keyed = isinstance(observation, Mapping) and self._multiagent(observation)
        batch = self._observation_batch(list(observations.values()))
        acting = [a for a in observations if not episode.agent(a).terminated]
        if action is None:
            if len(acting) < len(observations):
                keep = [list(observations).index(a) for a in acting]
                batch = batch[keep] if isinstance(batch, np.ndarray) else batch.take(keep)
            chosen = self._act(batch)
            pending = {a: Pending(observations[a], *chosen[i]) for i, a in enumerate(acting)}
        else:
            given = action if keyed else {_AGENT: action}
            codec.to_arrow_rows(self._space()[1], [given[a] for a in acting], field="action")
            pending = {a: Pending(observations[a], given[a], None, None) for a in acting}
        rows = episode.complete(observations, {}, {}, {})
        episode.commit(rows, pending)
        if rows and self._uploader is not None:
            self._uploader.add("steps", rows)
        if action is not None:
            return None
        out = {a: p.action for a, p in pending.items()}
        return out if keyed else out.get(_AGENT)

    def _observation_batch(self, values: list[Any]) -> np.ndarray | pa.Array:
        """The observations checked against the space: a numpy batch for a float Box (the
        common case, checked in a few microseconds), else an Arrow column.

        Raises:
            SchemaError: as the server would answer 400, naming the field.
        """
        space = self._space()[0]
        batch = codec.float_box_rows(space, values)
        if batch is not None:
            return batch
        return codec.to_arrow_rows(space, values, field="observation")

    def _act(self, batch: np.ndarray | pa.Array) -> list[tuple[Any, float | None, int | None]]:
        n = len(batch)
        observation_space = self._space()[0]
        policy = self._policy
        if policy is None:
            return [(self._random_action(), None, None) for _ in range(n)]
        if isinstance(batch, pa.Array):
            batch = codec.from_arrow(observation_space, batch)
        actions, logp = policy.act(batch, self._rng)
        return [(row_of(actions, i), float(logp[i]), policy.version) for i in range(n)]

    def _random_action(self) -> Any:
        """Uniform actions, drawn a thousand at a time (a draw per step costs more than a step)."""
        if not self._random:
            batch = codec.sample_batch(self._space()[1], 1000, int(self._rng.integers(2**63)))
            self._random = [row_of(batch, i) for i in range(1000)]
        return self._random.pop()

    def _observations(self, observation: Any) -> dict[str, Any]:
        return dict(observation) if self._multiagent(observation) else {_AGENT: observation}

    def _build(self, table: str, rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
        columns = schema.rows_to_columns(rows)
        if table == layout.EPISODES:
            return schema.episodes_from_columns(columns)
        observation_space, action_space, _ = self._space()
        return schema.steps_from_columns(
            schema.step_schema(observation_space, action_space), columns,
            observation_space, action_space,
        )  # fmt: skip

    def _send(self, client_id: str, seq: int, table: str, body: bytes) -> float | None:
        headers = {"Content-Type": ARROW_TYPE, "X-Rlpipe-Client": client_id,
                   "X-Rlpipe-Upload": str(seq), "X-Rlpipe-Table": table}  # fmt: skip
        try:
            self._http.call("POST", "/v1/uploads", patience_s=0, data=body, headers=headers)
        except ServerUnavailable as error:
            return error.retry_after
        return None

    def _tick(self) -> None:
        if self.update_interval is None or time.monotonic() - self._pulled < self.update_interval:
            return
        try:
            self.update_policy_weights()
        except ServerUnavailable:
            self._pulled = time.monotonic()  # try again an interval later

    def _check_uploads(self) -> None:
        if self._uploader is not None and self._uploader.failure is not None:
            raise self._uploader.failure

    # --- spaces ----------------------------------------------------------------------------

    def _space(self) -> tuple[gym.Space[Any], gym.Space[Any], str | None]:
        if self._spaces is None:
            self._spaces = parse_spaces(self._http.call("GET", "/v1/spaces").json())
        return self._spaces

    def _load_spaces(self, cache: Path) -> None:
        """Spaces from the server, else from the spool's copy (a client may start offline)."""
        try:
            doc = self._http.call("GET", "/v1/spaces").json()
            cache.write_text(json.dumps(doc))
        except ServerUnavailable:
            if not cache.exists():
                raise
            doc = json.loads(cache.read_text())
        self._spaces = parse_spaces(doc)

    def _multiagent(self, observation: Any) -> bool:
        """A dict is per-agent unless the observation space itself is a Dict with its keys."""
        if not isinstance(observation, Mapping):
            return False
        space = self._space()[0]
        return not (isinstance(space, gym.spaces.Dict) and set(observation) == set(space.keys()))

    def _try_pull(self) -> None:
        with contextlib.suppress(ServerUnavailable):
            self.update_policy_weights()


_AGENT = layout.DEFAULT_AGENT_ID


def _check_rewards(rewards: Mapping[str, Any], info: Any) -> None:
    """Refuse at the call what the server would refuse later, when the step is long gone."""
    for agent_id, reward in rewards.items():
        if isinstance(reward, bool) or not isinstance(reward, int | float | np.number) or (
            not np.isfinite(reward)
        ):  # fmt: skip
            name = "reward" if agent_id == _AGENT else f"reward.{agent_id}"
            raise SchemaError.single(name, "a finite number", repr(reward))
    if info is None:
        return
    try:
        json.dumps(jsonable(info), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise SchemaError.single("info", "JSON-serializable data", str(error)) from None


__all__ = [
    "EpisodeError",
    "PolicyClient",
    "RequestRejected",
    "ServerError",
    "ServerUnavailable",
    "Unauthorized",
    "base_url",
]
